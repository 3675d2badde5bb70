"""Kernel sources stay readable: no file in attnc/kernels/ over 500 lines, no function (device
code included) over 120 lines, and every header says what it owns."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[2] / "attnc" / "kernels"
SUFFIXES = {".cuh", ".h", ".cu", ".cpp"}
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 120

CONTROL = re.compile(r"^\s*(?:}\s*)?(?:if|for|while|switch|catch|else|do)\b")
SCOPE = re.compile(r"\b(?:namespace|struct|class|union|enum)\b[^()]*$")


def sources() -> list[Path]:
    return sorted(p for p in KERNELS.rglob("*") if p.suffix in SUFFIXES)


def strip_comments_and_strings(text: str) -> str:
    """The text with comments, string and character literals and preprocessor lines (macro
    bodies included) blanked, newlines kept."""

    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group(0))

    pattern = r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\''
    text = re.sub(pattern, blank, text, flags=re.S)
    return re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", blank, text, flags=re.M)


def function_lengths(text: str) -> list[tuple[str, int]]:
    """(signature, lines from its first line to the closing brace) of every outermost function
    body: a `{` whose head (the text since the previous `;`, `{` or `}`) has a parameter list
    and is neither a control statement nor a namespace/struct/class/enum scope. Bodies nested
    in a function (lambdas, blocks) count towards that function."""
    code = strip_comments_and_strings(text)
    found: list[tuple[str, int]] = []
    stack: list[tuple[bool, int, str]] = []  # (is a function body, start line, signature)
    head_start = 0
    line = 1
    for i, ch in enumerate(code):
        if ch == "\n":
            line += 1
        elif ch == "{":
            head = code[head_start:i]
            in_function = any(entry[0] for entry in stack)
            is_function = (
                not in_function
                and ")" in head
                and not CONTROL.search(head.strip())
                and not SCOPE.search(head)
                and not head.rstrip().endswith("=")
            )
            start = line - head.lstrip().count("\n")  # the line where the head begins
            stack.append((is_function, start, " ".join(head.split())[:80]))
            head_start = i + 1
        elif ch == "}":
            if stack:
                is_function, start, sig = stack.pop()
                if is_function:
                    found.append((sig, line - start + 1))
            head_start = i + 1
        elif ch == ";":
            head_start = i + 1
    return found


def test_function_length_scanner_finds_functions():
    text = (
        "// Owns: x\nnamespace a {\nstruct S {\n  int f(int x) const {\n    if (x) {\n"
        "      return 1;\n    }\n    auto g = [&](int y) { return y; };\n    return g(x);\n"
        "  }\n};\ntemplate <int N>\n__device__ void k(\n    int n) {\n  for (;;) {}\n}\n}\n"
    )
    assert function_lengths(text) == [
        ("int f(int x) const", 7),
        ("template <int N> __device__ void k( int n)", 5),
    ]


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(KERNELS)))
def test_kernel_source_size(path: Path):
    text = path.read_text()
    lines = text.count("\n") + 1
    assert lines <= MAX_FILE_LINES, f"{path.name}: {lines} lines"
    long = [(sig, n) for sig, n in function_lengths(text) if n > MAX_FUNCTION_LINES]
    assert long == [], f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"
    assert "Owns:" in text[:2000], f"{path.name}: no 'Owns:' header comment"
