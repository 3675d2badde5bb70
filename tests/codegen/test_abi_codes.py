"""attnc/abi_codes.h and its one Python mirror (attnc/runtime/abi.py) agree: by parsing the
header, and by compiling a host program that prints the values the C++ compiler sees."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from attnc.runtime import abi
from attnc.runtime.build import cache, toolchain

HEADER = cache.INCLUDE_DIR / "attnc" / "abi_codes.h"


def _header_codes() -> dict[str, int]:
    found = re.findall(r"^#define (ATTNC_\w+) (\d+)", HEADER.read_text(), flags=re.M)
    return {name: int(value) for name, value in found}


def _python_codes() -> dict[str, int]:
    codes = {name: code for code, name in abi.ERROR_NAMES.items()}
    for name in dir(abi):
        if name.startswith(("PLAN_", "PT_")) and isinstance(getattr(abi, name), int):
            codes[f"ATTNC_{name}"] = getattr(abi, name)
    return codes


def test_header_and_mirror_hold_the_same_codes():
    header = _header_codes()
    assert len(header) == 25
    assert header == _python_codes()


def test_no_other_header_defines_the_codes():
    """The launcher and planner headers include abi_codes.h instead of repeating it."""
    names = set(_header_codes())
    roots = [cache.INCLUDE_DIR, cache.PACKAGE_DIR / "kernels" / "host"]
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and path != HEADER:
                defined = set(re.findall(r"#define (ATTNC_\w+)", path.read_text()))
                assert not defined & names, (path, defined & names)


def _nvcc() -> str | None:
    try:
        nvcc = toolchain.find_nvcc()
    except toolchain.ToolNotFound:
        return None
    return nvcc if shutil.which(nvcc) else None


@pytest.mark.nvcc
def test_compiled_values_match_the_mirror(tmp_path):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    names = sorted(_header_codes())
    lines = "".join(f'  printf("%s %d\\n", "{n}", (int)({n}));\n' for n in names)
    src = tmp_path / "codes.cpp"
    src.write_text(f'#include <stdio.h>\n#include "attnc/abi_codes.h"\nint main() {{\n{lines}}}\n')
    exe = tmp_path / "codes"
    subprocess.run([nvcc, f"-I{cache.INCLUDE_DIR}", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    compiled = {name: int(value) for name, value in (line.split() for line in out.splitlines())}
    assert compiled == _python_codes()
