"""Groups a kernel's SASS instructions by how often they ran, from Nsight Compute's source
page, to tell per-tile work from per-item work: in the Hopper prefill every instruction of the
steady KV loop runs once per tile and consumer warp, every instruction of the item switch once
per item and consumer warp, so instructions with the same execution count form one code path.
For each group: its instructions, its share of the warp stall samples and of the executed
instructions, and its three main stall reasons.

Make the input on the GPU machine (a report with the SourceCounters section, then its SASS
page as CSV), e.g. ``scripts/ncu_sass.sh win python3 -m benchmarks.timing_probe --rows
sliding_window:8192:128:window=1024 --ncu``, then:

    python -m benchmarks.ncu_sass_groups win.sass.csv [--top 12] [--show COUNT]

``--show COUNT`` lists the instructions of the group that ran COUNT times, in address order,
with their samples.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

EXECUTED = "Instructions Executed"
SAMPLES = "Warp Stall Sampling (All Samples)"


@dataclass
class Instruction:
    """One SASS instruction of the page: its text, how often it ran, its stall samples."""

    address: str
    source: str
    executed: int
    samples: int
    stalls: dict[str, int] = field(default_factory=dict)


@dataclass
class Group:
    """Instructions that ran the same number of times."""

    executed_each: int
    instructions: list[Instruction] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return sum(i.samples for i in self.instructions)

    @property
    def executed(self) -> int:
        return self.executed_each * len(self.instructions)

    def top_stalls(self, n: int = 3) -> list[tuple[str, int]]:
        total: dict[str, int] = defaultdict(int)
        for ins in self.instructions:
            for reason, count in ins.stalls.items():
                total[reason] += count
        ranked = sorted(((c, r) for r, c in total.items() if c), reverse=True)[:n]
        return [(r, c) for c, r in ranked]


def _int(text: str) -> int:
    return int(text.replace(",", "")) if text.strip() else 0


def read_page(path: Path) -> list[Instruction]:
    """The instructions of an ``ncu --page source --csv --print-source sass`` export; a
    ValueError names a file without the columns this needs."""
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if EXECUTED in r and SAMPLES in r), None)
    if header_at is None:
        raise ValueError(f"{path}: no {EXECUTED!r} and {SAMPLES!r} columns (export the source "
                         "page of a report with the SourceCounters section)")  # fmt: skip
    header = rows[header_at]
    col = {name: i for i, name in enumerate(header)}
    stall_cols = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for row in rows[header_at + 1 :]:
        if len(row) < len(header):
            continue
        try:
            executed, samples = _int(row[col[EXECUTED]]), _int(row[col[SAMPLES]])
            stalls = {h.removeprefix("stall_"): _int(row[col[h]]) for h in stall_cols}
        except ValueError:
            continue
        out.append(Instruction(row[col["Address"]], row[col["Source"]].strip(), executed,
                               samples, stalls))  # fmt: skip
    return out


def group_by_count(instructions: list[Instruction]) -> list[Group]:
    """Groups of instructions that ran equally often (never-run ones left out), most sampled
    first."""
    groups: dict[int, Group] = {}
    for ins in instructions:
        if ins.executed:
            groups.setdefault(ins.executed, Group(ins.executed)).instructions.append(ins)
    return sorted(groups.values(), key=lambda g: (-g.samples, -g.executed_each))


def report(instructions: list[Instruction], top: int) -> list[str]:
    """One line per group of the ``top`` most sampled."""
    samples = sum(i.samples for i in instructions) or 1
    executed = sum(i.executed for i in instructions) or 1
    lines = [f"{len(instructions)} instructions, {samples} samples, {executed} executed"]
    for g in group_by_count(instructions)[:top]:
        stalls = ", ".join(f"{r} {c}" for r, c in g.top_stalls())
        lines.append(f"ran {g.executed_each:>9d}x  {len(g.instructions):5d} instructions  "
                     f"samples {100 * g.samples / samples:5.1f}%  executed "
                     f"{100 * g.executed / executed:5.1f}%  [{stalls}]")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("page", type=Path, help="the exported SASS source page (CSV)")
    ap.add_argument("--top", type=int, default=12, help="groups to print (default 12)")
    ap.add_argument("--show", type=int, help="list the group that ran this many times")
    args = ap.parse_args(argv)
    if args.top < 1:
        ap.error("--top must be at least 1")
    try:
        instructions = read_page(args.page)
    except (OSError, ValueError) as exc:
        ap.error(str(exc))
    print("\n".join(report(instructions, args.top)))
    if args.show is not None:
        for ins in instructions:
            if ins.executed == args.show:
                print(f"{ins.address[-6:]} {ins.samples:6d}  {ins.source}")


if __name__ == "__main__":
    main()
