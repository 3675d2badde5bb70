"""Every variant of examples/*.attn on the GPU, as the standard library's are tested: batched
prefill (ragged and paged; FA2 and the Hopper template, the latter at head_dim 64 and 128),
batched decode, and CUDA-graph replay after a re-plan with new param values, each request
against the float64 reference (tests/batch_check.py); and the example scripts run their
kernels against their references.

Params are drawn per variant from its declarations: tensors per head, per request
(``batch_size``) or per token (``kv_len``/``q_len``, flattened over the batch as ``run()`` takes
them); integer scalars get values short enough for their masks to bite at these lengths.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from batch_check import check_batch, offsets, paged_cache, plan_and_run

import attnc
from attnc.compiler import ir
from attnc.compiler.pipeline import compile_source, resolve_source
from attnc.runtime.wrappers.decode import BatchDecodeWrapper
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
HQ, HKV = 8, 2
Q_LENS, KV_LENS = [17, 1, 577, 300, 64], [17, 300, 1200, 300, 2049]
WORKSPACE = 64 << 20
I32 = dict(dtype=torch.int32)


def _example_variants() -> list[tuple[str, str]]:
    """(file name, variant name) of every variant the example specs define."""
    found = []
    for path in sorted(EXAMPLES.glob("*.attn")):
        compiled, _ = compile_source(*resolve_source(str(path)))
        found += [(path.name, c.variant.name) for c in compiled]
    return found


VARIANTS = _example_variants()
IDS = [name for _, name in VARIANTS]


def _load(spec: tuple[str, str]):
    return attnc.load(str(EXAMPLES / spec[0]), spec[1])


def _tensor(p: ir.ParamDecl, q_lens, kv_lens, gen):
    """A batch value of tensor param ``p`` and its slice for request i."""
    sizes = {"num_qo_heads": HQ, "num_kv_heads": HKV}
    token = p.token_dim
    rest = [d if isinstance(d, int) else sizes[d] for d in (p.dims[1:] if token else p.dims)]
    if token in ("kv_len", "q_len"):  # document ids: sorted runs per request
        lens = kv_lens if token == "kv_len" else q_lens
        runs = [torch.randint(0, 4, (n, *rest), generator=gen, **I32).sort(0).values for n in lens]
        starts = offsets(lens)
        value = torch.cat(runs).cuda()
        return value, lambda i: value[starts[i] : starts[i + 1]]
    if token == "batch_size":  # per-request windows and prefix lengths
        value = torch.randint(1, 300, (len(kv_lens), *rest), generator=gen, **I32).cuda()
        return value, lambda i: value[i : i + 1]
    if p.dtype == ir.F32:
        value = (torch.randn(rest, generator=gen) * 0.5).cuda()
    else:
        value = torch.randint(0, 8, rest, generator=gen, **I32).cuda()
    return value, lambda i: value


def _scalar(p: ir.ParamDecl, rng: random.Random):
    """A value for scalar ``p``, or None to keep its default (float and bool defaults)."""
    if p.dtype == ir.I32:
        return rng.randint(16, 200)  # windows, chunks: shorter than most requests here
    if p.default is not None:
        return None
    return rng.uniform(0.5, 30.0) if p.dtype == ir.F32 else True


def _params(variant, q_lens, kv_lens, seed):
    """(batch values, request i's values) of every param of ``variant``."""
    gen, rng = torch.Generator().manual_seed(seed), random.Random(seed)
    batch, slices = {}, {}
    for p in variant.ir.params:
        if p.kind == "tensor":
            batch[p.name], slices[p.name] = _tensor(p, q_lens, kv_lens, gen)
        elif (value := _scalar(p, rng)) is not None:
            batch[p.name] = value
            slices[p.name] = lambda i, value=value: value
    return batch, lambda i: {name: take(i) for name, take in slices.items()}


def _inputs(gen, q_lens, kv_lens, head_dim):
    def draw(n, heads):
        return torch.randn(n, heads, head_dim, generator=gen).to("cuda", torch.bfloat16)

    return draw(sum(q_lens), HQ), draw(sum(kv_lens), HKV), draw(sum(kv_lens), HKV)


def _skip_without_hopper(backend):
    if backend == "sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper template needs sm_90")


# (backend, head_dim): head_dim 64 on the Hopper template only, whose shape there (three
# consumer warpgroups on 128-key stages for light variants) differs from 128's; FA2's kernel is
# the same template at both.
KERNELS = [("fa2", 128), ("sm90", 64), ("sm90", 128)]


@pytest.mark.parametrize(("backend", "head_dim"), KERNELS, ids=[f"{b}-d{d}" for b, d in KERNELS])
@pytest.mark.parametrize("layout", ["ragged", "paged16"])
@pytest.mark.parametrize("spec", VARIANTS, ids=IDS)
def test_example_batch_prefill(spec, layout, backend, head_dim):
    _skip_without_hopper(backend)
    variant = _load(spec)
    gen = torch.Generator().manual_seed(11)
    q, k, v = _inputs(gen, Q_LENS, KV_LENS, head_dim)
    batch, one = _params(variant, Q_LENS, KV_LENS, seed=12)
    ws = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
    w = BatchPrefillWrapper(variant, ws, backend=backend)
    o, lse = plan_and_run(w, layout, q, k, v, Q_LENS, KV_LENS, (HQ, HKV), head_dim, gen, batch)
    check_batch(variant, q, k, v, o, lse, Q_LENS, KV_LENS, one)


@pytest.mark.parametrize("q_len", [1, 4])
@pytest.mark.parametrize("spec", VARIANTS, ids=IDS)
def test_example_batch_decode(spec, q_len):
    variant = _load(spec)
    gen = torch.Generator().manual_seed(13)
    kv_lens = [300, 17, 2049, 129]
    q_lens = [q_len] * len(kv_lens)
    q, k, v = _inputs(gen, q_lens, kv_lens, 128)
    batch, one = _params(variant, q_lens, kv_lens, seed=14)
    cache, indptr, idx, last = paged_cache(k, v, kv_lens, 16, gen)
    w = BatchDecodeWrapper(variant, torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda"))
    token = {p.name for p in variant.ir.params if p.token_dim in ("kv_len", "q_len")}
    plan_params = {name: value for name, value in batch.items() if name not in token}
    w.plan(indptr, idx, last, HQ, HKV, 128, 16, q_len_per_request=q_len, params=plan_params)
    o, lse = w.run(q, cache, return_lse=True, **batch)
    check_batch(variant, q, k, v, o, lse, q_lens, kv_lens, one)


@pytest.mark.parametrize("backend", ["fa2", "sm90"])
@pytest.mark.parametrize("spec", VARIANTS, ids=IDS)
def test_example_graph_replay_after_replan(spec, backend):
    """run() captured in a CUDA graph; the per-head and per-token param tensors are
    overwritten in place with another draw's values and the batch re-planned with them (a new
    tile map for masks that read tokens); the replay computes with the new values. Scalars and
    per-request tensors keep theirs: they set the plan's KV ranges, so new values may change
    the launch's shape, which a replay cannot follow (same lengths here: the shape stays)."""
    _skip_without_hopper(backend)
    variant = _load(spec)
    gen = torch.Generator().manual_seed(15)
    q_lens, kv_lens = [300, 64, 129], [300, 700, 129]
    q, k, v = _inputs(gen, q_lens, kv_lens, 128)
    batch, _ = _params(variant, q_lens, kv_lens, seed=16)
    fresh, one = _params(variant, q_lens, kv_lens, seed=17)
    qo, kv = torch.tensor(offsets(q_lens), **I32), torch.tensor(offsets(kv_lens), **I32)
    ws = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
    w = BatchPrefillWrapper(variant, ws, backend=backend)
    w.plan(qo, kv, HQ, HKV, 128, params=batch)
    out = torch.empty_like(q)
    w.run(q, (k, v), out=out, **batch)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        w.run(q, (k, v), out=out, **batch)
    torch.cuda.current_stream().wait_stream(stream)
    meta = list(w._meta)
    kept = {}
    for p in variant.ir.params:
        if p.kind == "tensor" and p.token_dim != "batch_size":
            batch[p.name].copy_(fresh[p.name])
        elif p.name in batch:
            kept[p.name] = batch[p.name] if p.kind == "scalar" else batch[p.name].clone()
    w.plan(qo, kv, HQ, HKV, 128, params=batch)
    assert w._meta == meta, "the re-plan changed the launch: the graph would replay stale args"
    graph.replay()
    torch.cuda.synchronize()
    _, lse = w.run(q, (k, v), return_lse=True, **batch)

    def request(i):
        values = one(i)
        for name, value in kept.items():
            values[name] = value[i : i + 1] if isinstance(value, torch.Tensor) else value
        return values

    check_batch(variant, q, k, v, out, lse, q_lens, kv_lens, request)


SCRIPTS = {
    "gpt_oss.py": "CUDA bf16 vs reference",
    "packed_documents.py": "CUDA BatchPrefillWrapper vs reference",
    "prefix_lm_windows.py": "CUDA BatchPrefillWrapper (whole batch) vs reference",
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_example_script_runs_its_kernels(script):
    path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))  # keep the caller's packages
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, env=env,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert SCRIPTS[script] in proc.stdout
    assert "the kernels were not run" not in proc.stdout
