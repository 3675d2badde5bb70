"""``attnc test`` without a GPU: the generated functor compiled into a host harness and
compared with the PyTorch reference on random points, tiles and params."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from attnc.codegen.cuda_expr import cpp_name
from attnc.codegen.functor import emit_functor, key_value_terms, struct_name
from attnc.codegen.templates import render_template
from attnc.codegen.torch_ref import load_reference
from attnc.compiler import ir
from attnc.compiler.bias_step import bias_step
from attnc.compiler.pipeline import Compiled
from attnc.compiler.score_log2 import LOG2E
from attnc.dsl.errors import printable
from attnc.runtime.build import jit, toolchain
from attnc.runtime.checks.params import declared_shape

INCLUDE_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "kernels", "include")
TOLERANCE = 1e-5
MAX_POINTS = 1_000_000  # the harness input and the reference's tensors stay under ~1 GB
CLASSES = {0: "empty", 1: "full", 2: "partial"}


@dataclass
class HostTestReport:
    """What the host harness found for one variant."""

    name: str
    points: int = 0
    tiles: int = 0
    score_error: float = 0.0
    output_error: float = 0.0
    affine_error: float = 0.0
    sink_error: float = 0.0
    log2_error: float = 0.0  # the score in log2 units from the raw dot product (kernels' form)
    raw_error: float = 0.0  # without softmax: the weight from the raw dot product (kernels' form)
    # score_bias stepped from a key by k (kernels' form with a bias step) vs at key + k
    bias_step_error: float = 0.0
    mask_mismatches: int = 0
    tile_violations: list[str] = field(default_factory=list)
    # points also computed from a key's values (V::KeyValues and the *_at hooks), with the
    # same error bounds
    key_value_points: int = 0

    @property
    def ok(self) -> bool:
        """Every error within TOLERANCE, no mask mismatch and no tile-class violation."""
        errors = (
            self.score_error,
            self.output_error,
            self.affine_error,
            self.sink_error,
            self.log2_error,
            self.raw_error,
            self.bias_step_error,
        )
        return (
            all(e <= TOLERANCE for e in errors)
            and not self.mask_mismatches
            and not (self.tile_violations)
        )

    def summary(self) -> str:
        """One line: the verdict, the counts and every error against its bound."""
        status = "ok" if self.ok else "FAILED"
        text = (
            f"{self.name}: host harness {status}: {self.points} points, {self.tiles} tiles; "
            f"relative error score {self.score_error:.2e}, output {self.output_error:.2e}, "
            f"affine form {self.affine_error:.2e}, sink {self.sink_error:.2e}, "
            f"log2 form {self.log2_error:.2e}, raw form {self.raw_error:.2e}, "
            f"bias step {self.bias_step_error:.2e}; mask mismatches {self.mask_mismatches}; "
            f"tile violations {len(self.tile_violations)}"
        )
        if self.key_value_points:
            text += f"; {self.key_value_points} points also from key values"

        if self.tile_violations:
            text += "\n  " + "\n  ".join(self.tile_violations[:5])
        return text


def compiler_command(source: str, binary: str) -> list[str]:
    """nvcc (host code of the __host__ __device__ functor; ``$ATTNC_NVCC`` first, as for the
    kernels) when present, else g++."""
    nvcc: str | None
    if os.environ.get("ATTNC_NVCC"):  # asked for: an error naming it when it cannot run
        nvcc = toolchain.runnable_nvcc()
    else:
        try:
            nvcc = toolchain.find_nvcc()
        except toolchain.ToolNotFound:
            nvcc = None
    if nvcc:
        return [
            nvcc,
            "-std=c++17",
            "-O1",
            "-x",
            "cu",
            "-I",
            INCLUDE_DIR,
            "-I",
            os.path.dirname(source),
            source,
            "-o",
            binary,
        ]
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise RuntimeError("attnc test needs nvcc or a C++ compiler (g++) on PATH")
    return cxx_command(cxx, source, binary)


def cxx_command(cxx: str, source: str, binary: str, flags: tuple[str, ...] = ()) -> list[str]:
    """The host C++ compiler ``cxx`` building the harness ``source`` into ``binary``, with
    extra ``flags`` (e.g. a sanitizer)."""
    return [
        cxx,
        "-std=c++17",
        "-O1",
        *flags,
        "-I",
        INCLUDE_DIR,
        "-I",
        os.path.dirname(source),
        "-x",
        "c++",
        source,
        "-o",
        binary,
    ]


def build_harness(c: Compiled, workdir: str) -> str:
    """Write and compile the harness of ``c`` in ``workdir``; returns the binary path."""
    v = c.variant
    params = [{"kind": p.kind, "dtype": p.dtype, "cname": cpp_name(p.name)} for p in v.params]
    with open(os.path.join(workdir, "functor.cuh"), "w", encoding="utf-8") as f:
        f.write(emit_functor(c))
    source = os.path.join(workdir, "harness.cu")
    with open(source, "w", encoding="utf-8") as f:
        f.write(
            render_template(
                "host_harness.cpp.j2",
                variant_name=v.name,
                struct_name=struct_name(v),
                params=params,
            )
        )
    binary = os.path.join(workdir, "harness")
    cmd = compiler_command(source, binary)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=jit.nvcc_env())
    if proc.returncode != 0:
        text = (
            f"host harness of '{v.name}' failed to compile ({source}):\n$ {' '.join(cmd)}\n"
            f"{proc.stdout}{proc.stderr}"
        )  # paths and compiler output: no control character reaches the terminal
        raise RuntimeError("\n".join(printable(line) for line in text.split("\n")))
    return binary


@dataclass
class _Case:
    """One request: ``params`` as the functor gets them (batch-flattened tensors whole, the
    request's slice at ``starts`` = (q_start, kv_start)), ``request_params`` as the
    reference gets them (that slice only)."""

    request: tuple[int, int, int, int, int, int, float]
    starts: tuple[int, int]
    params: dict[str, Any]
    request_params: dict[str, Any]
    points: list[tuple[int, int, int, float, float]]
    tiles: list[tuple[int, int, int, int]]


def _draw_case(
    v: ir.VariantIR, rng: random.Random, points: int, fixed: Mapping[str, object]
) -> _Case:
    q_len = rng.choice([1, 2, 17, rng.randint(1, 300)])
    kv_len = rng.choice([q_len, q_len + rng.randint(0, 300), max(1, q_len - rng.randint(0, q_len))])
    h_kv = rng.choice([1, 2, 4])
    h_qo = h_kv * rng.choice([1, 2, 4])
    head_dim = rng.choice([64, 128, 256])
    request = (rng.randint(0, 7), q_len, kv_len, h_qo, h_kv, head_dim, 1.0 / head_dim**0.5)
    # Earlier requests' tokens come first in a batch-flattened tensor, later ones after.
    starts = (rng.randint(0, 40), rng.randint(0, 40))
    sizes = {"num_qo_heads": h_qo, "num_kv_heads": h_kv, "head_dim": head_dim}
    sizes.update(q_len=starts[0] + q_len + 3, kv_len=starts[1] + kv_len + 3)
    sizes.update(batch_size=request[0] + 1 + rng.randint(0, 2))
    params = {p.name: _draw_param(p, rng, fixed, sizes, q_len, kv_len) for p in v.params}
    cuts = {"q_len": (starts[0], q_len), "kv_len": (starts[1], kv_len)}
    request_params = dict(params)
    for p in v.params:
        if p.token_dim in cuts:
            begin, n = cuts[p.token_dim]
            request_params[p.name] = params[p.name][begin : begin + n]
    pts = [
        (
            rng.randrange(q_len),
            rng.randrange(h_qo),
            rng.randrange(kv_len),
            rng.uniform(-12.0, 12.0),
            rng.uniform(-3.0, 3.0),
        )
        for _ in range(points)
    ]
    tiles = [_draw_tile(rng, q_len, kv_len) for _ in range(max(8, points // 50))]
    return _Case(request, starts, params, request_params, pts, tiles)


def _draw_tile(rng: random.Random, q_len: int, kv_len: int) -> tuple[int, int, int, int]:
    q0 = rng.randrange(q_len)
    k0 = rng.randrange(kv_len)
    return q0, min(q_len, q0 + rng.randint(1, 64)), k0, min(kv_len, k0 + rng.randint(1, 64))


def _draw_param(p: ir.ParamDecl, rng, fixed, sizes, q_len, kv_len):
    if p.kind == "tensor":
        shape = declared_shape(p, sizes)
        if p.dtype == ir.F32:
            return torch.rand(shape, dtype=torch.float64) * 2 - 1
        if p.token_dim in ("kv_len", "q_len"):  # document ids: runs of equal values
            ids = torch.randint(0, 4, shape, dtype=torch.int64)
            return torch.sort(ids, dim=0).values if rng.random() < 0.7 else ids
        if p.token_dim == "batch_size":  # per-request lengths, windows, prefixes
            return torch.randint(0, 2 * max(q_len, kv_len) + 2, shape, dtype=torch.int64)
        return torch.randint(0, 16, shape, dtype=torch.int64)
    if p.name in fixed:
        return fixed[p.name]
    if p.default is not None and rng.random() < 0.3:
        return p.default
    if p.dtype == ir.F32:
        return rng.choice([-1, 1]) * rng.uniform(0.5, 60.0)
    if p.dtype == ir.I32:
        return rng.choice([0, 1, rng.randint(0, 2 * max(q_len, kv_len))])
    return rng.random() < 0.5


def _stdin(cases: list[_Case], v: ir.VariantIR) -> str:
    out = [str(len(cases))]
    for case in cases:
        out.append(" ".join(map(str, case.request + case.starts)))
        for p in v.params:
            value = case.params[p.name]
            if p.kind == "tensor":
                flat = value.flatten().tolist()
                out.append(
                    " ".join(
                        [str(len(flat))]
                        + [repr(float(x)) if p.dtype == ir.F32 else str(int(x)) for x in flat]
                    )
                )
            else:
                out.append(str(int(value)) if p.dtype != ir.F32 else repr(float(value)))
        out.append(str(len(case.points)))
        out.extend(f"{q} {h} {k} {s!r} {o!r}" for q, h, k, s, o in case.points)
        out.append(str(len(case.tiles)))
        out.extend(" ".join(map(str, t)) for t in case.tiles)
    return "\n".join(out) + "\n"


def run_host_test(
    c: Compiled,
    *,
    points: int = 2000,
    seed: int = 0,
    cases: int = 6,
    fixed_params: Mapping[str, object] | None = None,
) -> HostTestReport:
    """Compile the harness of ``c`` and compare it with the reference on random inputs.

    ``fixed_params`` holds checked scalar values (see ``attnc.testing.cli_params``); other
    params are drawn at random. ``points`` is at most :data:`MAX_POINTS`."""
    if not 1 <= points <= MAX_POINTS:
        raise ValueError(f"points must be between 1 and {MAX_POINTS}, got {points}")
    v = c.variant
    rng = random.Random(seed)
    torch.manual_seed(seed)
    drawn = [_draw_case(v, rng, max(1, points // cases), fixed_params or {}) for _ in range(cases)]
    # nvcc names its files on a shell command line: a directory a shell would expand (from
    # TMPDIR) would run what it names, so the harness is built where the modules are staged
    with tempfile.TemporaryDirectory(prefix="attnc-harness-", dir=jit.staging_root()) as workdir:
        binary = build_harness(c, workdir)
        proc = subprocess.run([binary], input=_stdin(drawn, v), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"host harness of '{v.name}' exited with {proc.returncode}: {proc.stderr}"
        )
    steps_bias = _steps_bias(c)
    keyed = bool(key_value_terms(c))
    lines = _lines_by_kind(proc.stdout, v.name, drawn, steps_bias, keyed)
    report = HostTestReport(v.name)
    module = load_reference(v)
    for case in drawn:
        got_points = [next(lines["P"]) for _ in case.points]
        got_tiles = [next(lines["T"]) for _ in case.tiles]
        _compare_points(module, c, case, got_points, report)
        if keyed:
            keyed_points = [next(lines["K"]) for _ in case.points]
            _compare_points(module, c, case, keyed_points, report)
            report.points -= len(keyed_points)
            report.key_value_points += len(keyed_points)
        _compare_tiles(module, case, got_tiles, report)
        if steps_bias:
            _compare_bias_step([next(lines["B"]) for _ in case.points], report)
    return report


def _steps_bias(c: Compiled) -> bool:
    """Whether the functor of ``c`` declares a bias step (kBiasStep)."""
    return c.affine is not None and not c.affine.identity and bias_step(c.affine.bias) is not None


def _lines_by_kind(
    stdout: str, name: str, drawn: list[_Case], steps_bias: bool, keyed: bool
) -> dict[str, Iterator[list[str]]]:
    """The harness output's values by line kind (the first word: P, K, B or T), in order."""
    kinds: dict[str, list[list[str]]] = {"P": [], "K": [], "B": [], "T": []}
    for line in stdout.splitlines():
        words = line.split()
        if words and words[0] in kinds:
            kinds[words[0]].append(words[1:])
    points = sum(len(case.points) for case in drawn)
    want = {
        "P": points,
        "K": points if keyed else 0,
        "B": points if steps_bias else 0,
        "T": sum(len(c.tiles) for c in drawn),
    }
    got = {k: len(v) for k, v in kinds.items()}
    if got != want:
        raise RuntimeError(f"host harness of '{name}' printed {got} lines, expected {want}")
    return {k: iter(v) for k, v in kinds.items()}


def _compare_bias_step(got: list[list[str]], report: HostTestReport) -> None:
    """The "B" lines of a case: pairs (stepped bias, bias at the shifted key), compared over
    the whole case (a shifted key where the bias is 0 has only the rounding of the step)."""
    pairs = torch.tensor([[float(x) for x in row] for row in got], dtype=torch.float64)
    pairs = pairs.view(-1, 2)
    report.bias_step_error = max(report.bias_step_error, _rel(pairs[:, 0], pairs[:, 1]))


def _env(case: _Case, dtype: torch.dtype, q_idx, qo_head, kv_idx, score, out) -> dict[str, Any]:
    batch, q_len, kv_len, h_qo, h_kv, head_dim, sm_scale = case.request

    def s(x, t):
        return torch.tensor(x, dtype=t)

    env: dict[str, Any] = {
        "score": score,
        "out": out,
        "q_idx": q_idx,
        "q_pos": q_idx + (kv_len - q_len),
        "kv_idx": kv_idx,
        "qo_head": qo_head,
        "kv_head": torch.div(qo_head, h_qo // h_kv, rounding_mode="floor"),
        "sm_scale": s(sm_scale, dtype),
        "q_len": s(q_len, torch.int64),
        "kv_len": s(kv_len, torch.int64),
        "batch": s(batch, torch.int64),
        "head_dim": s(head_dim, torch.int64),
        "num_qo_heads": s(h_qo, torch.int64),
        "num_kv_heads": s(h_kv, torch.int64),
    }
    for name, value in case.request_params.items():
        if isinstance(value, torch.Tensor):
            continue
        t = (
            torch.bool
            if isinstance(value, bool)
            else torch.int64
            if isinstance(value, int)
            else dtype
        )
        env[name] = s(value, t)
    return env


def _tensors(case: _Case, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {
        n: (t.to(dtype) if t.is_floating_point() else t)
        for n, t in case.request_params.items()
        if isinstance(t, torch.Tensor)
    }


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative error over the finite values; inf where the non-finite ones differ (in place,
    sign of an infinity, or NaN against an infinity)."""
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(got), finite):
        return float("inf")
    same_nan = torch.isnan(got) == torch.isnan(ref)
    same_inf = torch.where(torch.isinf(ref), got == ref, True)
    if not bool((same_nan & same_inf).all()):
        return float("inf")
    denom = ref[finite].norm().item()
    return (got[finite] - ref[finite]).norm().item() / max(denom, 1e-30)


def _compare_points(module, c: Compiled, case: _Case, got, report: HostTestReport) -> None:
    cols = list(zip(*case.points, strict=True))
    q_idx, qo_head, kv_idx = (torch.tensor(x, dtype=torch.int64) for x in cols[:3])
    vals = torch.tensor([[float(x) for x in row] for row in got], dtype=torch.float64)
    for dtype in (torch.float64, torch.float32):
        score = torch.tensor(cols[3], dtype=dtype)
        out = torch.tensor(cols[4], dtype=dtype)
        env = _env(case, dtype, q_idx, qo_head, kv_idx, score, out)
        tensors = _tensors(case, dtype)
        if dtype == torch.float64:
            ref_score = module.score(env, tensors).expand(len(got)).to(torch.float64)
            ref_out = module.output(env, tensors).expand(len(got)).to(torch.float64)
            report.score_error = max(report.score_error, _rel(vals[:, 0], ref_score))
            report.output_error = max(report.output_error, _rel(vals[:, 2], ref_out))
            if c.affine is not None:
                affine = vals[:, 3] * score + vals[:, 4]
                report.affine_error = max(report.affine_error, _rel(affine, ref_score))
            if c.affine is None and c.variant.normalize == "softmax":
                ref_log2 = ref_score * LOG2E
                report.log2_error = max(report.log2_error, _rel(vals[:, 7], ref_log2))
            if c.variant.normalize == "none":
                report.raw_error = max(report.raw_error, _rel(vals[:, 7], ref_score))
            if getattr(module, "HAS_SINK", False):
                ref_sink = module.sink(env, tensors).expand(len(got)).to(torch.float64)
                report.sink_error = max(report.sink_error, _rel(vals[:, 5], ref_sink))
        elif module.HAS_MASK:
            ref_mask = module.mask(env, tensors).expand(len(got))
            report.mask_mismatches += int((vals[:, 1].bool() != ref_mask).sum())
            # the row interval kernels test on PARTIAL tiles must be the mask exactly
            report.mask_mismatches += int((vals[:, 6].bool() != ref_mask).sum())
    report.points += len(got)


def _compare_tiles(module, case: _Case, got, report: HostTestReport) -> None:
    batch, q_len, kv_len, h_qo, *_ = case.request
    for (q0, q1, k0, k1), row in zip(case.tiles, got, strict=True):
        cls, begin, end = (int(x) for x in row)
        visible = _visible(module, case, q0, q1, 0, kv_len, h_qo)
        tile = visible[:, :, k0:k1]
        where = f"tile q[{q0},{q1}) kv[{k0},{k1}) of q_len {q_len}, kv_len {kv_len}"
        if cls == 0 and tile.any():
            report.tile_violations.append(f"{where}: EMPTY but a pair is visible")
        if cls == 1 and not tile.all():
            report.tile_violations.append(f"{where}: FULL but a pair is masked")
        seen = visible.any(dim=0).any(dim=0).nonzero().flatten()
        if seen.numel() and (seen.min().item() < begin or seen.max().item() >= end):
            report.tile_violations.append(
                f"{where}: kv_range [{begin},{end}) misses visible keys "
                f"[{seen.min().item()},{seen.max().item()}]"
            )
        report.tiles += 1


def _visible(module, case: _Case, q0, q1, k0, k1, h_qo) -> torch.Tensor:
    q_idx = torch.arange(q0, q1).view(1, -1, 1)
    kv_idx = torch.arange(k0, k1).view(1, 1, -1)
    qo_head = torch.arange(h_qo).view(-1, 1, 1)
    shape = (h_qo, q1 - q0, k1 - k0)
    if not module.HAS_MASK:
        return torch.ones(shape, dtype=torch.bool)
    env = _env(case, torch.float32, q_idx, qo_head, kv_idx, torch.zeros(()), torch.zeros(()))
    return module.mask(env, _tensors(case, torch.float32)).expand(shape)
