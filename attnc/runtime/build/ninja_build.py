"""Writing ``build.ninja`` files and running ninja over one or several module directories.

Each module directory gets its own ``build.ninja`` with absolute paths, so it can be rebuilt by
hand with ``ninja -C <dir>``; several modules are built in one ninja run through a small
top-level file that ``subninja``-includes each of them (ninja then compiles them in parallel).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path

from attnc.runtime.build.cache import write_if_changed


def _ninja_escape(text: str) -> str:
    return text.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def nvcc_command(nvcc: str, flags: Sequence[str], source: Path, output: Path) -> list[str]:
    """The exact nvcc command line that builds ``output`` from ``source``."""
    return [nvcc, *flags, "-o", str(output), str(source)]


def render_build_file(nvcc: str, flags: Sequence[str], source: Path, output: Path) -> str:
    """Text of a ``build.ninja`` that compiles ``source`` into the shared library ``output``."""
    command = " ".join(shlex.quote(a).replace("$", "$$") for a in [nvcc, *flags])
    return (
        "ninja_required_version = 1.3\n"
        f"nvcc_command = {command}\n\n"
        "rule nvcc\n"
        "  command = $nvcc_command -o $out $in\n"
        "  description = nvcc $out\n\n"
        f"build {_ninja_escape(str(output))}: nvcc {_ninja_escape(str(source))}\n"
        f"default {_ninja_escape(str(output))}\n"
    )


def render_group_file(build_files: Sequence[Path]) -> str:
    """Text of a top-level ninja file that includes every module's ``build.ninja``."""
    lines = ["ninja_required_version = 1.3"]
    lines += [f"subninja {_ninja_escape(str(p))}" for p in build_files]
    return "\n".join(lines) + "\n"


def run_ninja(
    ninja: str, build_file: Path, targets: Sequence[Path], jobs: int | None = None
) -> tuple[int, str]:
    """Run ninja on ``build_file`` for ``targets``; return (exit code, combined output)."""
    jobs = jobs or max(1, os.cpu_count() or 1)
    cmd = [ninja, "-f", str(build_file), "-j", str(jobs), *(str(t) for t in targets)]
    proc = subprocess.run(
        cmd, cwd=build_file.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return proc.returncode, proc.stdout


def write_group_file(path: Path, build_files: Sequence[Path]) -> Path:
    """Write (only when changed) the group file at ``path`` and return it."""
    write_if_changed(path, render_group_file(build_files))
    return path
