"""Finding nvcc and choosing nvcc flags and the target arch."""

from __future__ import annotations

import functools
import numbers
import os
import re
import shutil
import subprocess
import unicodedata
from pathlib import Path
from typing import NamedTuple

from attnc.dsl.errors import printable

BASE_FLAGS = (
    "-std=c++17",
    "-O3",
    "-shared",
    "-Xcompiler",
    "-fPIC",
    # Every symbol but the extern "C" entry points (marked visibility("default")) stays inside
    # its library: two modules of variants with one name (or one variant's FA2 and Hopper
    # modules) must not share a template's function-local statics, which the dynamic linker
    # otherwise unifies process-wide (STB_GNU_UNIQUE) even for libraries opened RTLD_LOCAL.
    "-Xcompiler=-fvisibility=hidden",
    "-Xcompiler=-fno-gnu-unique",
    "--expt-relaxed-constexpr",
    "-lineinfo",
)


class ToolNotFound(RuntimeError):
    """A build tool (nvcc) could not be found."""


def find_nvcc() -> str:
    """``$ATTNC_NVCC``, else ``$CUDA_HOME/bin/nvcc`` or ``$CUDA_PATH/bin/nvcc``, else ``nvcc``
    on PATH, else ``/usr/local/cuda/bin/nvcc``. A relative
    ``ATTNC_NVCC`` holding a ``/`` is taken from the working directory (nvcc runs in the
    module directory); a bare name is looked up on PATH when run."""
    env = os.environ.get("ATTNC_NVCC")
    if env:
        return str(Path.cwd() / env) if os.sep in env and not os.path.isabs(env) else env
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    found = shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None
    )
    if found is None:
        raise ToolNotFound("attnc: nvcc not found; set ATTNC_NVCC or CUDA_HOME, or put it on PATH")
    return found


def _control_characters(text: str) -> str:
    """The control characters in ``text``, escaped and without repeats ("" for none)."""
    found = dict.fromkeys(c for c in text if unicodedata.category(c) == "Cc")
    return printable("".join(found))


def runnable_nvcc() -> str:
    """:func:`find_nvcc`, checked to be an executable file (a bare name: one on PATH) whose
    path holds no control character (it is written into ``build.ninja``, one command a
    line); :class:`ToolNotFound` naming ``ATTNC_NVCC`` and its value otherwise."""
    nvcc = find_nvcc()
    env = os.environ.get("ATTNC_NVCC")
    where = f"ATTNC_NVCC is '{printable(env)}'" if env else f"found '{printable(nvcc)}'"
    controls = _control_characters(nvcc)
    if controls:
        raise ToolNotFound(
            f"attnc: cannot use nvcc: {where}, whose path holds the control character(s) "
            f"{controls}; use an nvcc path without control characters"
        )
    if shutil.which(nvcc) is None:
        raise ToolNotFound(
            f"attnc: cannot run nvcc: {where}, which is not an executable file (nor a "
            "program on PATH)"
        )
    return nvcc


# nvcc adds the flags the first two hold to every command line, and runs the host compiler
# NVCC_CCBIN names: each changes the binary.
NVCC_FLAG_VARIABLES = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN")


def environment_flags() -> tuple[str, ...]:
    """``NAME=VALUE`` of each of :data:`NVCC_FLAG_VARIABLES` that is set (for cache keys)."""
    return tuple(f"{v}={os.environ[v]}" for v in NVCC_FLAG_VARIABLES if os.environ.get(v))


class UnsupportedArch(ValueError):
    """An arch attnc cannot build for: not a CUDA arch, or one older than sm_80."""


# What a normalised arch looks like: major and minor digits (no dot), an optional suffix letter.
_ARCH = re.compile(r"([0-9]{1,2})([0-9])([af]?)")


def _arch_of_capability(major: int, minor: int) -> str:
    return "90a" if major == 9 else f"{major}{minor}"


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_arch_type(arch: object) -> None:
    """Refuse a float or a bool, alone or in a tuple, as :class:`UnsupportedArch`: ``80.0``
    would otherwise read as "800" and ``8.6`` as "86"."""
    if isinstance(arch, tuple):
        if all(_is_int(part) for part in arch):
            return
        got = "a tuple of " + ", ".join(type(part).__name__ for part in arch)
    elif isinstance(arch, str) or _is_int(arch):
        return
    else:
        got = type(arch).__name__
    raise UnsupportedArch(
        f"arch '{printable(str(arch))}': expected a string, an int or a (major, minor) tuple "
        f"of ints, got {got}"
    )


def _ascii_digits(text: str) -> bool:
    """True for a non-empty run of the digits 0-9 (``str.isdigit`` takes other scripts')."""
    return text.isascii() and text.isdigit()


def normalize_arch(arch: str | int | tuple[int, int]) -> str:
    """``"sm_80"``, ``"80"``, ``80`` or ``(8, 0)`` -> ``"80"``; any 9.x -> ``"90a"``. Raises
    :class:`UnsupportedArch` for anything that is not a CUDA arch of sm_80 or newer (attnc's
    kernels use sm_80 instructions: cp.async, bf16 mma), before nvcc is run."""
    _check_arch_type(arch)
    if isinstance(arch, tuple):
        text = _arch_of_capability(*arch) if len(arch) == 2 else ""
    else:
        text = str(arch).lower().removeprefix("sm_").removeprefix("compute_")
        major_text, dot, minor_text = text.partition(".")
        if text == "90":
            text = "90a"
        elif dot and _ascii_digits(major_text) and _ascii_digits(minor_text):
            text = _arch_of_capability(int(major_text), int(minor_text))
    found = _ARCH.fullmatch(text)
    if found is None or int(found.group(1)) < 8:
        raise UnsupportedArch(
            f"arch '{printable(str(arch))}': attnc builds for CUDA archs sm_80 and newer "
            "(80, 86, 89, 90a, 100, 120, ...)"
        )
    return text


def named_arch(arch: str | int) -> str:
    """:func:`normalize_arch` of an arch a user names for a build ahead of time (``attnc
    build --arch``), which must also be one the runtime looks up for some device: one of
    :data:`NAMED_ARCHS`. A build for ``100a`` would land where no runtime looks (it builds
    ``100`` for a capability 10.0 device), and ``91`` or ``80.0`` are no arch at all."""
    text = normalize_arch(arch)
    if text not in NAMED_ARCHS:
        raise UnsupportedArch(_unnamed_arch(str(arch), text))
    return text


# The archs an ahead-of-time build may name: those of the CUDA 12.8+ and 13 toolkits from
# sm_80 on (101 is 12.x's name of 13's 110), in the form the runtime builds for a device of
# that capability (plain, but 90a). The runtime
# itself builds for whatever device it finds, which may be newer than this list.
NAMED_ARCHS = ("80", "86", "87", "88", "89", "90a", "100", "101", "103", "110", "120", "121")


def _unnamed_arch(given: str, text: str) -> str:
    """Why an arch name that looks like one is refused: an 'a'/'f' form the runtime never
    builds for its device (it would never find that module), or no such arch."""
    plain = text.rstrip("af")
    if plain != text and plain in NAMED_ARCHS:
        return (
            f"arch '{printable(given)}': the runtime builds sm_{plain} (not its '{text[-1]}' "
            f"form) for a device of that capability, so it would never load this build: use "
            f"{plain}"
        )
    return f"arch '{printable(given)}': not a CUDA arch attnc builds for ({', '.join(NAMED_ARCHS)})"


def current_arch() -> str:
    """The arch of the current CUDA device (needs torch with CUDA)."""
    import torch

    if not torch.cuda.is_available():
        raise ToolNotFound("attnc: no CUDA device; pass arch= explicitly to build")
    return device_arch(None)


def device_arch(device: object) -> str:
    """The arch of CUDA ``device`` (a torch device or index; None: the current device);
    :class:`UnsupportedArch` for one older than compute capability 8.0."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)  # type: ignore[arg-type]
    try:
        return normalize_arch((major, minor))
    except UnsupportedArch:
        raise UnsupportedArch(
            f"attnc: the CUDA device has compute capability {major}.{minor}; attnc's kernels "
            "need 8.0 or newer"
        ) from None


def nvcc_flags(arch: str, include_dirs: tuple[str, ...], extra: tuple[str, ...] = ()) -> list[str]:
    """The full nvcc flag list for ``arch`` (already normalised)."""
    gencode = f"-gencode=arch=compute_{arch},code=sm_{arch}"
    includes = [f"-I{d}" for d in include_dirs]
    return [*BASE_FLAGS, gencode, *includes, *extra]


class NvccVersion(NamedTuple):
    """An nvcc's version: (major, minor) and its whole release line."""

    number: tuple[int, int]
    release: str  # "Cuda compilation tools, release 12.8, V12.8.93"


@functools.lru_cache(maxsize=8)
def nvcc_version(nvcc: str) -> NvccVersion | None:
    """The version ``nvcc --version`` prints (run once per process and path); None when it
    cannot be read."""
    try:
        out = subprocess.run(
            [nvcc, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=60, check=False,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"^.*release (\d+)\.(\d+).*$", out, re.MULTILINE)
    if found is None:
        return None
    return NvccVersion((int(found.group(1)), int(found.group(2))), found.group(0).strip())


def installed_release() -> str | None:
    """The release line of the nvcc a build would run; None where there is none or it cannot
    say (a host without nvcc loads modules built elsewhere)."""
    try:
        version = nvcc_version(find_nvcc())
    except ToolNotFound:
        return None
    return version.release if version is not None else None


def _usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def speed_flags(nvcc: str, jobs: int | None = None) -> tuple[str, ...]:
    """Flags that only make nvcc faster: ``-split-compile=N`` runs the device optimiser and
    assembler of a module's kernels on N threads (nvcc 12.4 and newer): every CPU (0) by
    default, this process's CPUs over ``jobs`` when that many nvcc may run at once. The
    binary is the same (same SASS, checked for the prefill module), so these flags stay out
    of the cache key."""
    version = nvcc_version(nvcc)
    if version is None or version.number < (12, 4):
        return ()
    threads = 0 if not jobs else max(1, _usable_cpus() // jobs)
    return (f"-split-compile={threads}",)
