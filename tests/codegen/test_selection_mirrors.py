"""The kernel selection rules the Python side repeats, pinned against the C++ headers they
repeat, by compiling a host program that prints what the C++ compiler evaluates (no GPU):

- ``attnc.codegen.module.sm90_has_three_consumer_kernel`` (a Hopper module with a
  three-consumer kernel is built from two sources) against ``Sm90Consumers``
  (attnc/sm90/prefill_sm90_config.cuh), for every stdlib and example variant and variants
  covering each term of the rule (softmax, a per-token mask tensor, a stepped bias);
- ``WIDEST_TILE_ROWS`` and ``_narrowest_tile`` of attnc/runtime/wrappers/single_prefill.py
  (the tile-map room of a one-request workspace) against the query tokens per work item of
  both templates (``prefill_tile_q_tokens``, attnc/prefill_config.cuh, and
  ``prefill_sm90_tile_q_tokens``).

Neither copy can ask a built module instead: the first decides which sources the module is
built from, the second sizes the workspace before ``plan()`` chooses the module.
"""

from __future__ import annotations

import glob
import subprocess
from pathlib import Path

import pytest
from host_fixture import INCLUDE, NVCC_MARKS

from attnc.codegen.functor import emit_functor, struct_name
from attnc.codegen.instances import HEAD_DIMS
from attnc.codegen.module import sm90_has_three_consumer_kernel
from attnc.compiler import ir
from attnc.compiler.analysed import analysed
from attnc.compiler.pipeline import compile_source, resolve_source, stdlib_names
from attnc.runtime.wrappers.single_prefill import WIDEST_TILE_ROWS, _narrowest_tile

pytestmark = NVCC_MARKS

ROOT = Path(__file__).resolve().parents[2]

# Each combination of the rule's terms: softmax or not, a per-token mask tensor (kv_len or
# q_len) or not, a stepped bias or not.
TERMS = """
variant step_docs {
    param slopes: tensor<f32>[num_qo_heads];
    param doc: tensor<i32>[kv_len];
    score = score + slopes[qo_head] * (kv_idx - q_pos);
    mask = kv_idx <= q_pos && doc[kv_idx] == doc[q_pos];
}
variant query_rows {
    param rows: tensor<i32>[q_len];
    mask = kv_idx <= q_pos + rows[q_idx];
}
variant plain_none {
    normalize = none;
    mask = kv_idx <= q_pos;
}
variant step_none {
    param slopes: tensor<f32>[num_qo_heads];
    normalize = none;
    score = score + slopes[qo_head] * (kv_idx - q_pos);
}
variant step_docs_none {
    param slopes: tensor<f32>[num_qo_heads];
    param doc: tensor<i32>[kv_len];
    normalize = none;
    score = score + slopes[qo_head] * (kv_idx - q_pos);
    mask = doc[kv_idx] == doc[q_pos];
}
variant docs_none {
    param doc: tensor<i32>[kv_len];
    normalize = none;
    mask = doc[kv_idx] == doc[q_pos];
}
variant step_sink {
    param slopes: tensor<f32>[num_qo_heads];
    score = score - 0.5 * kv_idx;
    mask = kv_idx <= q_pos;
    sink = slopes[qo_head];
}
variant window_step {
    param window: tensor<i32>[batch_size];
    score = score * 0.5 + float(q_pos - kv_idx) * 0.25;
    mask = kv_idx <= q_pos && q_pos - kv_idx < window[batch];
}
"""

# Longest queries around every tile edge (16, 64, 128, 192 rows, kThreeConsumersMinQ).
Q_LENS = (1, 2, 3, 4, 5, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 191, 192, 193)
Q_LENS += (1000, 2047, 2048, 2049, 8192)
GROUPS = 200


def _variants() -> list[ir.VariantIR]:
    sources = [resolve_source(f"stdlib:{name}") for name in stdlib_names()]
    sources += [(Path(f).read_text(), f) for f in sorted(glob.glob(str(ROOT / "examples/*.attn")))]
    sources.append((TERMS, "terms.attn"))
    found: dict[str, ir.VariantIR] = {}
    for text, file in sources:
        for c in compile_source(text, file)[0]:
            found.setdefault(struct_name(c.variant), c.variant)
    return list(found.values())


def _program(variants: list[ir.VariantIR]) -> str:
    """A host program printing ``C <struct> <head_dim> <consumers>`` per variant and head
    dim, and ``T <head_dim> <group> <max_q_len> <answers...>`` per request shape: the FA2
    template's query tokens per item, then the Hopper template's for a light variant
    (causal) and for one outside the light class (sigmoid)."""
    names = [struct_name(v) for v in variants]
    lines = ["#include <cstdio>", '#include "attnc/prefill_config.cuh"']
    lines += ['#include "attnc/sm90/prefill_sm90_config.cuh"']
    lines += [emit_functor(analysed(v)).replace("#pragma once\n", "") for v in variants]
    lines += ["using namespace attnc;", "using namespace attnc::sm90;"]
    lines += [
        "template <int D> void tiles() {",
        f"  const int qs[] = {{{', '.join(map(str, Q_LENS))}}};",
    ]
    lines += [
        f"  for (int g = 1; g <= {GROUPS}; ++g)",
        "    for (int q : qs)",
        '      std::printf("T %d %d %d %d %d %d\\n", D, g, q, prefill_tile_q_tokens<D>(D, g, q),',
        "                  prefill_sm90_tile_q_tokens<Variant_causal, D>(D, g, q),",
        "                  prefill_sm90_tile_q_tokens<Variant_sigmoid, D>(D, g, q));",
        "}",
        "int main() {",
    ]
    for name in names:
        for d in HEAD_DIMS:
            lines.append(f'  std::printf("C {name} {d} %d\\n", Sm90Consumers<{name}, {d}>::value);')
    lines += [f"  tiles<{d}>();" for d in HEAD_DIMS]
    lines += ["  return 0;", "}", ""]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def compiled_answers(tmp_path_factory) -> list[list[str]]:
    """The program's output lines, split."""
    tmp = tmp_path_factory.mktemp("selection")
    (tmp / "selection.cu").write_text(_program(_variants()))
    cmd = ["nvcc", "-std=c++17", "-O1", f"-I{INCLUDE}", str(tmp / "selection.cu")]
    build = subprocess.run([*cmd, "-o", str(tmp / "selection")], capture_output=True, text=True)
    assert build.returncode == 0, f"{' '.join(cmd)}\n{build.stdout}{build.stderr}"
    run = subprocess.run([str(tmp / "selection")], capture_output=True, text=True, check=True)
    return [line.split() for line in run.stdout.splitlines()]


def test_the_rule_terms_are_all_covered() -> None:
    """The variants above take every combination of the rule's three terms."""
    from attnc.codegen.functor import functor_traits

    seen = set()
    for v in _variants():
        t = functor_traits(analysed(v))
        seen.add((t.use_softmax, t.mask_reads_tokens, t.bias_step))
    assert len(seen) == 8, seen


def test_three_consumer_rule_matches_sm90_consumers(compiled_answers) -> None:
    by_name = {struct_name(v): v for v in _variants()}
    rows = [r for r in compiled_answers if r[0] == "C"]
    assert len(rows) == len(by_name) * len(HEAD_DIMS)
    for _, name, head_dim, consumers in rows:
        got = sm90_has_three_consumer_kernel(by_name[name], int(head_dim))
        assert got == (consumers == "3"), (name, head_dim, consumers)


def test_one_request_tile_bounds_match_the_templates(compiled_answers) -> None:
    """``_narrowest_tile`` is the fewest query tokens any template's item holds for the
    shape (where one serves it), ``WIDEST_TILE_ROWS`` the most packed rows of any."""
    answers: dict[tuple[int, int], list[int]] = {}
    for row in compiled_answers:
        if row[0] == "T":
            d, g, q, *tiles = map(int, row[1:])
            answers.setdefault((g, q), []).extend(t for t in tiles if t > 0)
    assert len(answers) == GROUPS * len(Q_LENS)
    widest = max(max(tiles) for (g, _), tiles in answers.items() if g == 1)
    assert WIDEST_TILE_ROWS == widest
    for (g, q), tiles in answers.items():
        if g > WIDEST_TILE_ROWS:
            assert not tiles, (g, q, tiles)
        elif tiles:
            assert _narrowest_tile(g, q) == min(tiles), (g, q, tiles)
