"""Owns: whether the code running now is being traced by ``torch.compile`` or
``torch.export`` on this thread (``compiling``), the question the eager checks ask before
they read a tensor's memory or record a write.

``torch.compiler.is_compiling()`` alone answers for the process: torch sets one global
flag for a whole compile, so an eager call on another thread while one thread compiles took the
traced branches and skipped the checks that read memory (a freed storage, a zero tensor, a
fake one) and the records of attnc's own writes.
"""

from __future__ import annotations

import torch
from torch._guards import TracingContext


def compiling() -> bool:
    """True while dynamo traces the caller (it folds both flags to True and skips the rest),
    or while this thread runs a compile's tracing in Python (the custom ops' fake
    implementations, ``torch.export``): torch's compile flag is set and this thread holds a
    tracing context. False for eager code, on any thread."""
    return torch.compiler.is_compiling() and (  # the flag first: eager code's answer, fast
        torch.compiler.is_dynamo_compiling() or TracingContext.try_get() is not None
    )
