"""The Hopper (sm_90a) prefill module of every stdlib variant against the float64 reference and
against the FA2 module, run through BatchPrefillWrapper with only the module swapped (same C
ABI, same plan code): ragged batches with odd lengths, GQA, split-KV partial rows with the
merge, paged KV (NHD/HND, page sizes 1 to 256; TMA boxes per page), head_dim 64/128/256, bf16
and fp16.

Accuracy rule as in test_prefill.py: ||o - ref64|| / ||ref64|| <= 3 * (same error of the
eager reference in the kernel's dtype) + 2e-4 (the floor test_prefill.py re-derived after the
reference began to accumulate 16-bit inputs in float32).
"""

from __future__ import annotations

import math
import os

import pytest
import torch

import attnc
from attnc.runtime.build import jit, modules
from attnc.runtime.wrappers import prefill as prefill_wrapper
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("the Hopper template needs an sm_90 GPU", allow_module_level=True)

VARIANTS = ["vanilla", "causal", "softcap", "alibi", "sliding_window", "sigmoid", "prefix_lm"]
SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16"}
# (variant, dtype, head_dim) of every module the tests use, built in one parallel batch.
CONFIGS = [(v, torch.bfloat16, d) for d in (128, 64) for v in VARIANTS] + [
    ("causal", torch.float16, 64),
    ("causal", torch.bfloat16, 256),
    ("alibi", torch.float16, 256),
    ("sliding_window", torch.float16, 64),
    ("sliding_window", torch.bfloat16, 256),
    ("softcap", torch.float16, 256),
]


# Extra nvcc flags for the Hopper modules (test_sm90_producer_lag.py reruns some of these tests
# with a fault injected into the kernel this way).
SM90_FLAGS = tuple(os.environ.get("ATTNC_TEST_SM90_FLAGS", "").split())


def _sources(name: str, dtype: torch.dtype, head_dim: int) -> list[jit.ModuleSpec]:
    from attnc.codegen.module import render_prefill_module, render_prefill_sm90_module

    ir = attnc.load(f"stdlib:{name}").ir
    dname = modules.dtype_name(dtype)
    tag = f"{ir.name}_{SHORT[dtype]}_d{head_dim}"
    fa2_flags = modules.prefill_arch_flags("90a")
    return [
        jit.ModuleSpec(f"{ir.name}_sm90t_{SHORT[dtype]}_d{head_dim}",
                       render_prefill_sm90_module(ir, dname, head_dim), SM90_FLAGS),
        jit.ModuleSpec(f"{tag}_fa2t", render_prefill_module(ir, dname, head_dim), fa2_flags),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def built() -> dict[tuple[str, str, int, str], modules.PrefillModule]:
    """Both modules of every config, built in parallel, loaded through the prefill registry."""
    specs = [s for c in CONFIGS for s in _sources(*c)]
    paths = jit.build_modules(specs, arch="90a")
    out = {}
    pairs = list(zip(paths[::2], paths[1::2], strict=True))
    for (name, dtype, d), (p_sm90, p_fa2) in zip(CONFIGS, pairs, strict=True):
        ir = attnc.load(f"stdlib:{name}").ir
        for kind, path in (("sm90", p_sm90), ("fa2", p_fa2)):
            out[(name, SHORT[dtype], d, kind)] = modules.load_prefill_module(
                path, ir, f"{ir.name}_{kind}_{SHORT[dtype]}_d{d}"
            )
    return out


def _use_module(monkeypatch, module: modules.PrefillModule) -> None:
    """Make BatchPrefillWrapper.plan pick `module` (whichever selection hook it calls)."""
    if hasattr(prefill_wrapper, "choose_prefill_module"):
        from attnc.runtime.build.backends import PrefillChoice

        def choose(ir, backend, *, head_dim, group, max_q_len, **_):
            tile = module.tile_q_tokens(head_dim, group, max_q_len)
            return PrefillChoice("sm90" if "_sm90" in module.name else "fa2", module, tile)

        monkeypatch.setattr(prefill_wrapper, "choose_prefill_module", choose)
    else:
        monkeypatch.setattr(prefill_wrapper, "get_prefill_module", lambda *a, **k: module)


def _params(name: str, num_qo_heads: int, kv_len: int) -> dict[str, object]:
    if name == "softcap":
        return {"cap": 30.0}
    if name == "alibi":
        h = torch.arange(num_qo_heads, dtype=torch.float64)
        return {"slopes": (2.0 ** (-8.0 * (h + 1) / num_qo_heads)).float().cuda()}
    if name == "sliding_window":
        return {"window": 64 if kv_len > 64 else 1}
    if name == "sigmoid":
        return {"bias": -1.0}
    if name == "prefix_lm":
        return {"prefix_len": kv_len // 3}
    return {}


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _paged(k, v, page_size, layout, gen):
    """k/v [kv_len, H, D] scattered into a shuffled cache; returns cache, page ids, last len."""
    kv_len, h, d = k.shape
    pages = max(1, math.ceil(kv_len / page_size))
    total = pages + 3
    perm = torch.randperm(total, generator=gen)[:pages]
    cache = torch.full((total, 2, page_size, h, d), float("nan"), dtype=k.dtype, device="cuda")
    kp = torch.zeros(pages * page_size, h, d, dtype=k.dtype, device="cuda")
    vp = torch.zeros_like(kp)
    kp[:kv_len], vp[:kv_len] = k, v
    cache[perm.cuda(), 0] = kp.view(pages, page_size, h, d)
    cache[perm.cuda(), 1] = vp.view(pages, page_size, h, d)
    if layout == "HND":
        cache = cache.transpose(2, 3).contiguous()
    return cache, perm.to(torch.int32), kv_len - (pages - 1) * page_size


def _run(module, monkeypatch, name, qs, ks, vs, params, layout="ragged", page_size=1, gen=None):
    """One batch through the wrapper with `module`; returns (O, LSE, plan)."""
    monkeypatch.undo()
    _use_module(monkeypatch, module)
    variant = attnc.load(f"stdlib:{name}")
    i32 = dict(dtype=torch.int32)
    qo = torch.tensor([0, *torch.tensor([q.shape[0] for q in qs]).cumsum(0).tolist()], **i32)
    q = torch.cat(qs)
    hq, hkv, d = q.shape[1], ks[0].shape[1], q.shape[2]
    ws = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    out = torch.full_like(q, float("nan"))
    if layout == "ragged":
        kvi = torch.tensor([0, *torch.tensor([k.shape[0] for k in ks]).cumsum(0).tolist()], **i32)
        w = BatchPrefillWrapper(variant, ws)
        w.plan(qo, kvi, hq, hkv, d, dtype=q.dtype)
        o, lse = w.run(q, (torch.cat(ks), torch.cat(vs)), return_lse=True, out=out, **params)
        return o, lse, w._plan
    assert len(qs) == 1, "paged runs take one request"
    cache, idx, last = _paged(ks[0], vs[0], page_size, layout, gen)
    w = BatchPrefillWrapper(variant, ws, kv_layout=layout)
    w.plan(
        qo, torch.tensor([0, idx.numel()], **i32), hq, hkv, d, kv_indices=idx,
        kv_last_page_len=torch.tensor([last], **i32), page_size=page_size, dtype=q.dtype,
    )  # fmt: skip
    o, lse = w.run(q, cache, return_lse=True, out=out, **params)
    return o, lse, w._plan


def _check(built, monkeypatch, name, dtype, d, group, lens, layout="ragged", page_size=1):
    """Hopper module vs fp64 reference and vs FA2 on one batch; returns the Hopper plan."""
    gen = torch.Generator().manual_seed(sum(a * 31 + b for a, b in lens) + d + group)
    hkv = 2 if group < 8 else 1
    hq = hkv * group
    qs = [torch.randn(a, hq, d, generator=gen).to("cuda", dtype) for a, _ in lens]
    ks = [torch.randn(b, hkv, d, generator=gen).to("cuda", dtype) for _, b in lens]
    vs = [torch.randn(b, hkv, d, generator=gen).to("cuda", dtype) for _, b in lens]
    params = _params(name, hq, max(b for _, b in lens))
    key = (name, SHORT[dtype], d)
    o, lse, plan = _run(built[(*key, "sm90")], monkeypatch, name, qs, ks, vs, params, layout,
                        page_size, gen)  # fmt: skip
    o2, lse2, _ = _run(built[(*key, "fa2")], monkeypatch, name, qs, ks, vs, params, layout,
                       page_size, gen)  # fmt: skip
    variant = attnc.load(f"stdlib:{name}")
    start = 0
    for q, k, v in zip(qs, ks, vs, strict=True):
        end = start + q.shape[0]
        ref, ref_lse = variant.reference(q.double(), k.double(), v.double(), return_lse=True,
                                         **params)  # fmt: skip
        eager = variant.reference(q, k, v, **params)
        bound = 3 * _rel_err(eager, ref) + 2e-4
        got = o[start:end]
        assert not torch.isnan(got).any(), "NaN in the Hopper output"
        assert _rel_err(got, ref) <= bound, (_rel_err(got, ref), bound)
        assert _rel_err(got, o2[start:end].double()) <= 2 * bound, "Hopper and FA2 disagree"
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse[start:end]), finite)
        if finite.any():
            torch.testing.assert_close(lse[start:end][finite].double(), ref_lse[finite],
                                       atol=2e-2, rtol=1e-3)  # fmt: skip
            torch.testing.assert_close(lse[start:end][finite], lse2[start:end][finite],
                                       atol=2e-3, rtol=1e-4)  # fmt: skip
        start = end
    return plan


@pytest.mark.parametrize("name", VARIANTS)
def test_ragged_batch_odd_lengths(built, monkeypatch, name):
    lens = [(1, 1), (17, 17), (127, 577), (577, 577), (1, 127)]
    _check(built, monkeypatch, name, torch.bfloat16, 128, 4, lens)


@pytest.mark.parametrize("d", [128, 256])
def test_many_tma_tiles_then_a_gathered_tail(built, monkeypatch, d):
    """More full (TMA) tiles than pipeline stages before a ragged tail (cp.async): the producer
    threads that do not issue TMA must not run a pipeline round ahead of the barriers."""
    _check(built, monkeypatch, "causal", torch.bfloat16, d, 4, [(1, 1999), (577, 577)])


@pytest.mark.parametrize("name", ["causal", "sliding_window", "sigmoid", "prefix_lm"])
def test_split_kv_partial_rows_and_merge(built, monkeypatch, name):
    plan = _check(built, monkeypatch, name, torch.bfloat16, 128, 1, [(17, 4099)])
    assert plan.schedule.num_merge > 0, "the plan was expected to split the long KV range"


@pytest.mark.parametrize("group", [1, 3, 8])
def test_gqa_groups(built, monkeypatch, group):
    _check(built, monkeypatch, "alibi", torch.bfloat16, 128, group, [(127, 577), (33, 33)])


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", ["causal", "softcap"])
def test_paged(built, monkeypatch, name, page_size, layout):
    _check(built, monkeypatch, name, torch.bfloat16, 128, 4, [(577, 1153)], layout, page_size)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [8, 64, 128, 256, 24])
def test_paged_tma_boxes(built, monkeypatch, page_size, layout):
    """Paged KV by TMA boxes of the largest power of two dividing both the page and the
    128-key stage (8 to 128 keys: one box per page; 256: one box per tile inside a page; 24:
    8-key boxes, three to a page); the unused pages hold NaN."""
    _check(built, monkeypatch, "causal", torch.bfloat16, 128, 4, [(577, 1153)], layout, page_size)
    _check(built, monkeypatch, "sliding_window", torch.bfloat16, 128, 4, [(300, 1153)], layout,
           page_size)  # fmt: skip


@pytest.mark.parametrize(
    "name, dtype, d",
    [("causal", torch.float16, 64), ("sliding_window", torch.float16, 64),
     ("causal", torch.bfloat16, 256), ("alibi", torch.float16, 256),
     ("sliding_window", torch.bfloat16, 256), ("softcap", torch.float16, 256)],
)  # fmt: skip
def test_head_dims_and_dtypes(built, monkeypatch, name, dtype, d):
    _check(built, monkeypatch, name, dtype, d, 4, [(577, 577), (17, 127)])
    _check(built, monkeypatch, name, dtype, d, 2, [(127, 2049)], "NHD", 16)


# At head_dim 64 and 128 these run three consumer warpgroups (192 packed rows) in plans whose
# longest query has at least 2048 tokens; the rest (and shorter plans) run two.
THREE_CONSUMERS = {"vanilla", "causal", "softcap", "sliding_window", "prefix_lm"}
LONG = 2048  # kThreeConsumersMinQ


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("name", VARIANTS)
def test_every_variant_with_a_long_query(built, monkeypatch, name, d):
    """Every variant at head_dim 64 and 128 in a plan whose longest query takes the
    three-consumer shape where the variant has one: odd lengths next to the long request."""
    m = built[(name, "bf16", d, "sm90")]
    rows = 192 if name in THREE_CONSUMERS or (name, d) == ("alibi", 128) else 128
    assert [m.tile_q_tokens(d, g, LONG) for g in (1, 3, 4, 8)] == [rows // g for g in (1, 3, 4, 8)]
    assert [m.tile_q_tokens(d, g, LONG - 1) for g in (1, 3, 4, 8)] == [128, 42, 32, 16]
    lens = [(1, 1), (17, 17), (127, 577), (LONG, LONG), (1, 127)]
    _check(built, monkeypatch, name, torch.bfloat16, d, 4, lens)


@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("name", ["causal", "softcap", "alibi"])
def test_three_consumers_groups_paged_and_split(built, monkeypatch, name, group):
    """The 192-row tile (head_dim 64 and 128; ALiBi's at 128 only, with its bias in the QK
    GEMM) with GQA groups 1, 3 and 8 (192, 64 and 24 tokens an item), paged KV through TMA
    boxes and cp.async gathers, and split KV ranges."""
    for d in (64, 128):
        _check(built, monkeypatch, name, torch.bfloat16, d, group, [(LONG, LONG), (33, 33)])
        _check(built, monkeypatch, name, torch.bfloat16, d, group, [(LONG, LONG + 99)], "NHD", 16)
        _check(built, monkeypatch, name, torch.bfloat16, d, group, [(LONG + 1, LONG + 1)], "HND", 5)
    if group == 1:
        plan = _check(built, monkeypatch, name, torch.bfloat16, 64, 1, [(LONG, 4 * LONG)])
        assert plan.schedule.num_merge > 0, "the plan was expected to split the long KV range"


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [32, 64, 48, 8])
@pytest.mark.parametrize("d", [128, 256])
def test_80_key_stages_with_pages_that_do_not_tile_them(built, monkeypatch, d, page_size, layout):
    """80-key stages (three consumers at head_dim 128; causal and windows at 256): pages of
    32, 64 and 48 keys load by 16-key TMA boxes (several to a page), 8-key pages by 8-key
    boxes."""
    for name in ("causal", "sliding_window"):
        _check(built, monkeypatch, name, torch.bfloat16, d, 4, [(LONG, LONG + 37)], layout,
               page_size)  # fmt: skip


def test_tile_and_occupancy_answers(built):
    m = built[("causal", "bf16", 128, "sm90")]
    assert [m.tile_q_tokens(128, g, 1) for g in (1, 3, 4, 8)] == [128, 42, 32, 16]
    assert [m.tile_q_tokens(128, g, 8192) for g in (1, 3, 4, 8)] == [192, 64, 48, 24]
    assert m.tile_q_tokens(64, 4, 1) == 0  # wrong head_dim
    assert m.ctas_per_sm(128, 4, 8192) == 1
    m = built[("sigmoid", "bf16", 128, "sm90")]  # two consumer warpgroups only: 128 rows
    assert [m.tile_q_tokens(128, g, 8192) for g in (1, 3, 4, 8)] == [128, 42, 32, 16]
    m = built[("alibi", "bf16", 128, "sm90")]  # its bias in the QK GEMM on three: 192 rows
    assert [m.tile_q_tokens(128, g, 8192) for g in (1, 3, 4, 8)] == [192, 64, 48, 24]


def test_a_variant_that_spills_with_three_consumers_takes_two():
    from spilling_variant import SOURCE  # spills with three consumers at head_dim 64

    variant = attnc.load(source=SOURCE)
    m = modules.get_prefill_sm90_module(variant.ir, torch.float16, 64)
    for max_q in (1, LONG, 2 * LONG):
        assert [m.tile_q_tokens(64, g, max_q) for g in (1, 3, 4, 8)] == [128, 42, 32, 16]
    assert m.ctas_per_sm(64, 4, LONG) == 1
    gen = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = (
        torch.randn(n, h, 64, device="cuda", dtype=torch.float16, generator=gen)
        for n, h in ((LONG + 3, 8), (LONG + 3, 2), (LONG + 3, 2))
    )
    out = variant.prefill(q, k, v, backend="sm90")
    ref64 = variant.reference(q.double(), k.double(), v.double())
    ref16 = variant.reference(q, k, v)
    assert torch.isfinite(out).all()
    assert _rel_err(out, ref64) <= 3 * _rel_err(ref16, ref64) + 2e-4


def test_items_past_a_requests_queries_are_skipped(built, monkeypatch):
    """A plan lists query tiles the device's qo_indptr no longer covers (here: the request's
    query length cut from 2048 to 1000 in the workspace after plan()): CTAs whose first item,
    or a later one, lies past the queries skip it (the producer publishes one empty stage that
    names the next item). The rows still covered come out bit for bit as before, and the rows
    past them are not written. (test_lang_v2.py does the same under the dynamic item fetch.)"""
    _use_module(monkeypatch, built[("vanilla", "bf16", 128, "sm90")])
    gen = torch.Generator().manual_seed(11)
    hq, hkv, d, nq, nkv, cut = 32, 8, 128, 2048, 256, 1000
    q = torch.randn(nq, hq, d, generator=gen).to("cuda", torch.bfloat16)
    k = torch.randn(nkv, hkv, d, generator=gen).to("cuda", torch.bfloat16)
    v = torch.randn(nkv, hkv, d, generator=gen).to("cuda", torch.bfloat16)
    ws = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    w = BatchPrefillWrapper(attnc.load("stdlib:vanilla"), ws)
    w.plan(torch.tensor([0, nq], dtype=torch.int32), torch.tensor([0, nkv], dtype=torch.int32),
           hq, hkv, d, dtype=torch.bfloat16)  # fmt: skip
    result = w._plan.result
    assert result.num_items > 132 and result.num_merge == 0, "needs many unsplit items"
    full = w.run(q, (k, v)).clone()
    at = w._plan.layout.offsets["qo_indptr"]
    ws[at : at + 8].view(torch.int32).copy_(torch.tensor([0, cut], dtype=torch.int32))
    out = torch.full_like(full, float("nan"))
    w.run(q, (k, v), out=out)
    torch.cuda.synchronize()
    assert torch.equal(out[:cut], full[:cut])
    assert out[cut:].isnan().all()
