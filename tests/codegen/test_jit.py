"""JIT build + cache: nvcc without a shell, ctypes loading, cache hits, rebuilds, errors."""

import ctypes
import shutil
import time

import pytest

from attnc.runtime.build import jit, toolchain

pytestmark = pytest.mark.nvcc

ARCH = "80"

ADD_SOURCE = """
extern "C" __attribute__((visibility("default"))) int attnc_test_add(int a, int b) { return a + b + OFFSET; }
"""


def _have_nvcc() -> bool:
    try:
        nvcc = toolchain.find_nvcc()
    except toolchain.ToolNotFound:
        return False
    return shutil.which(nvcc) is not None


if not _have_nvcc():
    pytest.skip("nvcc not found", allow_module_level=True)


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTNC_VERBOSE", raising=False)


def _source(offset: int) -> str:
    return f"#define OFFSET {offset}\n" + ADD_SOURCE


def _call_add(path, a, b):
    fn = jit.load_library(path).attnc_test_add
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn(a, b)


def test_build_and_call_through_ctypes(tmp_path):
    path = jit.build_module("adder", _source(100), arch=ARCH)
    assert path.name == "adder.so"
    assert path.parent.parent == tmp_path / "cache"
    assert path.parent.name.startswith("adder_")
    assert (path.parent / "adder.cu").read_text() == _source(100)
    assert "rule nvcc" in (path.parent / "build.ninja").read_text()
    assert _call_add(path, 2, 3) == 105
    assert jit.load_library(path) is jit.load_library(str(path))


def test_cache_hit_does_not_rebuild(capfd):
    path = jit.build_module("adder", _source(1), arch=ARCH)
    mtimes = {p.name: p.stat().st_mtime_ns for p in path.parent.iterdir()}
    start = time.perf_counter()
    again = jit.build_module("adder", _source(1), arch=ARCH)
    elapsed = time.perf_counter() - start
    assert again == path
    assert elapsed < 0.1
    assert {p.name: p.stat().st_mtime_ns for p in path.parent.iterdir()} == mtimes


def test_content_change_rebuilds():
    first = jit.build_module("adder", _source(1), arch=ARCH)
    second = jit.build_module("adder", _source(2), arch=ARCH)
    assert first != second
    assert _call_add(first, 0, 0) == 1
    assert _call_add(second, 0, 0) == 2


def test_other_arch_is_another_key():
    a = jit.build_module("adder", _source(1), arch="80")
    b = jit.build_module("adder", _source(1), arch="sm_86")
    assert a != b


def test_compile_error_names_file_and_command():
    bad = 'extern "C" int broken(int a) { return a + undeclared_name; }\n'
    with pytest.raises(jit.BuildError) as e:
        jit.build_module("broken", bad, arch=ARCH)
    text = str(e.value)
    directory = next(p for p in (jit.cache.cache_dir()).iterdir() if p.is_dir())
    source = directory / "broken.cu"
    assert f"generated file: {source}" in text
    assert "command: " in text
    command_line = text.split("command: ", 1)[1].splitlines()[0]
    assert command_line.split()[0] == toolchain.find_nvcc()
    assert f"-o {directory / 'broken.so.partial'} {source}" in command_line
    assert "-gencode=arch=compute_80,code=sm_80" in command_line
    assert "undeclared_name" in text
    assert not (directory / "built.ok").exists()
    assert not (directory / "broken.so").exists()
    assert not (directory / "broken.so.partial").exists()


def test_failed_build_is_retried_after_fix():
    with pytest.raises(jit.BuildError):
        jit.build_module("adder", "this is not C++\n", arch=ARCH)
    assert _call_add(jit.build_module("adder", _source(7), arch=ARCH), 1, 1) == 9


def test_parallel_build_of_two_modules():
    specs = [jit.ModuleSpec("add_a", _source(10)), jit.ModuleSpec("add_b", _source(20))]
    paths = jit.build_modules(specs, arch=ARCH, jobs=2)
    assert [p.name for p in paths] == ["add_a.so", "add_b.so"]
    assert [_call_add(p, 1, 2) for p in paths] == [13, 23]
    start = time.perf_counter()
    assert jit.build_modules(specs, arch=ARCH) == paths
    assert time.perf_counter() - start < 0.1


def test_parallel_build_error_names_failing_module():
    specs = [jit.ModuleSpec("good", _source(1)), jit.ModuleSpec("bad", "not C++ at all\n")]
    with pytest.raises(jit.BuildError) as e:
        jit.build_modules(specs, arch=ARCH, jobs=2)
    assert "bad.cu" in str(e.value)
    assert "good.cu" not in str(e.value)


def test_verbose_prints_command_and_cache_path(monkeypatch, capfd):
    monkeypatch.setenv("ATTNC_VERBOSE", "1")
    path = jit.build_module("adder", _source(3), arch=ARCH)
    err = capfd.readouterr().err
    assert f"attnc: module adder: {path.parent}" in err
    assert "-gencode=arch=compute_80,code=sm_80" in err
    assert "attnc: building adder (nvcc) ... " in err


def test_a_cache_path_with_control_characters_is_printed_escaped(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "c\x1b[2Jd"))
    monkeypatch.setenv("ATTNC_VERBOSE", "1")
    path = jit.build_module("adder", _source(4), arch=ARCH)
    assert _call_add(path, 1, 1) == 6
    with pytest.raises(jit.BuildError) as e:
        jit.build_module("bad", "not C++ at all\n", arch=ARCH)
    err = capfd.readouterr().err
    assert "c\\x1b[2Jd" in err and "\x1b" not in err
    assert "c\\x1b[2Jd" in str(e.value) and "\x1b" not in str(e.value)


def test_cache_path_a_shell_would_expand(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    monkeypatch.setenv("ATTNC_PWN_MARKER", str(marker))
    root = tmp_path / "c$HOME`touch $ATTNC_PWN_MARKER`d"
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(root))
    path = jit.build_module("adder", _source(5), arch=ARCH)
    assert path.parent.parent == root
    assert _call_add(path, 1, 1) == 7
    assert not marker.exists()


def test_cache_and_headers_under_a_path_with_spaces_and_accents(tmp_path, monkeypatch):
    """nvcc quotes the paths it hands its shell: a space or an accented letter builds in
    place (the kernel headers under such a path refused every build)."""
    root = tmp_path / "Jane Doë" / "cache"
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(root))
    headers = tmp_path / "Jane Doë" / "include dir"
    headers.mkdir(parents=True)
    (headers / "offset.h").write_text("#define OFFSET 40\n")
    source = '#include "offset.h"\n' + ADD_SOURCE
    path = jit.build_module("adder", source, arch=ARCH, extra_flags=("-I", str(headers)))
    assert path.parent.parent == root
    assert _call_add(path, 1, 1) == 42


_LOAD_IN_NEW_PROCESS = """
import ctypes, sys
from attnc.runtime.build import jit
path = jit.build_module("adder", sys.argv[1], arch="80")
fn = jit.load_library(path).attnc_test_add
fn.argtypes = [ctypes.c_int, ctypes.c_int]
print(fn(2, 2))
"""


def test_truncated_library_is_rebuilt_by_the_next_process():
    import subprocess
    import sys

    path = jit.build_module("adder", _source(40), arch=ARCH)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD_IN_NEW_PROCESS, _source(40)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "44"
    assert "attnc: rebuilding" in proc.stderr
    assert path.stat().st_size == len(data)


# A module of two sources: the entry point in the main one calls a hidden function the second
# one defines (how a Hopper module's three-consumer kernel is reached, attnc/codegen/module.py).
SPLIT_MAIN = """
int attnc_test_part(int a);
extern "C" __attribute__((visibility("default"))) int attnc_test_add(int a, int b) {
  return attnc_test_part(a) + b;
}
"""
SPLIT_PART = """
__global__ void attnc_test_part_kernel(int* out) { *out = 1; }
int attnc_test_part(int a) { return a + PART_OFFSET; }
"""


def _split_spec(offset: int, part: str = SPLIT_PART) -> jit.ModuleSpec:
    return jit.ModuleSpec("split", SPLIT_MAIN, parts=(f"#define PART_OFFSET {offset}\n" + part,))


def test_module_of_two_sources_links_into_one_library():
    path = jit.build_modules([_split_spec(40)], arch=ARCH)[0]
    assert _call_add(path, 1, 2) == 43
    names = sorted(p.name for p in path.parent.iterdir())
    assert names == ["build.ninja", "built.ok", "split.cu", "split.part1.cu", "split.so"]
    ninja = (path.parent / "build.ninja").read_text()
    assert ninja.count("\nbuild ") == 3 and " -c " in ninja and "split.part1.o" in ninja
    assert "split.part1.cu" in (path.parent / "built.ok").read_text()  # every command recorded


def test_a_part_is_in_the_cache_key():
    a = jit.build_modules([_split_spec(1)], arch=ARCH)[0]
    b = jit.build_modules([_split_spec(2)], arch=ARCH)[0]
    assert a.parent != b.parent
    assert (_call_add(a, 0, 0), _call_add(b, 0, 0)) == (1, 2)


def test_a_failing_part_names_its_file():
    with pytest.raises(jit.BuildError) as e:
        jit.build_modules([_split_spec(1, "this is not C++\n")], arch=ARCH)
    text = str(e.value)
    assert "split.part1.cu" in text.split("command:")[0]
    assert " -c " in text
    directory = next(p for p in (jit.cache.cache_dir()).iterdir() if p.is_dir())
    assert not any(p.suffix in (".o", ".partial") for p in directory.iterdir())


def test_module_of_two_sources_under_a_path_a_shell_would_expand(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    monkeypatch.setenv("ATTNC_PWN_MARKER", str(marker))
    root = tmp_path / "c$HOME`touch $ATTNC_PWN_MARKER`d"
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(root))
    path = jit.build_modules([_split_spec(9)], arch=ARCH)[0]
    assert path.parent.parent == root
    assert _call_add(path, 1, 1) == 11
    assert not marker.exists()
