"""Owns: the nvcc command line of a module and the ``build.ninja`` written next to it.

The library is built by running nvcc directly (no shell; see ``jit.py``). The ``build.ninja``
in each module directory repeats that command for rebuilding by hand (``ninja -C <dir>``):
every argument is shell-quoted and ninja-escaped, and paths appear literally in the command
(never through ``$in``/``$out``), so no path character reaches a shell unquoted.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path


def _ninja_path(text: str) -> str:
    """``text`` escaped for a path position of a ninja build line."""
    if "\n" in text:
        raise ValueError(f"a build path cannot hold a newline: {text!r}")
    return text.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def _ninja_value(text: str) -> str:
    """``text`` escaped for the value of a ninja variable (``$`` doubled; no newlines)."""
    if "\n" in text:
        raise ValueError(f"a build command cannot hold a newline: {text!r}")
    return text.replace("$", "$$")


def nvcc_command(nvcc: str, flags: Sequence[str], source: Path, output: Path) -> list[str]:
    """The exact nvcc command line that builds ``output`` from ``source``."""
    return [nvcc, *flags, "-o", str(output), str(source)]


def render_build_file(command: Sequence[str]) -> str:
    """Text of a ``build.ninja`` that runs ``command`` (an nvcc command ending in
    ``-o OUTPUT SOURCE``) to build OUTPUT from SOURCE."""
    output, source = command[-2], command[-1]
    return (
        "ninja_required_version = 1.3\n\n"
        "rule nvcc\n"
        "  command = $nvcc_command\n"
        "  description = nvcc $out\n\n"
        f"build {_ninja_path(output)}: nvcc {_ninja_path(source)}\n"
        f"  nvcc_command = {_ninja_value(shlex.join(command))}\n"
        f"default {_ninja_path(output)}\n"
    )
