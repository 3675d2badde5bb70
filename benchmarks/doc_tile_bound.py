"""How close the document row can come to causal, by tile shape (no GPU).

A kernel computes whole tiles: every (query, key) pair of a tile that is not EMPTY costs the
same, visible or not. The share of computed pairs that are visible is therefore a ceiling on
TFLOP/s over visible pairs, relative to a kernel that wasted nothing. For issue 13's
document workload (8K tokens packed from 8 documents, ``plan_time.doc_ids``: causal inside
each document) and for causal 8K, this prints that share per tile shape, in query tokens x
keys, and the documents' ceiling relative to causal: what ``doc_causal`` would reach against
causal if its partial tiles cost no more than full ones and both balanced perfectly.

A Hopper work item packs the query heads of one KV head into its rows, so with 32 query and
8 KV heads (group 4) its 192 rows (three consumers) are 48 query tokens and 128 rows (two)
are 32; its K/V stages hold 64 keys, the tile map's columns too.

    python -m benchmarks.doc_tile_bound [--shapes 48x64,32x64,128x128,64x64]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import numpy as np

from benchmarks.arg_lists import int_pairs

DEFAULT_SHAPES = "48x64,32x64,128x128,64x64"
MIN_SIDE, MAX_SIDE = 8, 8192
Visible = Callable[[np.ndarray, np.ndarray], np.ndarray]


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``TOKENSxKEYS,...`` as (query tokens, keys) pairs; a bad entry raises ValueError
    (shown escaped)."""
    shapes = []
    for item, rows, keys in int_pairs(text, "--shapes", "x", "TOKENSxKEYS", 5):
        if not (MIN_SIDE <= rows <= MAX_SIDE and MIN_SIDE <= keys <= MAX_SIDE):
            raise ValueError(
                f"--shapes: {item!r} needs both sides in [{MIN_SIDE}, {MAX_SIDE}] "
                "(smaller tiles would take minutes to count)"
            )
        shapes.append((rows, keys))
    return shapes


def useful_share(visible: Visible, length: int, rows: int, keys: int) -> float:
    """Visible pairs over the pairs of every non-EMPTY (rows x keys) tile of a length x length
    square; ``visible(q, k)`` broadcasts over query and key index arrays."""
    computed = seen = 0
    for q0 in range(0, length, rows):
        q = np.arange(q0, min(q0 + rows, length))[:, None]
        for k0 in range(0, length, keys):
            k = np.arange(k0, min(k0 + keys, length))[None, :]
            n = int(visible(q, k).sum())
            if n:
                computed += q.shape[0] * k.shape[1]
                seen += n
    return seen / computed


def bound_rows(doc: np.ndarray, shapes: list[tuple[int, int]]) -> list[dict]:
    """One row per shape: causal's and the documents' useful shares and their ratio."""

    def causal(q: np.ndarray, k: np.ndarray) -> np.ndarray:
        return k <= q

    def documents(q: np.ndarray, k: np.ndarray) -> np.ndarray:
        return (k <= q) & (doc[k] == doc[q])

    out = []
    for rows, keys in shapes:
        c = useful_share(causal, len(doc), rows, keys)
        d = useful_share(documents, len(doc), rows, keys)
        out.append(
            {
                "tile": f"{rows}x{keys}",
                "causal_useful": round(c, 4),
                "documents_useful": round(d, 4),
                "documents_over_causal_ceiling": round(d / c, 4),
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="TOKENSxKEYS,...")
    args = parser.parse_args(argv)
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as exc:
        parser.error(str(exc))
    from benchmarks.plan_time import doc_ids

    doc = doc_ids().numpy()
    print(json.dumps({"document_lengths": sorted(np.bincount(doc).tolist())}))
    for row in bound_rows(doc, shapes):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
