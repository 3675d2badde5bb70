"""attnc: a compiler and runtime for LLM attention variants.

``attnc.load("stdlib:softcap")`` compiles a variant; ``Variant.reference`` runs it eagerly in
PyTorch, ``Variant.prefill`` and :class:`BatchPrefillWrapper` run the generated CUDA prefill
kernels, :class:`BatchDecodeWrapper` the decode kernels (paged KV, split-KV, CUDA graphs), and
``merge_state`` combines attention states computed over separate KV pieces.
"""

from __future__ import annotations

from typing import Any

from attnc.dsl.errors import AttnError
from attnc.version import __version__

__all__ = [
    "AttnError",
    "BatchDecodeWrapper",
    "BatchPrefillWrapper",
    "CapacityError",
    "Variant",
    "__version__",
    "load",
    "merge_state",
]


def __getattr__(name: str) -> Any:
    # torch-dependent names load on first use so `import attnc` (and the compiler) stay light.
    if name in ("load", "Variant"):
        from attnc.runtime import variant

        return getattr(variant, name)
    if name == "BatchPrefillWrapper":
        from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

        return BatchPrefillWrapper
    if name == "BatchDecodeWrapper":
        from attnc.runtime.wrappers.decode import BatchDecodeWrapper

        return BatchDecodeWrapper
    if name == "CapacityError":
        from attnc.runtime.planning.decode_schedule import CapacityError

        return CapacityError
    if name == "merge_state":
        from attnc.runtime.wrappers.merge import merge_state

        return merge_state
    raise AttributeError(f"module 'attnc' has no attribute {name!r}")
