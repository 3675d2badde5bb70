"""attnc: a compiler and runtime for LLM attention variants.

Public names (the torch-dependent ones load on first use, so ``import attnc`` and the
compiler stay light; ``dir(attnc)`` and ``help(attnc)`` list them all):

- ``load(spec, variant=None)``: compile a `.attn` file path, ``stdlib:NAME`` or source text
  and return a :class:`Variant`, e.g. ``attnc.load("stdlib:softcap")``.
- ``Variant``: one compiled variant; ``Variant.reference`` runs it eagerly in PyTorch,
  ``Variant.prefill`` runs the generated CUDA prefill kernels.
- ``BatchPrefillWrapper``: ``plan()``/``run()`` prefill of a batch over ragged or paged KV.
- ``BatchDecodeWrapper``: ``plan()``/``run()`` decode over paged KV (split-KV, CUDA graphs).
- ``merge_state``: combine attention states computed over separate KV pieces.
- ``CapacityError``: a plan that does not fit the workspace it was given.
- ``AttnError``: a located error in `.attn` source (``file:line:col``).
- ``__version__``: the package version.
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
        from attnc.runtime.planning.workspace import CapacityError

        return CapacityError
    if name == "merge_state":
        from attnc.runtime.wrappers.merge import merge_state

        return merge_state
    raise AttributeError(f"module 'attnc' has no attribute {name!r}")


def __dir__() -> list[str]:
    # The lazy names above are attributes too: list them for dir() and help().
    return sorted(set(globals()) | set(__all__))
