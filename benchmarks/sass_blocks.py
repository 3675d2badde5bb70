"""One kernel's SASS in basic blocks, to read a loop's per-tile work without a GPU: the
kernel's loops (its backward branches), and for an address range every basic block with its
instruction count, its last instruction and its most frequent opcodes (predicates dropped).
Counting a steady tile means following one path through the blocks of a loop by hand: the
blocks a path takes are the ones whose branch conditions it meets (RESULTS.md run 43, item 5,
counted the causal d=128 three-consumer kernel this way).

    cuobjdump -sass MODULE.so > m.sass
    python -m benchmarks.sass_blocks m.sass --kernel 'ILi128ELi3ELi80E'
    python -m benchmarks.sass_blocks m.sass --kernel 'ILi128ELi3ELi80E' --range 6fd0:a330

``--kernel`` is a regular expression searched in the mangled names (the first match is read;
every match is listed); without ``--range`` the loops are printed.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_FUNCTION = re.compile(r"^\s*Function : (\S+)")
_INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_BRANCH = re.compile(r"\bBRA(?:\.[A-Z.]+)?\s+(?:!?U?P[0-9T], )?(0x[0-9a-f]+)")
_PREDICATE = re.compile(r"^@!?U?P[0-9T]+\s+")


@dataclass(frozen=True)
class Block:
    """A basic block: its first address and its instructions' text."""

    start: int
    instructions: tuple[str, ...]

    def opcodes(self) -> Counter[str]:
        """How often each opcode (with its modifiers, without a predicate) occurs."""
        return Counter(_PREDICATE.sub("", text).split()[0] for text in self.instructions)


def kernels(sass: str) -> dict[str, list[tuple[int, str]]]:
    """Every function of cuobjdump's SASS text: mangled name -> (address, instruction)."""
    out: dict[str, list[tuple[int, str]]] = {}
    current: list[tuple[int, str]] | None = None
    for line in sass.splitlines():
        if m := _FUNCTION.match(line):
            current = out.setdefault(m.group(1), [])
        elif current is not None and (m := _INSTRUCTION.match(line)):
            current.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def branch_target(text: str) -> int | None:
    """The address a branch instruction goes to (None for any other instruction)."""
    m = _BRANCH.search(text)
    return int(m.group(1), 16) if m else None


def back_edges(code: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(branch address, target) of every branch to itself or an earlier address: the loops."""
    out = []
    for address, text in code:
        target = branch_target(text)
        if target is not None and target <= address:
            out.append((address, target))
    return out


def blocks(code: list[tuple[int, str]], lo: int, hi: int) -> list[Block]:
    """The basic blocks of the instructions at addresses [lo, hi): a block starts at lo, at
    the target of any branch of the function, and after every branch."""
    inside = [(a, t) for a, t in code if lo <= a < hi]
    leaders = {lo}
    for address, text in code:
        target = branch_target(text)
        if target is not None:
            leaders.update((address + 16, target))
    out: list[tuple[int, list[str]]] = []
    for address, text in inside:
        if address in leaders or not out:
            out.append((address, []))
        out[-1][1].append(text)
    return [Block(start, tuple(texts)) for start, texts in out]


def _address_range(spec: str) -> tuple[int, int]:
    try:
        lo, hi = (int(part, 16) for part in spec.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"want LO:HI in hex, got {spec!r}") from None
    if lo >= hi:
        raise argparse.ArgumentTypeError(f"LO must be below HI, got {spec!r}")
    return lo, hi


def main() -> None:
    """Parse the arguments; print the matching kernels, then the loops or the blocks."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sass", type=Path, help="cuobjdump -sass output")
    ap.add_argument("--kernel", default="", help="regular expression on the mangled names")
    ap.add_argument("--range", type=_address_range, help="hex LO:HI, e.g. 6fd0:a330")
    ap.add_argument("--top", type=int, default=8, help="opcodes shown per block")
    args = ap.parse_args()
    try:
        pattern = re.compile(args.kernel)
    except re.error as exc:
        ap.error(f"--kernel: not a regular expression ({exc})")
    try:
        sass = args.sass.read_text(errors="replace")
    except OSError as exc:
        ap.error(f"sass: cannot read {args.sass} ({exc.strerror or exc})")
    found = {n: c for n, c in kernels(sass).items() if pattern.search(n)}
    if not found:
        ap.error(f"--kernel: no function of {args.sass} matches {args.kernel!r}")
    for name, code in found.items():
        print(f"{name}: {len(code)} instructions")
    code = next(iter(found.values()))
    if args.range is None:
        for address, target in back_edges(code):
            print(
                f"loop: {target:#x} .. {address:#x} ({(address - target) // 16 + 1} instructions)"
            )
        return
    for block in blocks(code, *args.range):
        top = " ".join(f"{op}:{n}" for op, n in block.opcodes().most_common(args.top))
        print(
            f"{block.start:#x} {len(block.instructions):4d} | {block.instructions[-1][:48]} | {top}"
        )


if __name__ == "__main__":
    main()
