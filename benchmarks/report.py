"""Markdown tables from collected results: each system's figure and attnc's ratios."""

from __future__ import annotations

CEILING_FOR_UNIT = {"TFLOP/s": "matmul_tflops", "TB/s": "copy_tbps"}
QUIET_NOTES = {"reference", "graph"}


def format_outcome(out: dict | None) -> str:
    """One cell: the figure when ok, else the status with its reason (never a zero)."""
    if out is None:
        return ""
    status, note = out.get("status"), out.get("note", "")
    if status == "ok":
        value = out["value"]
        text = f"{value:.2f}" if value < 10 else f"{value:.0f}" if value >= 100 else f"{value:.1f}"
        shown = [n for n in note.split("; ") if n and n not in QUIET_NOTES]
        return f"{text} ({'; '.join(shown)})" if shown else text
    if status == "n/a":
        return "—"
    return f"{status}: {note}" if note else str(status)


def is_attnc(name: str) -> bool:
    """attnc's own columns: ``attnc`` and one per prefill backend (``attnc-sm90``, ...)."""
    return name == "attnc" or name.startswith("attnc-")


def columns(rows: list[dict]) -> list[str]:
    """System names in first-seen order, attnc's columns first."""
    names: list[str] = []
    for row in rows:
        for name in row["systems"]:
            if name not in names:
                names.append(name)
    return sorted(names, key=lambda n: not is_attnc(n))


def is_stand_in(out: dict) -> bool:
    """True for a figure of another function than the row's (timed, not compared): the
    outcome's ``stand_in``; results written before that field say so only in the note, whose
    stand-in wording always held "not compared", so such a note counts as a stand-in there."""
    if "stand_in" in out:
        return bool(out["stand_in"])
    return "not compared" in out.get("note", "")


def compared_figures(row: dict, attnc: bool) -> list[tuple[str, float]]:
    """(name, value) of the row's ok outcomes of the row's own function, attnc's columns
    (``attnc``) or the anchors'; stand-ins are left out."""
    return [
        (name, o["value"])
        for name, o in row["systems"].items()
        if is_attnc(name) == attnc and o.get("status") == "ok" and not is_stand_in(o)
    ]


def best_anchor(row: dict) -> tuple[str, float] | None:
    """(name, value) of the best ok anchor in the row that is not a stand-in, or None."""
    ok = compared_figures(row, attnc=False)
    if not ok:
        return None
    pick = max if row.get("higher_is_better", True) else min
    return pick(ok, key=lambda item: item[1])


def _ratios(value: float, row: dict, ceilings: dict) -> tuple[str, str]:
    """One attnc figure against the row's best anchor and against the ceiling."""
    best = best_anchor(row)
    vs_best = ""
    if best and best[1] > 0 and value > 0:
        factor = value / best[1] if row.get("higher_is_better", True) else best[1] / value
        vs_best = f"{factor:.2f}x {best[0]}"
    ceiling = ceilings.get(CEILING_FOR_UNIT.get(row["unit"], ""), 0)
    vs_ceiling = f"{100 * value / ceiling:.0f}%" if ceiling else ""
    return vs_best, vs_ceiling


def ratio_cells(row: dict, ceilings: dict) -> tuple[str, str]:
    """attnc vs the best anchor (x, above 1 is better) and attnc over the ceiling; with
    several attnc columns (one per backend) each ratio is prefixed by its backend. A stand-in
    (``is_stand_in``) takes part in no ratio."""
    mine = compared_figures(row, attnc=True)
    if len(mine) == 1 and mine[0][0] == "attnc":
        return _ratios(mine[0][1], row, ceilings)
    best_cells, ceiling_cells = [], []
    for name, value in mine:
        vs_best, vs_ceiling = _ratios(value, row, ceilings)
        label = name.removeprefix("attnc-")
        if vs_best:
            best_cells.append(f"{label} {vs_best}")
        if vs_ceiling:
            ceiling_cells.append(f"{label} {vs_ceiling}")
    return "; ".join(best_cells), "; ".join(ceiling_cells)


def render_suite(name: str, rows: list[dict], ceilings: dict) -> str:
    """A markdown table for one suite."""
    cols = columns(rows)
    head = ["row", "unit", *cols, "attnc vs best anchor", "attnc / ceiling"]
    lines = [f"## {name}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        cells = [row["case"], row["unit"]]
        cells += [format_outcome(row["systems"].get(c)).replace("|", "/") for c in cols]
        cells += list(ratio_cells(row, ceilings))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_ceilings(ceilings: dict) -> str:
    """The measured ceilings as a small table."""
    if not ceilings:
        return ""
    lines = ["## ceilings (measured in this run)", "", "| what | measured |", "| --- | --- |"]
    if "copy_tbps" in ceilings:
        lines.append(f"| device-to-device copy (read + write) | {ceilings['copy_tbps']:.2f} TB/s |")
    if "matmul_tflops" in ceilings:
        lines.append(f"| bf16 GEMM 8192^3 | {ceilings['matmul_tflops']:.0f} TFLOP/s |")
    return "\n".join(lines) + "\n"


def render_all(data: dict) -> str:
    """The whole report: meta line, ceilings, one table per suite, notes."""
    meta = data.get("meta", {})
    parts = ["# attnc benchmarks", ""]
    shown = {k: v for k, v in meta.items() if k != "notes"}
    if shown:
        parts.append(", ".join(f"{k}: {v}" for k, v in shown.items()) + "\n")
    ceil = render_ceilings(data.get("ceilings", {}))
    if ceil:
        parts.append(ceil)
    for name, rows in data.get("suites", {}).items():
        parts.append(render_suite(name, rows, data.get("ceilings", {})))
    for note in meta.get("notes", []):
        parts.append(f"- {note}")
    return "\n".join(parts) + "\n"
