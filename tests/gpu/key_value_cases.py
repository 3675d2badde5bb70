"""Variants with key values (``V::KeyValues``: what the score and mask compute from the key
alone) and their params, shared by the GPU tests of the kernels that stage them
(test_staged_keys.py: both templates on Hopper; test_fa2_staged_keys.py: every FA2 shape).
The variants cover one field (an i32 document id), two (a bias and a document id: one 16-byte
load per pair of keys), three and eight reads summed into the score (one value a key), eight
separate conditions (32 bytes a key), a score that is not affine in S (the log2 form), and one
without softmax (the raw form)."""

from __future__ import annotations

import torch
from batch_check import offsets, paged_cache

SOURCES = {
    "doc": """variant doc {
        param doc: tensor<i32>[kv_len];
        mask = kv_idx <= q_pos && doc[kv_idx] == doc[q_pos];
    }""",
    "bias_and_doc": """variant bias_and_doc {
        param bias: tensor<f32>[kv_len];
        param doc: tensor<i32>[kv_len];
        score = score + bias[kv_idx];
        mask = kv_idx <= q_pos && doc[kv_idx] == doc[q_pos];
    }""",
    "three_reads": """variant three_reads {
        param t: tensor<f32>[64];
        param idx: tensor<i32>[kv_len];
        score = score + t[kv_idx % 64] * 0.5 + t[idx[kv_idx]] * 0.25;
        mask = kv_idx <= q_pos;
    }""",
    "scaled_by_key": """variant scaled_by_key {
        param t: tensor<f32>[64];
        score = score * t[kv_idx % 64];
        mask = kv_idx <= q_pos;
    }""",
    "eight_reads": """variant eight_reads {
        param t: tensor<f32>[64];
        score = score + EIGHT;
        mask = kv_idx <= q_pos;
    }""".replace("EIGHT", " + ".join(f"t[(kv_idx + {i}) % 64] * 0.25" for i in range(8))),
    "eight_terms": """variant eight_terms {
        param t: tensor<f32>[64];
        mask = kv_idx <= q_pos && EIGHT;
    }""".replace("EIGHT", " && ".join(f"t[(kv_idx + {i}) % 64] > -2.0" for i in range(8))),
    "sigmoid_by_key": """variant sigmoid_by_key {
        param t: tensor<f32>[kv_len];
        normalize = none;
        score = sigmoid(score + t[kv_idx]);
        mask = kv_idx <= q_pos;
    }""",
}
FIELDS = {"doc": 1, "bias_and_doc": 2, "three_reads": 1, "scaled_by_key": 1, "eight_reads": 1,
          "eight_terms": 8, "sigmoid_by_key": 1}  # fmt: skip


def _documents(kv_lens: list[int], gen: torch.Generator) -> torch.Tensor:
    parts = []
    for n in kv_lens:
        ids = torch.zeros(n, dtype=torch.int32)
        for cut in torch.randint(0, n, (3,), generator=gen).tolist():
            ids[cut:] += 1
        parts.append(ids)
    return torch.cat(parts)


def params_for(name: str, kv_lens: list[int], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Seeded CUDA tensors for variant ``name`` of SOURCES over a batch of ``kv_lens`` keys."""
    total = sum(kv_lens)
    params = {
        "doc": {"doc": _documents(kv_lens, gen)},
        "bias_and_doc": {
            "bias": torch.randn(total, generator=gen),
            "doc": _documents(kv_lens, gen),
        },
        "three_reads": {
            "t": torch.randn(64, generator=gen),
            "idx": torch.randint(-8, 72, (total,), generator=gen, dtype=torch.int32),
        },
        "scaled_by_key": {"t": torch.rand(64, generator=gen) * 2.0},
        "eight_reads": {"t": torch.randn(64, generator=gen)},
        "eight_terms": {"t": torch.randn(64, generator=gen)},
        "sigmoid_by_key": {"t": torch.randn(total, generator=gen) - 6.0},
    }[name]
    return {k: t.cuda() for k, t in params.items()}


def per_request(params: dict[str, torch.Tensor], kv_lens: list[int]):
    """The params of request i: per-token tensors sliced to its keys."""
    starts = offsets(kv_lens)

    def one(i: int) -> dict[str, torch.Tensor]:
        return {
            k: t[starts[i] : starts[i + 1]] if t.shape[0] == starts[-1] else t
            for k, t in params.items()
        }

    return one


def plan_and_run(w, q, k, v, q_lens, kv_lens, layout: str, params, gen: torch.Generator):
    """Plans and runs wrapper ``w`` over the batch: ragged KV, or KV paged by N pages of
    ``layout`` "pagedN" (shuffled, batch_check.paged_cache); returns (o, lse)."""
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    i32 = dict(dtype=torch.int32)
    qo = torch.tensor(offsets(q_lens), **i32)
    if layout == "ragged":
        w.plan(qo, torch.tensor(offsets(kv_lens), **i32), hq, hkv, d, params=params)
        return w.run(q, (k, v), return_lse=True, **params)
    page = int(layout.removeprefix("paged"))
    cache, indptr, ids, last = paged_cache(k, v, kv_lens, page, gen)
    w.plan(qo, indptr, hq, hkv, d, kv_indices=ids, kv_last_page_len=last, page_size=page,
           params=params)  # fmt: skip
    return w.run(q, cache, return_lse=True, **params)
