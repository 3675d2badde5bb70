"""Cache keys, file writing and tool/arch selection (no nvcc needed)."""

import pytest

from attnc.runtime.build import cache, toolchain


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path))
    assert cache.cache_dir() == tmp_path
    monkeypatch.delenv("ATTNC_CACHE_DIR")
    assert cache.cache_dir().parts[-2:] == (".cache", "attnc")


def test_cache_key_depends_on_every_input():
    base = ("softcap_bf16_d128", "src", ["-O3"], "80", "h")
    key = cache.cache_key(*base)
    assert key.startswith("softcap_bf16_d128_") and len(key) == len("softcap_bf16_d128_") + 16
    assert cache.cache_key(*base) == key
    for i, changed in [(1, "src2"), (2, ["-O2"]), (3, "90a"), (4, "h2")]:
        args = list(base)
        args[i] = changed
        assert cache.cache_key(*args) != key


def test_two_lists_of_flags_never_share_a_key():
    """Flags were joined with U+001F: ['-DX=1', '-DY=2'] and ['-DX=1\x1f-DY=2'] (a flag
    from an environment variable holding that character) had one key."""
    base = ("m", "src", ["-DX=1", "-DY=2"], "80", "h")
    joined = ("m", "src", ["-DX=1\x1f-DY=2"], "80", "h")
    assert cache.cache_key(*base) != cache.cache_key(*joined)


def test_safe_name():
    assert cache.safe_name("a b/c-d") == "a_b_c_d"
    assert cache.safe_name("") == "module"


def test_header_digest_tracks_contents(tmp_path):
    (tmp_path / "a.cuh").write_text("x")
    first = cache.header_digest(tmp_path)
    (tmp_path / "a.cuh").write_text("y")
    assert cache.header_digest(tmp_path) != first
    assert len(cache.header_digest()) == 64


def test_write_if_changed(tmp_path):
    path = tmp_path / "f.txt"
    assert cache.write_if_changed(path, "abc") is True
    mtime = path.stat().st_mtime_ns
    assert cache.write_if_changed(path, "abc") is False
    assert path.stat().st_mtime_ns == mtime
    assert cache.write_if_changed(path, "abd") is True
    assert path.read_text() == "abd"


def test_file_locks_reentrant_over_distinct_paths(tmp_path):
    with cache.file_locks([tmp_path / "b.lock", tmp_path / "a.lock", tmp_path / "a.lock"]):
        assert (tmp_path / "a.lock").exists() and (tmp_path / "b.lock").exists()


@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        ((9, 0), "90a"),
        ((8, 0), "80"),
        ((8, 6), "86"),
        ("sm_80", "80"),
        ("90", "90a"),
        ("sm_90a", "90a"),
        (89, "89"),
        ("8.9", "89"),
        ((12, 0), "120"),
        ("10.0", "100"),
        ("sm_100a", "100a"),
    ],
)
def test_normalize_arch(arch, expected):
    assert toolchain.normalize_arch(arch) == expected


@pytest.mark.parametrize("arch", ["75", (7, 5), 70, "7.5", "sm_86;", "1000", "abc", "", "9.x"])
def test_normalize_arch_refuses_what_attnc_cannot_build_for(arch):
    with pytest.raises(toolchain.UnsupportedArch, match="sm_80 and newer"):
        toolchain.normalize_arch(arch)


def test_a_device_older_than_sm80_is_named(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    with pytest.raises(toolchain.UnsupportedArch, match="compute capability 7.5"):
        toolchain.current_arch()


def test_nvcc_flags():
    flags = toolchain.nvcc_flags("90a", ("/inc",))
    assert flags == [
        "-std=c++17",
        "-O3",
        "-shared",
        "-Xcompiler",
        "-fPIC",
        "-Xcompiler=-fvisibility=hidden",
        "-Xcompiler=-fno-gnu-unique",
        "--expt-relaxed-constexpr",
        "-lineinfo",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-I/inc",
    ]


def test_nvcc_env_override(monkeypatch):
    monkeypatch.setenv("ATTNC_NVCC", "/opt/my/nvcc")
    assert toolchain.find_nvcc() == "/opt/my/nvcc"


def test_speed_flags_follow_the_nvcc_version(monkeypatch, tmp_path):
    fake = tmp_path / "nvcc"
    for release, want in (("12.4", ("-split-compile=0",)), ("13.0", ("-split-compile=0",)),
                          ("12.1", ()), ("11.8", ())):  # fmt: skip
        fake.write_text(
            f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n"
        )
        fake.chmod(0o755)
        toolchain.nvcc_version.cache_clear()
        assert toolchain.speed_flags(str(fake)) == want, release
    toolchain.nvcc_version.cache_clear()
    assert toolchain.speed_flags(str(tmp_path / "missing")) == ()


@pytest.mark.parametrize("below", ["", "sub"])
def test_a_cache_root_that_is_a_file_is_named(tmp_path, monkeypatch, below):
    root = tmp_path / "afile"
    root.write_text("")
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(root / below) if below else str(root))
    with pytest.raises(NotADirectoryError) as err:
        with cache.file_lock(cache.cache_dir() / "m_0" / "m.lock"):
            pass
    assert "part of its path is a file" in str(err.value) and "ATTNC_CACHE_DIR" in str(err.value)
