"""Generated prefill and decode modules build with nvcc, load with ctypes (no GPU needed for
the host entry points) and answer their shape queries."""

import shutil

import pytest

import attnc
from attnc.runtime.build.modules import get_decode_module, get_prefill_module

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc"),
]


@pytest.fixture()
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_prefill_module_builds_and_plans_tiles(cache_dir):
    v = attnc.load("stdlib:softcap")
    module = get_prefill_module(v.ir, "bfloat16", 128, arch="80")
    assert module.name == "softcap_bf16_d128"
    # 128 packed rows hold 32 tokens of a GQA-4 group; a 1-token request fits a 16-row tile.
    assert module.tile_q_tokens(128, 4, 8192) == 32
    assert module.tile_q_tokens(128, 4, 1) == 4
    assert module.tile_q_tokens(64, 4, 1) == 0  # another head_dim: not this module's
    assert get_prefill_module(v.ir, "bfloat16", 128, arch="80") is module


def test_decode_module_builds(cache_dir):
    v = attnc.load("stdlib:alibi")
    module = get_decode_module(v.ir, "float16", 64, arch="80")
    assert module.name == "alibi_decode_fp16_d64"
    assert module.params_type._fields_[0][0] == "p_slopes"


def _dynamic_symbols(path) -> list[tuple[str, str]]:
    """(type letter, name) of every defined dynamic symbol of a shared library (nm -D)."""
    import subprocess

    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return [(f[1], f[2]) for f in (line.split() for line in out.splitlines()) if len(f) == 3]


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm")
def test_modules_export_only_their_entry_points(cache_dir):
    """A module exports its extern "C" entry points and nothing else: no template instantiation
    and no function-local static (STB_GNU_UNIQUE, 'u') that the dynamic linker would share
    with another module of a variant of the same name. A shared `static` once made the second
    Hopper module of a variant skip its shared-memory opt-in and fail every launch."""
    from attnc.runtime.build.modules import get_prefill_sm90_module

    v = attnc.load("stdlib:causal")
    libs = [
        get_prefill_module(v.ir, "bfloat16", 64, arch="90a"),
        get_prefill_sm90_module(v.ir, "bfloat16", 64, arch="90a"),
        get_decode_module(v.ir, "bfloat16", 64, arch="90a"),
    ]
    for module in libs:
        symbols = _dynamic_symbols(module.module_id)
        assert symbols, module.module_id
        strays = [(t, n) for t, n in symbols if not n.startswith("attnc_")]
        assert not strays, (module.name, strays[:5])
