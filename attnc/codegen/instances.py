"""Owns: what the kernel templates are instantiated for: the element types (by name, with the
CUDA type and the short name a module's name carries) and the head dims."""

from __future__ import annotations

DTYPES = {"bfloat16": "__nv_bfloat16", "float16": "half"}  # name -> CUDA element type
DTYPE_SHORT = {"bfloat16": "bf16", "float16": "fp16"}  # name -> its short name
HEAD_DIMS = (64, 128, 256)
