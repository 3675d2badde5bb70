"""FlashInfer (0.5.x) as an anchor: single prefill, paged batch prefill, paged decode."""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.budget import FA3_BUILD_S, JitBuilds
from benchmarks.outcome import Missing, Unsupported
from benchmarks.system import Prepared, System, workspace

# One record for the whole run: a module built in one row is not built again in the next.
FA3_BUILDS = JitBuilds(FA3_BUILD_S, "FlashInfer FA3")


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


def module_key(kind: str, head_dim: int, kwargs: dict) -> tuple:
    """What tells FlashInfer's JIT modules apart for our rows: the kernel kind, head_dim and
    which features are on (window and cap values are runtime arguments)."""
    return (
        kind,
        head_dim,
        kwargs.get("pos_encoding_mode", "NONE"),
        "logits_soft_cap" in kwargs,
        "window_left" in kwargs,
    )


def admit_build(backend: str, key: tuple, time_left: Callable[[], float | None] | None) -> None:
    """For FA3: raise Missing when a module not built yet would not fit the time left."""
    if backend == "fa3":
        FA3_BUILDS.admit(key, time_left() if time_left is not None else None)


class FlashInferSingle(System):
    """``single_prefill_with_kv_cache`` with backend fa2 or fa3."""

    def __init__(self, backend: str, time_left: Callable[[], float | None] | None = None):
        self.backend = backend
        self.name = f"flashinfer_{backend}"
        self.time_left = time_left

    def prepare(self, case, data) -> Prepared:
        """Keywords for the variant; inputs are used as they are (NHD)."""
        fi = flashinfer()
        kwargs = variant_kwargs(case.variant, self.backend)
        admit_build(self.backend, module_key("single", case.head_dim, kwargs), self.time_left)
        causal = case.variant.mask.kind != "none"

        def run():
            return fi.single_prefill_with_kv_cache(
                data.q, data.k, data.v, causal=causal, backend=self.backend, **kwargs
            )

        return Prepared(run)


class FlashInferBatchPrefill(System):
    """``BatchPrefillWithPagedKVCacheWrapper`` (causal) with backend fa2 or fa3."""

    def __init__(self, backend: str, time_left: Callable[[], float | None] | None = None):
        self.backend = backend
        self.name = f"flashinfer_{backend}"
        self.time_left = time_left

    def prepare(self, case, data) -> Prepared:
        """Create the wrapper with its own workspace and plan it."""
        import torch

        fi = flashinfer()
        kwargs = variant_kwargs(case.variant, self.backend)
        admit_build(self.backend, module_key("paged", case.head_dim, kwargs), self.time_left)
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
