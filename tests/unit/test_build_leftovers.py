"""Build defects left after the hardening rounds: decode modules built for the workspace's GPU,
a module built by another nvcc rebuilt, control characters in ``ATTNC_NVCC`` named, and a
``built.ok`` that is not a file taken as a damaged entry. nvcc is a fake here (no CUDA)."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pytest
from fake_nvcc import installed

from attnc.runtime.build import cache, jit, toolchain


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    """The fake nvcc (tests/unit/fake_nvcc.py), release ``$FAKE_NVCC_RELEASE`` (default 12.8);
    returns a function giving the number of builds."""
    with installed(tmp_path, monkeypatch) as nvcc:
        yield nvcc.count


def _build(source: str = "int x;\n") -> Path:
    return jit.build_module("probe", source, arch="80")


# 1. Decode modules for the workspace's GPU


def test_a_decode_module_is_built_for_the_workspace_gpu(monkeypatch):
    """GPU 0 (current) an sm_80 part, GPU 1 a Hopper: a wrapper on GPU 1 builds for 90a."""
    import torch

    from attnc.runtime.build import modules
    from attnc.runtime.wrappers.decode_planning import DecodePlanning

    built: list[tuple[str, str | None]] = []
    capability = {0: (8, 0), 1: (9, 0)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_capability",
        lambda device=None: capability[0 if device is None else getattr(device, "index", device)],
    )
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(modules.DECODE_MODULES, "_by_key", {})

    def build(specs, *, arch=None, **kwargs):
        built.extend((s.name, arch) for s in specs)
        return [Path(f"/nowhere/{s.name}_{arch}.so") for s in specs]

    class Loaded:
        def shape(self, head_dim, rows_needed):
            return 1, 64, 2

    monkeypatch.setattr(jit, "build_modules", build)
    monkeypatch.setattr(modules.ModuleRegistry, "load", lambda self, path, ir, name: Loaded())
    monkeypatch.setattr(
        modules.ModuleRegistry, "spec",
        lambda self, ir, dtype, head_dim, arch: jit.ModuleSpec(f"{self.kind}{self._infix}", ""),
    )  # fmt: skip

    class Planning:
        _modules: dict[object, object] = {}
        _device = torch.device("cuda", 1)
        variant = type("Variant", (), {"ir": object()})()

    module, rows, kv_tile, per_sm = DecodePlanning._module_for(Planning(), torch.bfloat16, 128, 1)
    assert built == [("decode_decode", "90a")]
    assert (rows, kv_tile, per_sm) == (1, 64, 2)


# 2. The nvcc that built a module


def _record(library: Path) -> dict[str, object]:
    return json.loads((library.parent / "built.ok").read_text())


def test_a_module_built_by_another_nvcc_is_rebuilt(fake_nvcc, monkeypatch, capfd):
    library = _build()
    assert "release 12.8, V12.8.93" in str(_record(library)["nvcc"])
    monkeypatch.setenv("FAKE_NVCC_RELEASE", "12.9")  # nvcc upgraded (a new process)
    toolchain.nvcc_version.cache_clear()
    assert _build() == library and fake_nvcc() == 2
    assert "release 12.9, V12.9.93" in str(_record(library)["nvcc"])
    assert "12.8" in capfd.readouterr().err  # the rebuild notice names both
    assert _build() == library and fake_nvcc() == 2  # and only once


def test_a_module_built_by_another_nvcc_loads_where_no_nvcc_is_installed(fake_nvcc, monkeypatch):
    library = _build()

    def no_nvcc() -> str:
        raise toolchain.ToolNotFound("attnc: nvcc not found")

    monkeypatch.setattr(toolchain, "find_nvcc", no_nvcc)
    toolchain.nvcc_version.cache_clear()
    assert _build() == library and fake_nvcc() == 1


def test_the_nvcc_version_is_read_once_per_process(fake_nvcc, monkeypatch):
    runs = []
    real = toolchain.subprocess.run
    monkeypatch.setattr(
        toolchain.subprocess, "run", lambda *a, **k: runs.append(a[0]) or real(*a, **k)
    )
    _build()
    _build("int y;\n")
    jit.build_modules([jit.ModuleSpec("other", "int z;\n")], arch="80")
    assert [r for r in runs if "--version" in r] == [[toolchain.find_nvcc(), "--version"]]


# 3. Control characters in ATTNC_NVCC


@pytest.mark.parametrize("odd", ["new\nline", "carriage\rreturn", "esc\x1b[2J"])
def test_a_control_character_in_the_nvcc_path_is_named(fake_nvcc, tmp_path, monkeypatch, odd):
    there = tmp_path / odd
    shutil.copytree(tmp_path / "bin", there)
    monkeypatch.setenv("ATTNC_NVCC", str(there / "nvcc"))
    with pytest.raises(toolchain.ToolNotFound) as err:
        _build()
    text = str(err.value)
    escaped = odd.encode("unicode_escape").decode()
    assert "ATTNC_NVCC" in text and escaped in text and "control character" in text
    assert odd not in text and fake_nvcc() == 0


def test_a_module_in_the_cache_loads_under_an_nvcc_path_with_a_newline(
    fake_nvcc, tmp_path, monkeypatch
):
    library = _build()
    monkeypatch.setenv("ATTNC_NVCC", str(tmp_path / "new\nline" / "nvcc"))
    toolchain.nvcc_version.cache_clear()
    assert _build() == library and fake_nvcc() == 1


# 4. A built.ok that is not a file


def _stamp_to_directory(library: Path) -> Path:
    stamp = library.parent / "built.ok"
    stamp.unlink()
    (stamp / "inside").mkdir(parents=True)
    return stamp


def test_a_build_record_that_is_a_directory_is_rebuilt(fake_nvcc, capfd):
    library = _build()
    stamp = _stamp_to_directory(library)
    assert _build() == library and fake_nvcc() == 2
    assert stamp.is_file() and _record(library)["key"] == library.parent.name
    assert "build record" in capfd.readouterr().err  # the same notice as a damaged record


def test_a_library_whose_build_record_is_a_directory_is_not_loaded(fake_nvcc):
    library = _build()
    _stamp_to_directory(library)
    with pytest.raises(jit.BuildError) as err:
        jit.load_library(library)
    assert "build record" in str(err.value)


def test_a_build_record_that_cannot_be_removed_is_named(fake_nvcc, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "c\x1b[2Jd"))
    library = _build()
    _stamp_to_directory(library)

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(cache.shutil, "rmtree", refuse, raising=False)
    with pytest.raises(PermissionError) as err:
        _build()
    text = str(err.value)
    assert "built.ok" in text and "c\\x1b[2Jd" in text and "\x1b" not in text
    assert "ATTNC_CACHE_DIR" in text and "Permission denied" in text


@pytest.mark.parametrize("entry", ["library", "partial", "source", "build.ninja"])
def test_a_directory_in_place_of_a_module_file_is_rebuilt(fake_nvcc, entry):
    """A directory where the cache keeps a file (the library, its partial file, the source or
    the ninja file) failed the build with IsADirectoryError from os.replace, and the decode
    planner kept that failure for the process."""
    library = _build()
    module = library.parent
    named = {
        "library": library,
        "partial": library.with_name(library.name + ".partial"),
        "source": next(module.glob("*.cu")),
        "build.ninja": module / "build.ninja",
    }
    target = named[entry]
    library.unlink()
    if target.exists():
        target.unlink()
    (target / "inside").mkdir(parents=True)
    assert _build() == library and fake_nvcc() == 2
    assert library.is_file() and (entry == "partial" or target.is_file())


def test_merge_state_is_built_for_the_arch_of_its_tensors_gpu(monkeypatch):
    """merge_state's module is kept per GPU arch: a host with an sm_80 and an sm_90 GPU used
    the first one built (for the current device) for both."""
    from attnc.runtime.build import jit
    from attnc.runtime.wrappers import merge

    built = []

    class FakeLib:
        class attnc_merge_state:  # noqa: N801 (the C symbol's name)
            argtypes: list = []
            restype = None

    def build(name, source, *, arch=None, extra_flags=()):
        built.append(arch)
        return f"/fake/{arch}.so"

    monkeypatch.setattr(merge, "_LIBS", {})
    monkeypatch.setattr(jit, "build_module", build)
    monkeypatch.setattr(jit, "load_library", lambda path: FakeLib())
    merge._library("80")
    merge._library("90a")
    merge._library("80")
    assert built == ["80", "90a"]


@pytest.mark.parametrize("mode", ["fifo", "directory"])
def test_nvcc_output_that_is_not_a_file_fails_the_build(fake_nvcc, monkeypatch, mode):
    """A pipe left as nvcc's output hung the build in open() (Ctrl-C could not end it: the
    pool waited for the blocked thread); a directory escaped as a bare 'Is a directory'."""
    monkeypatch.setenv("FAKE_NVCC_MODE", mode)
    with pytest.raises(jit.BuildError, match="nvcc exited 0 but its output is cannot read it"):
        _build()
    assert not list(cache.cache_dir().rglob("*.partial"))
    monkeypatch.setenv("FAKE_NVCC_MODE", "ok")
    assert _build().is_file()


def test_stopping_a_build_kills_what_nvcc_started(tmp_path):
    """Ctrl-C killed nvcc alone; its children (cicc, ptxas) kept the output pipe open, and
    the build waited for them (27 s with a child that sleeps 30 s) before it exited. nvcc
    stays in the caller's process group (a session of its own kept the terminal's signals
    from it, and it outlived a killed build)."""
    import os
    import time

    from attnc.runtime.build import nvcc_run

    script = tmp_path / "nvcc"
    script.write_text("#!/bin/sh\nsleep 30 &\nsleep 30\n")
    os.chmod(script, 0o755)
    running = nvcc_run.Running()
    proc = running.start([str(script)], tmp_path, None)
    assert proc is not None
    assert os.getpgid(proc.pid) == os.getpgid(0)  # a signal to the caller's group reaches it
    time.sleep(0.3)  # the child is started
    began = time.monotonic()
    running.stop()
    proc.communicate(timeout=10)
    assert time.monotonic() - began < 5
    assert running.start([str(script)], tmp_path, None) is None  # no more after stop()
