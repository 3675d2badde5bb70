"""The static range check of tensor indices (attnc/compiler/index_range.py): an index that is
always outside its dim is an error at the index, one the bounds cannot keep inside is a
warning, and the indices the kernels can read safely pass quietly."""

from __future__ import annotations

import glob
import os

import pytest

from attnc.compiler import ir
from attnc.compiler.index_bounds import Interval, builtin_interval, le
from attnc.compiler.pipeline import STDLIB_DIR, compile_source, stdlib_names
from attnc.dsl.errors import AttnError
from attnc.dsl.limits import MAX_KV_TOKENS, MAX_QUERY_TOKENS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PARAMS = """
    param t8: tensor<f32>[8];
    param heads: tensor<f32>[num_qo_heads];
    param pair: tensor<f32>[num_kv_heads, 16];
    param doc: tensor<i32>[kv_len];
    param w: i32 = 4;
"""


def _variant(score: str, mask: str = "kv_idx <= q_pos") -> str:
    used = "heads[qo_head] + pair[kv_head, 0] + t8[0] + float(w) + float(doc[kv_idx])"
    return f"variant v {{{PARAMS}    score = score + {used} + {score};\n    mask = {mask};\n}}\n"


def _index_warnings(text: str) -> list[str]:
    _, warnings = compile_source(text, "v.attn")
    return [w.message for w in warnings if "index" in w.message]


@pytest.mark.parametrize(
    "score",
    [
        "heads[qo_head]",
        "heads[kv_head]",  # num_kv_heads <= num_qo_heads
        "heads[qo_head / 2]",
        "t8[kv_idx % 8]",
        "t8[abs(qo_head) % 8]",
        "t8[min(kv_idx, 7)]",
        "t8[clamp(q_pos - kv_idx, 0, 7)]",
        "t8[max(min(kv_idx - 3, 7), 0)]",
        "pair[kv_head, kv_idx % 16]",
        "(kv_idx < 8 ? t8[kv_idx] : 0.0)",
        "(!(kv_idx >= 8) ? t8[kv_idx] : 0.0)",
        "(q_pos - kv_idx < 8 && q_pos - kv_idx >= 0 ? t8[q_pos - kv_idx] : 0.0)",
        "(kv_idx >= 8 ? 0.0 : t8[kv_idx])",
        "(qo_head < num_qo_heads - 1 ? heads[qo_head + 1] : 0.0)",
        "t8[qo_head * 0 + 7]",
        # a comparison of two positions bounds their difference
        "(q_pos - kv_idx < 8 && q_pos >= kv_idx ? t8[q_pos - kv_idx] : 0.0)",
        "(kv_idx <= q_pos ? (q_pos - kv_idx < 8 ? t8[q_pos - kv_idx] : 0.0) : 0.0)",
        "(q_idx > kv_idx && q_idx - kv_idx <= 7 ? t8[q_idx - kv_idx] : 0.0)",
        # a request holds at most MAX_KV_TOKENS keys, so a small offset of a key cannot wrap
        "t8[(kv_idx + 3) % 8]",
        "(kv_idx + 8 < 16 ? t8[kv_idx] : 0.0)",
        # constant offsets on either side of a guard bound the difference of the rest
        "(kv_idx <= q_pos && kv_idx + 8 > q_pos ? t8[q_pos - kv_idx] : 0.0)",
        "(kv_idx + 7 >= q_pos && kv_idx <= q_pos ? t8[q_pos - kv_idx] : 0.0)",
        # the lowered IR keeps x - x (the simplifier folds it later)
        "t8[qo_head - qo_head + kv_idx % 8]",
        # and so does a request's query count: q_pos - 7 cannot wrap either
        "(q_pos - 7 <= kv_idx && kv_idx <= q_pos ? t8[q_pos - kv_idx] : 0.0)",
        # offsets nest: (kv_idx + 3) + 5 is kv_idx + 8
        "(kv_idx + 3 + 5 > q_pos && kv_idx <= q_pos ? t8[q_pos - kv_idx] : 0.0)",
        "(kv_idx <= q_pos && q_pos - 4 - 3 <= kv_idx ? t8[q_pos - kv_idx] : 0.0)",
        "(2 + (kv_idx + 6) < 16 ? t8[kv_idx] : 0.0)",
        # min, max and clamp of a param: one of their arguments, so one known end is kept
        "t8[max(min(w, 7), 0)]",
        "t8[min(max(w, 0), 7)]",
        "t8[max(0, min(7, w))]",
    ],
)
def test_indices_kept_inside_their_dims_pass_quietly(score: str) -> None:
    assert _index_warnings(_variant(score)) == []


def test_guards_of_and_and_or_in_the_mask() -> None:
    assert _index_warnings(_variant("0.0", "kv_idx < 8 && t8[kv_idx] > 0.0")) == []
    assert _index_warnings(_variant("0.0", "kv_idx >= 8 || t8[kv_idx] > 0.0")) == []
    assert len(_index_warnings(_variant("0.0", "kv_idx >= 8 && t8[kv_idx] > 0.0"))) == 1


@pytest.mark.parametrize(
    ("score", "fragment", "at"),
    [
        ("heads[num_qo_heads]", "it is at least num_qo_heads", "num_qo_heads]"),
        ("heads[qo_head + num_qo_heads]", "it is at least num_qo_heads", "qo_head + "),
        ("t8[8]", "it is at least 8", "8]"),
        ("t8[kv_idx % 8 + 8]", "it is at least 8", "kv_idx % 8 + 8]"),
        ("t8[-1]", "it is at most -1", "-1]"),
        ("t8[-1 - kv_idx % 8]", "it is at most -1", "-1 - kv_idx"),
        ("pair[num_kv_heads, 0]", "it is at least num_kv_heads", "num_kv_heads, 0]"),
        ("pair[kv_head, 16]", "index 2 of 'pair'", "16]"),
    ],
)
def test_an_index_always_outside_its_dim_is_an_error_at_the_index(
    score: str, fragment: str, at: str
) -> None:
    text = _variant(score)
    with pytest.raises(AttnError) as info:
        compile_source(text, "v.attn")
    rendered = info.value.render()
    assert "outside its dim" in rendered and fragment in rendered, rendered
    loc = info.value.diagnostic.loc
    assert text.splitlines()[loc.line - 1][loc.col - 1 :].startswith(at), rendered


@pytest.mark.parametrize(
    ("score", "fragment"),
    [
        ("heads[kv_idx]", "may reach kv_len - 1"),
        ("t8[qo_head]", "may reach num_qo_heads - 1"),
        ("t8[w]", "may be negative and has no upper bound"),
        ("t8[q_pos - kv_idx]", "may be negative"),
        ("t8[kv_idx % 9]", "may reach 8"),
        ("t8[doc[kv_idx]]", "has no upper bound"),
        ("t8[int(score)]", "has no upper bound"),
        ("(kv_idx < 9 ? t8[kv_idx] : 0.0)", "may reach 8"),
        ("(qo_head >= 8 ? t8[qo_head] : 0.0)", "read only where its guards hold"),
        # offsets: one too many, a side that may wrap (w + 8), a product that may wrap
        ("(kv_idx + 9 > q_pos && kv_idx <= q_pos ? t8[q_pos - kv_idx] : 0.0)", "may reach 8"),
        ("(kv_idx + 5 + 4 > q_pos && kv_idx <= q_pos ? t8[q_pos - kv_idx] : 0.0)", "may reach 8"),
        # a nested sum that may wrap at its outer level proves nothing
        ("(kv_idx + 65536 + 65536 < 131080 ? t8[kv_idx] : 0.0)", "kv_len - 1"),
        ("(w + 8 > q_pos && kv_idx <= q_pos ? t8[q_pos - kv_idx] : 0.0)", "kv_len - 1"),
        ("t8[(kv_idx * 2 + 1) % 8]", "may be negative"),
        # one end known: the message names the other (it said both ends were unknown)
        ("t8[min(w, 7)]", "it may be negative; the kernels"),
        ("t8[max(w, 0)]", "it has no upper bound; the kernels"),
        ("t8[max(min(w, 8), 0)]", "may reach 8"),
        ("t8[abs(w) % 8]", "may be negative"),  # abs(-2**31) wraps
    ],
)
def test_an_index_the_bounds_cannot_keep_inside_is_a_warning(score: str, fragment: str) -> None:
    found = _index_warnings(_variant(score))
    assert len(found) == 1 and fragment in found[0], found
    assert "the kernels check this read" in found[0] or "guards hold" in found[0]


def test_unproven_reads_are_bounds_checked_in_the_functor_and_the_reference() -> None:
    from attnc.codegen.functor import emit_functor
    from attnc.codegen.torch_ref import emit_reference_source
    from attnc.compiler.index_range import proven_loads

    text = _variant("t8[kv_idx] + (kv_idx < 8 ? t8[7 - kv_idx] : 0.0)")
    compiled, _ = compile_source(text, "v.attn")
    c = compiled[0]
    proven = proven_loads(c.variant)
    names = sorted(
        n.name for n in ir.walk(c.variant.score) if isinstance(n, ir.TensorLoad) and n in proven
    )
    # heads[qo_head], pair[kv_head, 0], t8[0], doc[kv_idx] and the guarded read: proven.
    assert "t8" in names and "heads" in names and "pair" in names
    cuda = emit_functor(c)
    # Only t8[kv_idx] is checked (in each form of the score the functor carries) ...
    checked = "attnc::vm::load_in_shape_(p.p_t8, 0, kv_idx, 8)"
    head, key_values = cuda.split("KeyValues key_values(int kv_idx) const {")
    key_values, tail = key_values.split("return key;", 1)
    hooks = head + tail
    assert hooks.count(checked) >= 1 and hooks.count("load_in_shape_") == hooks.count(checked)
    # ... but key_values, which reads every key's values ahead of the guard, checks both.
    assert key_values.count(checked) == 1 and key_values.count("load_in_shape_(p.p_t8") == 2
    # t8[kv_idx] reads by key: past a tail's end the kernels pass the score its last key.
    assert "static constexpr bool kScoreReadsByKey = true;" in cuda
    reference = emit_reference_source(c.variant)
    assert reference.count("_load_in_shape(P['t8'], env['kv_idx'])") == 1
    assert reference.count("_load_in_shape(P[") == 1


def test_the_opt_stage_lists_the_bounds_checked_reads() -> None:
    from attnc.codegen.stages import emit_stage

    compiled, _ = compile_source(_variant("t8[kv_idx] + t8[kv_idx % 8]"), "v.attn")
    _, text = emit_stage(compiled[0], "opt")
    checked = [line.strip() for line in text.splitlines() if "bounds-checked read" in line]
    assert checked == ["bounds-checked read (0 outside the shape): t8[kv_idx]"]


def test_the_stdlib_and_the_examples_read_every_tensor_plainly() -> None:
    from attnc.codegen.functor import emit_functor

    paths = sorted(glob.glob(os.path.join(ROOT, "examples", "*.attn")))
    paths += [os.path.join(STDLIB_DIR, f"{n}.attn") for n in stdlib_names()]
    for path in paths:
        with open(path, encoding="utf-8") as f:
            compiled, _ = compile_source(f.read(), path)
        for c in compiled:
            cuda = emit_functor(c)
            assert "load_in_shape_" not in cuda, (path, c.variant.name)
            assert "kScoreReadsByKey" not in cuda, (path, c.variant.name)


def test_wrapping_i32_arithmetic_proves_nothing() -> None:
    # 2147483647 + 2147483647 + 2 wraps to 0 in i32: the index is kv_idx % 8, inside. No bound
    # may be drawn from the sum, so no error (a warning says the range is unknown).
    found = _index_warnings(_variant("t8[kv_idx % 8 + 2147483647 + 2147483647 + 2]"))
    assert len(found) == 1 and "has no upper bound" in found[0]
    # kv_idx * 4 wraps past 2**29 keys: its lower bound 0 does not hold.
    found = _index_warnings(_variant("t8[kv_idx * 4 + 2147483647]"))
    assert len(found) == 1


def test_nested_guards_do_not_blow_up() -> None:
    # Each let doubles the guard paths to the first read; the check must stay fast.
    lets = "".join(f"    let x{i + 1} = kv_idx < {i + 1} ? x{i} : x{i} + 0.5;\n" for i in range(40))
    text = (
        f"variant v {{\n    param t8: tensor<f32>[8];\n    let x0 = t8[kv_idx % 8];\n{lets}"
        "    score = score + x40;\n}\n"
    )
    assert _index_warnings(text) == []


def test_every_stdlib_variant_and_example_passes_quietly() -> None:
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "*.attn"))) + [
        os.path.join(STDLIB_DIR, f"{n}.attn") for n in stdlib_names()
    ]:
        with open(path, encoding="utf-8") as f:
            _, warnings = compile_source(f.read(), path)
        assert [w.message for w in warnings if "index" in w.message] == [], path


def test_a_difference_node_is_made_once_per_pair() -> None:
    # The interval memo is keyed by node ids: a difference made for a guard and then freed
    # could hand its id, and its memoised interval, to another expression.
    from attnc.compiler.index_bounds import Bounds

    bounds = Bounds(follow_guards=True)
    q_pos, kv_idx = ir.Builtin("q_pos", ir.I32), ir.Builtin("kv_idx", ir.I32)
    made = bounds.difference(q_pos, kv_idx)
    assert bounds.difference(ir.Builtin("q_pos", ir.I32), kv_idx) is made
    assert bounds.difference(kv_idx, q_pos) is not made


def test_bound_order() -> None:
    assert le((None, 0), ("num_qo_heads", -1))
    assert not le((None, 1), ("num_qo_heads", -1))
    assert le(("num_kv_heads", -1), ("num_qo_heads", -1))
    assert not le(("num_qo_heads", -1), ("num_kv_heads", -1))
    assert not le(("kv_len", 0), ("num_qo_heads", 0))
    # q_pos = q_idx + kv_len - q_len: negative for the first rows when q_len > kv_len, down to
    # 1 - MAX_QUERY_TOKENS (one key, the most queries).
    q_pos = Interval(frozenset([(None, 1 - MAX_QUERY_TOKENS)]), frozenset([("kv_len", -1)]))
    assert builtin_interval("q_pos") == q_pos
    assert builtin_interval(ir.OUTPUT_BUILTIN) == Interval()


# ---- Random index expressions against their values: a quiet index stays inside its dim, an
# error's index stays outside, on samples that include the sizes' extremes.

ATOMS = [
    "qo_head",
    "kv_head",
    "kv_idx",
    "q_idx",
    "q_pos",
    "num_qo_heads",
    "num_kv_heads",
    "kv_len",
    "q_len",
    "w",
    "0",
    "1",
    "2",
    "7",
    "8",
    "15",
    "16",
    "2147483647",
]
COMPARE = ["<", "<=", ">", ">=", "==", "!="]
COUNT = int(os.environ.get("ATTNC_INDEX_FUZZ_COUNT", "200"))


def _expr(rng, depth: int) -> str:
    if depth == 0 or rng.random() < 0.3:
        return rng.choice(ATOMS)
    a, b = _expr(rng, depth - 1), _expr(rng, depth - 1)
    form = rng.randrange(9)
    if form < 5:
        return f"({a} {'+-*/%'[form]} {b})"
    if form == 5:
        return f"{rng.choice(['min', 'max'])}({a}, {b})"
    if form == 6:
        return f"abs({a})" if rng.random() < 0.5 else f"(-{a})"
    if form == 7:
        return f"clamp({a}, {b}, {_expr(rng, depth - 1)})"
    return f"({a} {rng.choice(COMPARE)} {b} ? {_expr(rng, depth - 1)} : {_expr(rng, depth - 1)})"


def _samples(rng, n: int):
    for _ in range(n):
        nkv = rng.choice([1, 2, 8, 2**29])
        g = rng.choice([1, 2]) if nkv == 2**29 else rng.choice([1, 4, 7])
        # the runtime refuses a request of more keys than MAX_KV_TOKENS
        kv_len = rng.choice([1, 3, 64, 1000, MAX_KV_TOKENS - 1, MAX_KV_TOKENS])
        q_len = min(rng.choice([1, 2, kv_len, kv_len + 5, MAX_QUERY_TOKENS]), MAX_QUERY_TOKENS)
        qo = rng.randrange(nkv * g)
        q_idx = rng.choice([0, q_len - 1, rng.randrange(q_len)])
        yield {
            "num_qo_heads": nkv * g,
            "num_kv_heads": nkv,
            "qo_head": qo,
            "kv_head": qo // g,
            "kv_len": kv_len,
            "q_len": q_len,
            "kv_idx": rng.choice([0, kv_len - 1, rng.randrange(kv_len)]),
            "q_idx": q_idx,
            "q_pos": q_idx + kv_len - q_len,
            "batch": 0,
            "head_dim": 128,
            "sm_scale": 0.1,
            "score": 0.5,
            "w": rng.choice([0, 3, 8, -1, 2**31 - 1, -(2**31), rng.randrange(-(2**31), 2**31)]),
        }


def _verdict_and_read(index: str, tensor: str, monkeypatch):
    """``inside``, ``maybe`` or ``outside`` for ``tensor[index]``, and the lowered index
    (lowered with the check recorded rather than raised)."""
    from attnc.compiler import index_range, lower

    found: list[str] = []

    def recorded(v):
        try:
            warnings = index_range.check_indices(v)
        except AttnError:
            found.append("outside")
            return []
        found.append("maybe" if warnings else "inside")
        return []

    monkeypatch.setattr(lower, "check_indices", recorded)
    text = (
        "variant v {\n    param t8: tensor<f32>[8];\n    param heads: tensor<f32>[num_qo_heads];\n"
        "    param w: i32 = 0;\n"
        f"    score = score + float(w) + t8[0] + heads[0] + {tensor}[{index}];\n}}\n"
    )
    try:
        compiled, _ = compile_source(text, "v.attn")
    except AttnError:
        return None, None  # another check refused it (a literal out of i32, say)
    loads = [n for n in ir.walk(compiled[0].lowered.score) if isinstance(n, ir.TensorLoad)]
    return found[0], [n for n in loads if n.name == tensor][-1].indices[0]


@pytest.mark.parametrize("seed", range(4))
def test_random_indices_agree_with_their_values(seed: int, monkeypatch) -> None:
    import random

    from attnc.compiler.evaluate import evaluate

    rng = random.Random(seed)
    verdicts: dict[str, int] = {}
    for _ in range(COUNT):
        tensor = rng.choice(["t8", "heads"])
        e = _expr(rng, 3)
        e = rng.choice([e, e, f"{e} % 8", f"clamp({e}, 0, 7)", f"min({e}, 7)", f"{e} + 8"])
        verdict, index = _verdict_and_read(e, tensor, monkeypatch)
        if verdict is None:
            continue
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
        if verdict == "maybe":
            continue
        for env in _samples(rng, 60):
            value = evaluate(index, env, {})
            size = 8 if tensor == "t8" else env["num_qo_heads"]
            inside = 0 <= value < size
            assert inside == (verdict == "inside") or verdict == "maybe", (verdict, index, env)
    assert verdicts.get("inside", 0) >= 10 and verdicts.get("maybe", 0) >= 10, verdicts
    assert verdicts.get("outside", 0) >= 1, verdicts


def _cond(rng, depth: int) -> str:
    if depth == 0 or rng.random() < 0.5:
        a, b = _expr(rng, 1), _expr(rng, 1)
        if rng.random() < 0.5:  # the relative-position guards of windows and buckets
            a, b = (
                rng.choice(
                    ["q_pos - kv_idx", "kv_idx", "q_idx - kv_idx", "kv_idx + 8", "kv_idx + 3 + 5"]
                ),
                rng.choice(
                    ["0", "7", "8", "q_pos", "kv_idx", "w", "q_pos - 7", "w - 3", "q_pos - 4 - 3"]
                ),
            )
        return f"{a} {rng.choice(COMPARE)} {b}"
    form = rng.randrange(3)
    if form == 0:
        return f"!({_cond(rng, depth - 1)})"
    return f"({_cond(rng, depth - 1)} {'&&' if form == 1 else '||'} {_cond(rng, depth - 1)})"


@pytest.mark.parametrize("seed", range(3))
def test_random_guarded_reads_agree_with_their_values(seed: int, monkeypatch) -> None:
    """A read proven only under its guard: wherever the guard holds, the index is inside."""
    import random

    from attnc.compiler import index_range, lower
    from attnc.compiler.evaluate import evaluate

    monkeypatch.setattr(lower, "check_indices", lambda v: [])
    rng = random.Random(100 + seed)
    proven_count = 0
    for _ in range(COUNT):
        index = rng.choice([_expr(rng, 2), "q_pos - kv_idx", "kv_idx", "q_idx - kv_idx"])
        text = (
            "variant v {\n    param t8: tensor<f32>[8];\n    param w: i32 = 0;\n"
            f"    score = score + float(w) + ({_cond(rng, 2)} ? t8[{index}] : 0.0);\n}}\n"
        )
        try:
            compiled, _ = compile_source(text, "v.attn")
        except AttnError:
            continue
        v = compiled[0].lowered
        selects = [n for n in ir.walk(v.score) if isinstance(n, ir.Select)]
        load = selects[-1].a
        if not isinstance(load, ir.TensorLoad) or load not in index_range.proven_loads(v):
            continue
        proven_count += 1
        for env in _samples(rng, 60):
            holds = evaluate(selects[-1].cond, env, {})
            value = evaluate(load.indices[0], env, {})
            assert not holds or 0 <= value < 8, (text, env, value)
    assert proven_count >= 3
