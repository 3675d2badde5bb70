"""The second back end: an eager PyTorch reference of a variant, emitted as Python source."""

from __future__ import annotations

import types

from attnc.codegen.templates import render_template
from attnc.codegen.torch_expr import render_torch
from attnc.compiler import ir


def emit_reference_source(v: ir.VariantIR) -> str:
    """Python source of a module with ``score(env, P)``, ``mask(env, P)``, ``output(env, P)``."""
    return render_template(
        "reference.py.j2",
        name=v.name,
        use_softmax=v.normalize == "softmax",
        has_mask=v.mask is not None,
        has_score=v.score is not None,
        has_output=v.output is not None,
        score=render_torch(v.score) if v.score is not None else "env['score']",
        mask=render_torch(v.mask) if v.mask is not None else "None",
        output=render_torch(v.output) if v.output is not None else "env['out']",
    )


def load_reference(v: ir.VariantIR) -> types.ModuleType:
    """Compile the emitted reference source into a module object."""
    source = emit_reference_source(v)
    module = types.ModuleType(f"attnc_reference_{v.name}")
    module.__dict__["__source__"] = source
    exec(compile(source, f"<attnc reference of {v.name}>", "exec"), module.__dict__)
    return module
