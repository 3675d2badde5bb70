"""A grouped bar plot per suite (matplotlib, optional)."""

from __future__ import annotations

from benchmarks.report import columns


def write_plot(suite: str, rows: list[dict], path: str) -> str:
    """Save a PNG of the ok figures per row and system; returns a note for the report."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return f"{suite}: plot skipped (matplotlib missing)"
    cols = columns(rows)
    width = 0.8 / max(1, len(cols))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows) + 2), 4.5))
    for i, name in enumerate(cols):
        xs, ys = [], []
        for j, row in enumerate(rows):
            out = row["systems"].get(name)
            if out and out.get("status") == "ok":
                xs.append(j + i * width)
                ys.append(out["value"])
        ax.bar(xs, ys, width=width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))])
    ax.set_xticklabels([r["case"] for r in rows], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(", ".join(sorted({r["unit"] for r in rows})))
    ax.set_title(f"{suite} (missing bars: not available, error or mismatch)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"{suite}: plot {path.rsplit('/', 1)[-1]}"
