"""attnc: a compiler and runtime for LLM attention variants.

``attnc.load("stdlib:softcap")`` compiles a variant; ``Variant.reference`` runs it eagerly in
PyTorch, ``Variant.prefill`` and :class:`BatchPrefillWrapper` run the generated CUDA kernels.
"""

from __future__ import annotations

from typing import Any

from attnc.dsl.errors import AttnError

__version__ = "0.1.0"

__all__ = ["AttnError", "BatchPrefillWrapper", "Variant", "__version__", "load"]


def __getattr__(name: str) -> Any:
    # torch-dependent names load on first use so `import attnc` (and the compiler) stay light.
    if name in ("load", "Variant"):
        from attnc.runtime import variant

        return getattr(variant, name)
    if name == "BatchPrefillWrapper":
        from attnc.runtime.prefill import BatchPrefillWrapper

        return BatchPrefillWrapper
    raise AttributeError(f"module 'attnc' has no attribute {name!r}")
