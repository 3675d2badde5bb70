"""Owns: ahead-of-time builds (``attnc build``): every module a deployment of a variant needs,
built into the cache for a named arch, so a serving host starts without nvcc work.

The modules are exactly those the runtime asks for (same names, sources and flags through
``ModuleRegistry.spec``, hence the same cache entries), so a later load on a host sharing
the cache directory and the same attnc install finds them. No CUDA device is needed.

Per arch: ``80`` (and other non-Hopper archs) builds the FA2 prefill and the decode modules;
``90a`` builds those too (the prefill with its sm_90 tile shapes) and, when this install has
the Hopper prefill template, the sm_90a prefill module (``PREFILL_SM90_MODULES``). Modules
shared by every variant come too: the host decode planner (``--kind decode``/``all``), the
host prefill planner (``--kind prefill``/``all``) and
``merge_state`` (``all``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from attnc.codegen.instances import DTYPE_SHORT
from attnc.compiler.results import Compiled
from attnc.dsl.errors import printable
from attnc.runtime.build import jit, modules, toolchain
from attnc.runtime.checks.tensors import HEAD_DIMS

KINDS = ("prefill", "decode", "all")
# --dtype's spellings: a dtype's name or its short name.
DTYPES = {spelled: name for name, short in DTYPE_SHORT.items() for spelled in (short, name)}


@dataclass(frozen=True)
class AotModule:
    """One module of a deployment: what it is for, and what to build."""

    variant: str
    kind: str
    dtype: str
    head_dim: int
    spec: jit.ModuleSpec
    arch: str


def parse_dtypes(text: str) -> tuple[str, ...]:
    """``"bf16,fp16"`` -> ``("bfloat16", "float16")``."""
    names = [t.strip() for t in text.split(",")]  # an empty item (",,") is refused too
    bad = [n for n in names if n not in DTYPES]
    if bad or not names:
        raise ValueError(
            f"--dtype: expected bf16 and/or fp16 (comma separated), got '{printable(text)}'"
        )
    return tuple(dict.fromkeys(DTYPES[n] for n in names))


def parse_head_dims(text: str) -> tuple[int, ...]:
    """``"64,128"`` -> ``(64, 128)``; each one of :data:`HEAD_DIMS`, in ASCII digits."""
    spelled = {str(d): d for d in HEAD_DIMS}  # int() would also read "١٢٨" as 128
    dims = [spelled.get(t.strip(), 0) for t in text.split(",")]  # "" (from ",,") is refused
    if not dims or 0 in dims:
        choices = ", ".join(map(str, HEAD_DIMS))
        raise ValueError(
            f"--head-dim: expected {choices} (comma separated), got '{printable(text)}'"
        )
    return tuple(dict.fromkeys(dims))


def deployment_modules(
    compiled: Sequence[Compiled],
    arch: str,
    dtypes: Sequence[str],
    head_dims: Sequence[int],
    kind: str = "all",
) -> list[AotModule]:
    """The modules to build for ``compiled`` variants on ``arch`` (normalised, e.g. ``"80"``)."""
    if kind not in KINDS:
        raise ValueError(f"--kind: expected one of {', '.join(KINDS)}, got '{kind}'")
    registries: list[tuple[str, modules.ModuleRegistry[object]]] = []
    if kind in ("prefill", "all"):
        registries.append(("prefill", modules.PREFILL_MODULES))  # type: ignore[arg-type]
        if arch == "90a" and modules.sm90_prefill_available():
            registries.append(("prefill_sm90", modules.PREFILL_SM90_MODULES))  # type: ignore[arg-type]
    if kind in ("decode", "all"):
        registries.append(("decode", modules.DECODE_MODULES))  # type: ignore[arg-type]
    out = []
    for c in compiled:
        for label, registry in registries:
            for dtype in dtypes:
                for head_dim in head_dims:
                    spec = registry.spec(c.variant, dtype, head_dim, arch)
                    out.append(AotModule(c.variant.name, label, dtype, head_dim, spec, arch))
    return out + shared_modules(arch, kind)


def shared_modules(arch: str, kind: str) -> list[AotModule]:
    """The modules every variant's runtime uses, as the runtime builds them: the host decode
    and prefill planners (built for their own fixed arch) and ``merge_state``."""
    # Imported here: build/ is below planning/ and codegen's module text is only needed now.
    from attnc.codegen.decode_module import render_merge_state_module
    from attnc.runtime.planning import decode_plan_library as planner
    from attnc.runtime.planning import prefill_plan_library as prefill_planner

    out = []
    if kind in ("decode", "all"):
        spec = jit.ModuleSpec("decode_plan", planner.source(), planner.BUILD_FLAGS)
        out.append(AotModule("-", "decode_planner", "-", 0, spec, planner.ARCH))
    if kind in ("prefill", "all"):
        spec = jit.ModuleSpec("prefill_plan", prefill_planner.source(), prefill_planner.BUILD_FLAGS)
        out.append(AotModule("-", "prefill_planner", "-", 0, spec, prefill_planner.ARCH))
    if kind == "all":
        spec = jit.ModuleSpec("merge_state", render_merge_state_module())
        out.append(AotModule("-", "merge_state", "-", 0, spec, arch))
    return out


def build_deployment(
    compiled: Sequence[Compiled],
    arch: str,
    dtypes: Sequence[str],
    head_dims: Sequence[int],
    kind: str = "all",
    jobs: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[tuple[AotModule, Path]]:
    """Build (or find in the cache) every module of :func:`deployment_modules`; returns each
    with its library path. ``progress`` gets one line per step."""
    target = toolchain.named_arch(arch)
    todo = deployment_modules(compiled, target, dtypes, head_dims, kind)
    say = progress or (lambda line: None)
    if target == "90a" and kind in ("prefill", "all") and not modules.sm90_prefill_available():
        say("no Hopper prefill template in this install: building the FA2 prefill for sm_90a")
    names = ", ".join(m.spec.name for m in todo)
    say(f"{len(todo)} module(s) for sm_{target}: {names}")
    built: dict[int, Path] = {}
    for group_arch in dict.fromkeys(m.arch for m in todo):
        group = [i for i, m in enumerate(todo) if m.arch == group_arch]
        specs = [todo[i].spec for i in group]
        paths = jit.build_modules(specs, arch=group_arch, jobs=jobs, progress=say)
        built.update(zip(group, paths, strict=True))
    return [(m, built[i]) for i, m in enumerate(todo)]
