"""FlashInfer (0.5.x) as an anchor: single prefill, paged batch prefill, paged decode."""

from __future__ import annotations

from benchmarks.outcome import Missing, Unsupported
from benchmarks.system import Prepared, System, workspace


def flashinfer():
    """Import flashinfer, or raise Missing with the reason."""
    try:
        import flashinfer as fi
    except Exception as exc:
        raise Missing(f"flashinfer: {type(exc).__name__}") from exc
    return fi


def variant_kwargs(variant, backend: str = "fa2") -> dict:
    """FlashInfer's keywords for a stdlib variant, or Unsupported."""
    stdlib = variant.stdlib
    if stdlib in ("sigmoid", "prefix_lm"):
        raise Unsupported("custom variant only")
    if stdlib == "alibi" and backend == "fa3":
        raise Unsupported("no FA3 ALiBi")
    kwargs: dict = {"pos_encoding_mode": "ALIBI" if stdlib == "alibi" else "NONE"}
    if stdlib == "softcap":
        kwargs["logits_soft_cap"] = float(variant.scalar_params["cap"])
    if variant.mask.kind == "window":
        kwargs["window_left"] = variant.mask.window - 1
    return kwargs


class FlashInferSingle(System):
    """``single_prefill_with_kv_cache`` with backend fa2 or fa3."""

    def __init__(self, backend: str):
        self.backend = backend
        self.name = f"flashinfer_{backend}"

    def prepare(self, case, data) -> Prepared:
        """Keywords for the variant; inputs are used as they are (NHD)."""
        fi = flashinfer()
        kwargs = variant_kwargs(case.variant, self.backend)
        causal = case.variant.mask.kind != "none"

        def run():
            return fi.single_prefill_with_kv_cache(
                data.q, data.k, data.v, causal=causal, backend=self.backend, **kwargs
            )

        return Prepared(run)


class FlashInferBatchPrefill(System):
    """``BatchPrefillWithPagedKVCacheWrapper`` (causal) with backend fa2 or fa3."""

    def __init__(self, backend: str):
        self.backend = backend
        self.name = f"flashinfer_{backend}"

    def prepare(self, case, data) -> Prepared:
        """Create the wrapper with its own workspace and plan it."""
        import torch

        fi = flashinfer()
        kwargs = variant_kwargs(case.variant, self.backend)
        wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD", backend=self.backend)
        wrapper.plan(
            data.qo_indptr,
            data.kv_indptr,
            data.kv_indices,
            data.kv_last_page_len,
            case.num_qo_heads,
            case.num_kv_heads,
            case.head_dim,
            case.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.bfloat16,
            **kwargs,
        )
        return Prepared(lambda: wrapper.run(data.q, data.cache))


class FlashInferDecode(System):
    """``BatchDecodeWithPagedKVCacheWrapper`` with tensor-core or CUDA-core decode."""

    graph = True

    def __init__(self, tensor_cores: bool):
        self.tensor_cores = tensor_cores
        self.name = "flashinfer_tc" if tensor_cores else "flashinfer_cc"

    def prepare(self, case, data) -> Prepared:
        """Create the wrapper with its own workspace and plan it."""
        import torch

        fi = flashinfer()
        kwargs = variant_kwargs(case.variant)
        wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
            workspace(), "NHD", use_tensor_cores=self.tensor_cores
        )
        wrapper.plan(
            data.kv_indptr,
            data.kv_indices,
            data.kv_last_page_len,
            case.num_qo_heads,
            case.num_kv_heads,
            case.head_dim,
            case.page_size,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.bfloat16,
            **kwargs,
        )
        return Prepared(lambda: wrapper.run(data.q, data.cache))
