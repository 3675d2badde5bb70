"""Collected results, saved (JSON + markdown) after every row so a cut-short run keeps them."""

from __future__ import annotations

import json
import os
import time

from benchmarks.outcome import Outcome
from benchmarks.report import render_all


class Results:
    """Rows per suite plus the ceilings; ``save()`` writes bench.json and bench.md."""

    def __init__(self, out_dir: str, meta: dict | None = None):
        self.out_dir = out_dir
        self.data: dict = {"meta": meta or {}, "ceilings": {}, "suites": {}}
        os.makedirs(out_dir, exist_ok=True)

    def add_row(
        self, suite: str, case: str, unit: str, outcomes: dict[str, Outcome], *, higher=True, work=0
    ) -> None:
        """Append one row and save."""
        row = {
            "case": case,
            "unit": unit,
            "higher_is_better": higher,
            "work": work,
            "systems": {name: o.to_dict() for name, o in outcomes.items()},
        }
        self.data["suites"].setdefault(suite, []).append(row)
        self.save()

    def set_ceilings(self, ceilings: dict) -> None:
        """Record the measured ceilings and save."""
        self.data["ceilings"] = ceilings
        self.save()

    def save(self) -> None:
        """Write bench.json and bench.md into the output folder."""
        self.data["meta"]["saved_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(os.path.join(self.out_dir, "bench.json"), "w") as f:
            json.dump(self.data, f, indent=1)
        with open(os.path.join(self.out_dir, "bench.md"), "w") as f:
            f.write(render_all(self.data))
