"""Owns: the ``build.ninja`` written next to each module.

The library is built by running nvcc directly (no shell; the commands come from
``nvcc_run.py``). The ``build.ninja`` in each module directory repeats those commands for
rebuilding by hand (``ninja -C <dir>``): the module's files are named relative to that
directory, every argument is shell-quoted and ninja-escaped, and paths appear literally in the
command (never through ``$in``/``$out``), so no path character reaches a shell unquoted.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence


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


def _output_and_inputs(command: Sequence[str]) -> tuple[str, list[str]]:
    """OUTPUT and the INPUTs of a command ending in ``-o OUTPUT INPUT...``."""
    at = len(command) - 1 - list(reversed(command)).index("-o")
    return command[at + 1], list(command[at + 2 :])


def render_build_file(commands: Sequence[Sequence[str]]) -> str:
    """Text of a ``build.ninja`` that runs ``commands`` (each ending in ``-o OUTPUT
    INPUT...``; the last one builds the library) to build the last OUTPUT."""
    lines = [
        "ninja_required_version = 1.3\n",
        "rule nvcc",
        "  command = $nvcc_command",
        "  description = nvcc $out\n",
    ]
    for command in commands:
        output, inputs = _output_and_inputs(command)
        lines.append(f"build {_ninja_path(output)}: nvcc {' '.join(map(_ninja_path, inputs))}")
        lines.append(f"  nvcc_command = {_ninja_value(shlex.join(command))}")
    lines.append(f"default {_ninja_path(_output_and_inputs(commands[-1])[0])}")
    return "\n".join(lines) + "\n"
