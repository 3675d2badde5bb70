"""Every test module under tests/ has a name of its own: pytest imports them by basename (the
default prepend import mode, no packages), so two tiers holding a file of the same name stop
the whole run at collection ("import file mismatch"), which the GPU tier, run alone, does not
see."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_modules_have_distinct_basenames():
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name.startswith("test_") or path.name == "conftest.py":
            by_name[path.name].append(str(path.relative_to(TESTS)))
    clashes = {n: p for n, p in by_name.items() if len(p) > 1 and n != "conftest.py"}
    assert clashes == {}, clashes
