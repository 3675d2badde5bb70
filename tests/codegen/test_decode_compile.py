"""Decode modules of stdlib variants compile for sm_80 and sm_90a without register spills."""

import re
import shutil
import subprocess

import pytest

import attnc
from attnc.codegen.decode_module import render_decode_module
from attnc.runtime.build import cache, toolchain

pytestmark = pytest.mark.nvcc


def _nvcc():
    try:
        nvcc = toolchain.find_nvcc()
    except toolchain.ToolNotFound:
        return None
    return nvcc if shutil.which(nvcc) else None


if _nvcc() is None:
    pytest.skip("nvcc not found", allow_module_level=True)


@pytest.mark.parametrize("arch", ["80", "90a"])
def test_decode_modules_compile_without_spills(tmp_path, arch):
    cases = [("softcap", "bfloat16", 128), ("sigmoid", "float16", 64)]
    for name, dtype, head_dim in cases:
        ir = attnc.load(f"stdlib:{name}").ir
        source = tmp_path / f"{name}_{arch}.cu"
        source.write_text(render_decode_module(ir, dtype, head_dim))
        flags = toolchain.nvcc_flags(arch, (str(cache.INCLUDE_DIR),), ("-Xptxas", "-v"))
        cmd = [_nvcc(), *flags, "-o", str(tmp_path / f"{name}_{arch}.so"), str(source)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        log = proc.stderr
        # Three kernels per module: decode with 16 and 32 rows, and the merge kernel.
        entries = re.findall(r"Compiling entry function '(\w+)'", log)
        assert sum("decode_kernel" in e for e in entries) == 2, entries
        assert sum("decode_merge_kernel" in e for e in entries) == 1, entries
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
        stacks = re.findall(r"(\d+) bytes stack frame", log)
        assert spills and all(s == ("0", "0") for s in spills), log
        assert stacks and all(s == "0" for s in stacks), log


def test_render_decode_module_checks_arguments():
    ir = attnc.load("stdlib:vanilla").ir
    text = render_decode_module(ir, "bfloat16", 128)
    assert '#include "attnc/decode_launcher.cuh"' in text
    assert "ATTNC_DEFINE_DECODE_MODULE(Variant_vanilla, __nv_bfloat16, 128)" in text
    with pytest.raises(ValueError, match="head_dim must be one of"):
        render_decode_module(ir, "bfloat16", 96)
    with pytest.raises(ValueError, match="dtype must be one of"):
        render_decode_module(ir, "float32", 128)
