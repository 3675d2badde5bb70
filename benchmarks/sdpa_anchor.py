"""PyTorch SDPA with the cuDNN or FlashAttention-2 backend, for plain causal rows only."""

from __future__ import annotations

from benchmarks.outcome import Unsupported
from benchmarks.system import Prepared, System


class SdpaPrefill(System):
    """``scaled_dot_product_attention(is_causal=True)`` pinned to one backend."""

    def __init__(self, backend: str):
        self.backend = backend
        self.name = f"sdpa_{backend}"

    def _backend(self):
        from torch.nn.attention import SDPBackend

        return {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[
            self.backend
        ]

    def prepare(self, case, data) -> Prepared:
        """[1, H, L, D] views of the NHD inputs; KV expanded if GQA is refused."""
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel

        if case.variant.stdlib != "causal" or case.q_len != case.kv_len:
            raise Unsupported("only plain causal with q_len == kv_len")
        backend = self._backend()
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (data.q, data.k, data.v))

        def call(kk, vv, gqa):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa)

        gqa = case.num_qo_heads != case.num_kv_heads
        note = ""
        try:
            call(k, v, gqa)
            torch.cuda.synchronize()
        except RuntimeError:
            group = case.num_qo_heads // case.num_kv_heads
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
            gqa = False
            note = "KV heads expanded"
        return Prepared(lambda: call(k, v, gqa), canon=lambda o: o[0].transpose(0, 1), note=note)
