"""The build cache against hostile or unlucky input: odd ``ATTNC_CACHE_DIR`` and ``ATTNC_NVCC``
values, cache entries copied from elsewhere, duplicate modules in one build, a failed build
in a temporary directory, and the by-hand ``build.ninja``. nvcc is a fake here (no CUDA)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_nvcc import ELF, installed

from attnc.runtime.build import cache, jit, toolchain

NINJA = shutil.which("ninja") or str(Path(sys.executable).parent / "ninja")


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    """The fake nvcc (tests/unit/fake_nvcc.py): checks its inputs exist, copies an ELF file to
    its ``-o`` output (``$FAKE_NVCC_MODE``: ``always`` fails, ``link`` fails linking objects);
    returns a function giving the command lines it ran."""
    with installed(tmp_path, monkeypatch) as nvcc:
        yield nvcc.argvs


def _build(source: str = "int x;\n") -> Path:
    return jit.build_module("probe", source, arch="80")


def test_a_relative_cache_dir_is_taken_from_the_working_directory(fake_nvcc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNC_CACHE_DIR", "rel/cache")
    assert cache.cache_dir() == tmp_path / "rel" / "cache"
    library = _build()
    assert library.is_absolute() and library.parent.parent == tmp_path / "rel" / "cache"
    assert library.read_bytes() == ELF.read_bytes()


@pytest.mark.parametrize("odd", ["new\nline", "carriage\rreturn", "pipe|bar", "sp ace:$x"])
def test_a_cache_path_ninja_cannot_spell_still_builds_and_rebuilds_by_hand(
    fake_nvcc, tmp_path, monkeypatch, odd
):
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / odd))
    library = _build()
    assert library.read_bytes() == ELF.read_bytes()
    library.unlink()
    proc = subprocess.run(
        [NINJA, "-C", str(library.parent)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert library.read_bytes() == ELF.read_bytes()


def test_a_cache_path_that_is_not_utf8_builds(fake_nvcc, tmp_path, monkeypatch):
    root = os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9")
    monkeypatch.setenv("ATTNC_CACHE_DIR", root)
    library = _build()
    assert os.fsencode(str(library)).startswith(os.fsencode(root))
    assert library.read_bytes() == ELF.read_bytes()


def test_an_nvcc_path_that_is_not_utf8_builds(fake_nvcc, tmp_path, monkeypatch):
    odd = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/bin\xff"))
    shutil.copytree(tmp_path / "bin", odd)
    monkeypatch.setenv("ATTNC_NVCC", str(odd / "nvcc"))
    assert _build().read_bytes() == ELF.read_bytes()


def test_a_cache_dir_of_an_unknown_user_names_the_variable(monkeypatch):
    monkeypatch.setenv("ATTNC_CACHE_DIR", "~no_such_user_\x1b/cache")
    with pytest.raises(ValueError) as err:
        cache.cache_dir()
    text = str(err.value)
    assert "ATTNC_CACHE_DIR" in text and "~no_such_user_\\x1b/cache" in text
    assert "\x1b" not in text


def test_a_relative_nvcc_path_is_taken_from_the_working_directory(fake_nvcc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNC_NVCC", "bin/nvcc")
    assert _build().read_bytes() == ELF.read_bytes()
    assert fake_nvcc()[0][0] == str(tmp_path / "bin" / "nvcc")


def test_an_nvcc_that_is_not_there_names_the_variable(fake_nvcc, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNC_NVCC", str(tmp_path / "no\x1b[2Jnvcc"))
    with pytest.raises(toolchain.ToolNotFound) as err:
        _build()
    text = str(err.value)
    assert "ATTNC_NVCC" in text and "no\\x1b[2Jnvcc" in text and "\x1b" not in text


def test_a_cached_module_loads_where_no_nvcc_is_installed(fake_nvcc, monkeypatch):
    library = _build()

    def no_nvcc() -> str:
        raise toolchain.ToolNotFound("attnc: nvcc not found")

    monkeypatch.setattr(toolchain, "find_nvcc", no_nvcc)
    assert _build() == library
    assert len(fake_nvcc()) == 1


def test_the_same_module_twice_in_one_build_is_compiled_once(fake_nvcc):
    spec = jit.ModuleSpec("twice", "int t;\n")
    first, second = jit.build_modules([spec, spec], arch="80")
    assert first == second and first.read_bytes() == ELF.read_bytes()
    assert len(fake_nvcc()) == 1


@pytest.mark.parametrize(
    "variable, value",
    [("NVCC_APPEND_FLAGS", "-G"), ("NVCC_PREPEND_FLAGS", "-G"), ("NVCC_CCBIN", "clang++")],
)
def test_nvcc_flags_from_the_environment_are_in_the_cache_key(
    fake_nvcc, monkeypatch, variable, value
):
    """nvcc reads each: a debug build, another host compiler (NVCC_CCBIN was left out of
    the key: the module of whichever host compiler built first was loaded for both)."""
    plain = _build()
    monkeypatch.setenv(variable, value)
    debug = _build()
    assert debug != plain and len(fake_nvcc()) == 2
    monkeypatch.delenv(variable)
    assert _build() == plain and len(fake_nvcc()) == 2


def _command_to_repeat(error: jit.BuildError) -> str:
    return str(error).split("command: ", 1)[1].splitlines()[0]


def test_a_failed_build_in_a_temporary_copy_prints_a_command_that_can_be_repeated(
    fake_nvcc, tmp_path, monkeypatch
):
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "c$HOME`x`"))  # built in a copy
    monkeypatch.setenv("FAKE_NVCC_MODE", "always")
    with pytest.raises(jit.BuildError) as err:
        _build()
    command = shlex.split(_command_to_repeat(err.value))
    assert Path(command[-1]).read_text() == "int x;\n"
    assert "temporary copy" in str(err.value)
    monkeypatch.delenv("FAKE_NVCC_MODE")
    subprocess.run(command, check=True, capture_output=True)
    assert Path(command[command.index("-o") + 1]).read_bytes() == ELF.read_bytes()


def test_repeated_failures_of_one_module_keep_one_temporary_copy(fake_nvcc, tmp_path, monkeypatch):
    """Each failed build of a module staged in a copy kept its copy: 50 failures, 50
    directories under the temporary root. A failure now replaces the module's earlier one."""
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "c$HOME`x`"))
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(jit, "staging_root", lambda: str(temporary))
    monkeypatch.setenv("FAKE_NVCC_MODE", "always")
    for _ in range(3):
        with pytest.raises(jit.BuildError):
            _build()
    assert len(list(temporary.glob("attnc-build-*"))) == 1


def test_builds_of_one_module_into_two_caches_keep_their_own_copies(tmp_path, monkeypatch):
    """The copy was named by the module's cache key alone: a build into another cache (its
    own lock) removed the copy nvcc was still building in."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(jit, "staging_root", lambda: str(temporary))
    first = jit._fresh_staging(tmp_path / "cache0$x" / "probe_0123")
    second = jit._fresh_staging(tmp_path / "cache1$x" / "probe_0123")
    assert first.is_dir() and second.is_dir()
    again = jit._fresh_staging(tmp_path / "cache0$x" / "probe_0123")
    assert not first.exists() and again.is_dir() and second.is_dir()


def test_a_failed_link_prints_every_command_to_repeat(fake_nvcc, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_MODE", "link")
    with pytest.raises(jit.BuildError) as err:
        jit.build_modules([jit.ModuleSpec("two", "int a;\n", parts=("int b;\n",))], arch="80")
    command = _command_to_repeat(err.value)
    again = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
    assert "expected a ';'" in again.stdout  # the same failure, not a missing object file
    monkeypatch.delenv("FAKE_NVCC_MODE")
    subprocess.run(["sh", "-c", command], check=True, capture_output=True)


def _entry_of(library: Path) -> tuple[bytes, str]:
    return library.read_bytes(), (library.parent / "built.ok").read_text()


def test_an_entry_copied_from_another_key_is_rebuilt(fake_nvcc):
    other = _build("int other;\n")  # another module: another arch, dtype or head_dim alike
    library = _build()
    data, record = _entry_of(other)
    library.write_bytes(data)
    (library.parent / "built.ok").write_text(record)
    later = library.stat().st_mtime_ns + 10**9
    os.utime(library, ns=(later, later))
    assert _build() == library and len(fake_nvcc()) == 3
    assert library.parent.name in (library.parent / "built.ok").read_text()


def test_a_module_directory_linked_to_another_key_is_rebuilt(fake_nvcc):
    other = _build("int other;\n")
    library = _build()
    shutil.rmtree(library.parent)
    library.parent.symlink_to(other.parent)
    assert _build() == library and len(fake_nvcc()) == 3
    assert _build("int other;\n") == other and len(fake_nvcc()) == 4  # and back


def test_the_holder_of_a_build_lock_is_printed_escaped(tmp_path, monkeypatch, capfd):
    import fcntl

    lock = tmp_path / "m.lock"
    lock.write_text("pid 1 on host \x1b]0;pwned\x07 since then\n")
    monkeypatch.setenv("ATTNC_LOCK_TIMEOUT", "0.1")
    with open(lock, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(cache.LockTimeout) as err:
            with cache.file_locks([lock]):
                pass
    text = str(err.value) + capfd.readouterr().err
    assert "host \\x1b]0;pwned\\x07 since" in text and "\x1b" not in text and "\x07" not in text


def test_a_read_only_cache_names_the_variable(fake_nvcc, monkeypatch):
    import errno

    real_open = os.open

    def read_only(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(cache.os, "open", read_only)
    with pytest.raises(OSError) as err:
        _build()
    text = str(err.value)
    assert "Read-only file system" in text and "ATTNC_CACHE_DIR" in text
    assert str(cache.cache_dir()) in text


class _Capabilities:
    """torch.cuda faked: GPU 0 an sm_80 part, GPU 1 a Hopper; ``current`` is the current one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import torch

        self.current = 0
        self.built: list[tuple[str, str]] = []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", self.capability)

    def capability(self, device: object = None) -> tuple[int, int]:
        index = self.current if device is None else getattr(device, "index", device)
        return (9, 0) if index == 1 else (8, 0)


@pytest.fixture
def two_gpus(monkeypatch):
    """Two GPUs of different archs; module builds and loads faked (recorded by name and arch)."""
    from attnc.runtime.build import modules

    gpus = _Capabilities(monkeypatch)
    for registry in (modules.PREFILL_MODULES, modules.PREFILL_SM90_MODULES):
        monkeypatch.setattr(registry, "_by_key", {})

    def build(specs, *, arch=None, **kwargs):
        gpus.built += [(s.name, arch) for s in specs]
        return [Path(f"/nowhere/{s.name}_{arch}.so") for s in specs]

    class Loaded:
        def __init__(self, path):
            self.path = path

        def tile_q_tokens(self, *args):
            return 128

    monkeypatch.setattr(jit, "build_modules", build)
    monkeypatch.setattr(modules.ModuleRegistry, "load", lambda self, path, ir, name: Loaded(path))
    monkeypatch.setattr(
        modules.ModuleRegistry,
        "spec",
        lambda self, ir, dtype, head_dim, arch: jit.ModuleSpec(f"{self.kind}{self._infix}", ""),
    )
    return gpus


class _IR:
    name = "probe"


def test_a_module_for_the_current_gpu_follows_a_change_of_gpu(two_gpus):
    from attnc.runtime.build import modules

    ir = _IR()
    first = modules.get_prefill_module(ir, "bfloat16", 128)
    two_gpus.current = 1
    second = modules.get_prefill_module(ir, "bfloat16", 128)
    assert two_gpus.built == [("prefill", "80"), ("prefill", "90a")]
    assert first.path != second.path
    two_gpus.current = 0
    assert modules.get_prefill_module(ir, "bfloat16", 128) is first


@pytest.mark.parametrize("backend", ["auto", "fa2"])
def test_a_prefill_module_is_built_for_the_workspace_gpu(two_gpus, backend):
    import torch

    from attnc.runtime.build import backends

    choice = backends.choose_prefill_module(
        _IR(), backend, dtype=torch.bfloat16, head_dim=128, group=1, max_q_len=64,
        kv_layout="ragged", device=torch.device("cuda", 1),
    )  # fmt: skip
    assert two_gpus.built == [(f"prefill{'_sm90' if backend == 'auto' else ''}", "90a")]
    assert choice.backend == ("sm90" if backend == "auto" else "fa2")


def test_a_refused_library_is_named_escaped(fake_nvcc, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "c\x1b[2Jd"))
    library = _build()
    library.write_bytes(b"not a library")
    with pytest.raises(jit.BuildError) as err:
        jit.load_library(library)
    assert "c\\x1b[2Jd" in str(err.value) and "\x1b" not in str(err.value)


def test_a_library_of_another_abi_version_is_named_escaped(tmp_path, monkeypatch):
    from attnc.runtime.build import modules

    class Library:
        def attnc_decode_abi_version(self) -> int:
            return -1

    registry = modules.ModuleRegistry(
        "decode", lambda *a: ("",), lambda *a: None, lambda lib: None,
        "attnc_decode_abi_version", 7,
    )  # fmt: skip
    monkeypatch.setattr(jit, "load_library", lambda path: Library())
    with pytest.raises(RuntimeError) as err:
        registry.load(tmp_path / "c\x1b[2Jd" / "m.so", None, "m")
    text = str(err.value)
    assert "ABI version -1" in text and "c\\x1b[2Jd" in text and "\x1b" not in text


def test_an_interrupted_build_leaves_no_temporary_copy(fake_nvcc, tmp_path, monkeypatch):
    """Ctrl-C reaches nvcc too: its build failed, and the copy kept for the error's command
    stayed in the temporary directory although no error named it."""
    import tempfile

    staging = tmp_path / "tmp"
    staging.mkdir()
    monkeypatch.setenv("TMPDIR", str(staging))
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "c$HOME`x`"))  # built in a copy
    monkeypatch.setenv("FAKE_NVCC_MODE", "always")

    def interrupted(line: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        jit.build_modules(
            [jit.ModuleSpec("probe", "int x;\n", ())], arch="80", progress=interrupted
        )
    assert not list(staging.glob("attnc-build-*"))


def test_kernel_headers_under_a_path_with_a_space_build(fake_nvcc, tmp_path, monkeypatch):
    """attnc installed under "/home/Jane Doë/...": every build was refused ("holds characters
    the shell inside nvcc would expand"), though nvcc quotes the path."""
    headers = tmp_path / "Jane Doë" / "include"
    shutil.copytree(cache.INCLUDE_DIR, headers)
    monkeypatch.setattr(cache, "INCLUDE_DIR", headers)
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "cache"))
    assert _build().read_bytes() == ELF.read_bytes()
