"""attnc as a benchmarked system: single-request prefill, paged batch prefill and decode.

Prefill has two kernel templates once the runtime takes ``backend="fa2"|"sm90"`` (in
``variant.prefill`` and ``BatchPrefillWrapper``): the prefill rows then show ``attnc-fa2``
and ``attnc-sm90`` side by side. A runtime without that keyword gives one system, ``attnc``
(whatever template it picks).
"""

from __future__ import annotations

import inspect

import torch

from benchmarks.system import Prepared, System, workspace

_VARIANTS: dict[str, object] = {}


def load_variant(stdlib: str):
    """``attnc.load("stdlib:NAME")``, cached per name for the process."""
    if stdlib not in _VARIANTS:
        import attnc

        _VARIANTS[stdlib] = attnc.load(f"stdlib:{stdlib}")
    return _VARIANTS[stdlib]


PREFILL_BACKENDS = ("fa2", "sm90")


def takes_backend(fn) -> bool:
    """True if ``fn`` has a parameter named ``backend`` (not only ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    param = params.get("backend")
    return param is not None and param.kind != inspect.Parameter.VAR_KEYWORD


def prefill_backends(batch: bool = False) -> tuple[str | None, ...]:
    """The attnc prefill backends to benchmark: ``PREFILL_BACKENDS`` when the runtime takes
    ``backend=`` (``variant.prefill`` or, with ``batch``, ``BatchPrefillWrapper``), else
    ``(None,)`` (one system named ``attnc``)."""
    try:
        import attnc

        fn = attnc.BatchPrefillWrapper if batch else attnc.Variant.prefill
    except Exception:
        return (None,)
    return PREFILL_BACKENDS if takes_backend(fn) else (None,)


def system_name(backend: str | None) -> str:
    """``attnc`` or ``attnc-<backend>``."""
    return "attnc" if backend is None else f"attnc-{backend}"


def backend_kwargs(backend: str | None) -> dict:
    """``{"backend": backend}``, or nothing for the runtime's own choice."""
    return {} if backend is None else {"backend": backend}


CHECK_ROWS = 64
CHECK_SPREAD = 8


def keys_seen(case, stop: int) -> int:
    """How many leading keys the query rows before ``stop`` may see under the row's mask: up
    to the last row's position (causal, window), the prefix too (prefix-LM), all of them
    after the last row or without a mask."""
    mask = case.variant.mask
    if stop >= case.q_len or mask.kind == "none":
        return case.kv_len
    seen = stop + case.kv_len - case.q_len
    if mask.kind == "prefix":
        seen = max(seen, mask.prefix)
    return min(seen, case.kv_len)


# The built-ins whose value for a query row depends on where the row stands in the request.
ROW_POSITION_NAMES = ("q_idx", "q_pos", "q_len")


def reads_row_position(variant) -> bool:
    """True when one of the variant's expressions (score, mask, output, sink) reads a query
    row's index or position or the request's query count (``ROW_POSITION_NAMES``): the
    reference gives the rows of a slice of ``q`` those values at the slice's own place only."""
    from attnc.compiler import ir

    for _, expr in variant.ir.slots():
        if expr is None:
            continue
        for node in ir.walk(expr):
            if isinstance(node, ir.Builtin) and node.name in ROW_POSITION_NAMES:
                return True
    return False


def check_blocks(
    case, rows: int = CHECK_ROWS, spread: int = CHECK_SPREAD, rows_free: bool = False
) -> list[tuple]:
    """The query row blocks ``[start, stop)`` the eager check compares, sorted.

    ``spread`` blocks evenly spaced from the first rows to the last, plus one around each
    position where the mask changes what a row sees (a prefix's end, a window's first cut).
    Without a mask, a block is computed with every key, which the reference places before
    the block's rows as if they were the last ones: the blocks are spread only when
    ``rows_free`` (the variant reads no row position, ``reads_row_position``), else only the
    last rows are compared.
    """
    last = max(0, case.q_len - rows)
    if case.variant.mask.kind == "none" and not rows_free:
        return [(last, case.q_len)]
    starts = {round(i * last / max(1, spread - 1)) for i in range(spread)}
    offset = case.kv_len - case.q_len
    for pos in mask_boundaries(case.variant.mask):
        starts.add(min(last, max(0, pos - offset - rows // 2)))
    return [(start, min(case.q_len, start + rows)) for start in sorted(starts)]


def mask_boundaries(mask) -> list[int]:
    """Query positions where a mask starts to treat rows differently from the row before."""
    if mask.kind == "prefix":
        return [mask.prefix]
    if mask.kind == "window":
        return [mask.window]
    return []


class AttncPrefill(System):
    """``variant.prefill(q, k, v, **params)`` on one request (``backend=`` when given)."""

    is_attnc = True

    def __init__(self, backend: str | None = None):
        self.backend = backend
        self.name = system_name(backend)

    def prepare(self, case, data) -> Prepared:
        """Load the variant; the first call (and any build) happens in the check run."""
        variant = load_variant(case.variant.stdlib)
        params = {**data.params, **backend_kwargs(self.backend)}
        return Prepared(lambda: variant.prefill(data.q, data.k, data.v, **params))

    def self_check(self, case, data, out, rows: int = CHECK_ROWS) -> float:
        """The largest relative error, over blocks of ``rows`` query rows spread over the
        sequence (``check_blocks``), of ``out`` against attnc's eager reference.

        A block ``[start, stop)`` is computed by the reference on ``q[start:stop]`` and the
        keys up to the last one its rows may see (``keys_seen``), so that bottom-right
        alignment gives its rows their own positions; the cost stays that of a few blocks of
        rows. This is exact for variants that read positions, not the lengths ``q_len`` and
        ``kv_len`` (every row of the suite). Without a mask every block has every key: the
        blocks spread over the sequence only for variants that read no row position (sigmoid),
        else the last rows alone are checked.
        """
        from benchmarks.measure import rel_err

        variant = load_variant(case.variant.stdlib)
        errors = []
        for start, stop in row_blocks(case, variant, rows):
            keys = keys_seen(case, stop)
            ref = variant.reference(data.q[start:stop], data.k[:keys], data.v[:keys], **data.params)
            errors.append(rel_err(out[start:stop], ref))
        return max(errors)


def row_blocks(case, variant, rows: int = CHECK_ROWS) -> list[tuple]:
    """``check_blocks`` of a prefill row whose variant is ``variant`` (loaded)."""
    return check_blocks(case, rows, rows_free=not reads_row_position(variant))


class AttncBatchPrefill(System):
    """``attnc.BatchPrefillWrapper`` over the paged cache (``backend=`` when given)."""

    is_attnc = True

    def __init__(self, backend: str | None = None):
        self.backend = backend
        self.name = system_name(backend)

    def prepare(self, case, data) -> Prepared:
        """Create a wrapper with its own workspace and plan it once."""
        import attnc

        wrapper = attnc.BatchPrefillWrapper(
            load_variant(case.variant.stdlib),
            workspace(),
            kv_layout="NHD",
            **backend_kwargs(self.backend),
        )
        wrapper.plan(
            data.qo_indptr,
            data.kv_indptr,
            case.num_qo_heads,
            case.num_kv_heads,
            case.head_dim,
            kv_indices=data.kv_indices,
            kv_last_page_len=data.kv_last_page_len,
            page_size=case.page_size,
            dtype=torch.bfloat16,
            params=scalar_params(data.params),
        )
        params = data.params
        return Prepared(lambda: wrapper.run(data.q, data.cache, **params))


def scalar_params(params: dict) -> dict:
    """The non-tensor params, which ``plan()`` also takes (tensors go to ``run()`` only)."""
    return {k: v for k, v in params.items() if not isinstance(v, torch.Tensor)}


class AttncDecode(System):
    """``attnc.BatchDecodeWrapper`` with the FlashInfer-style ``plan`` signature, captured in a
    CUDA graph (``use_cuda_graph=True``)."""

    name = "attnc"
    is_attnc = True
    graph = True

    def prepare(self, case, data) -> Prepared:
        """Plan once; the timed call is ``run``."""
        import attnc

        wrapper = attnc.BatchDecodeWrapper(
            load_variant(case.variant.stdlib), workspace(), kv_layout="NHD", use_cuda_graph=True
        )
        wrapper.plan(
            data.kv_indptr,
            data.kv_indices,
            data.kv_last_page_len,
            case.num_qo_heads,
            case.num_kv_heads,
            case.head_dim,
            case.page_size,
            dtype=torch.bfloat16,
            params=scalar_params(data.params),
        )
        params = data.params
        return Prepared(lambda: wrapper.run(data.q, data.cache, **params))
