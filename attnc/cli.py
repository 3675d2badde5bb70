"""The ``attnc`` command: check, compile, list and test `.attn` variants.

Errors in user programs print ``file:line:col: error: message``, the line and a caret, and
exit with status 1 (never a traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from attnc.dsl.errors import AttnError

EMIT_STAGES = ("ast", "ir", "opt", "cuda", "torch", "params")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except AttnError as err:
        print(err.render(), file=sys.stderr)
        return 1
    except (OSError, LookupError, ValueError, RuntimeError) as err:
        # Bad paths, unknown variants, bad --param values, failed builds (the message names
        # the generated file and the exact compiler command).
        print(f"attnc: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnc",
        description="Compile attention variants written in the .attn language to CUDA kernels.",
        epilog="FILE may be a path or stdlib:NAME (see `attnc list`).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = sub.add_parser("check", help="report errors and warnings (exit 1 on any error)")
    check.add_argument("files", nargs="+", metavar="FILE")
    check.set_defaults(func=_cmd_check)

    comp = sub.add_parser("compile", help="print or write a stage of compilation")
    comp.add_argument("file", metavar="FILE")
    comp.add_argument("--variant", help="the variant to compile when FILE defines several")
    comp.add_argument(
        "--emit",
        choices=EMIT_STAGES,
        default="cuda",
        help="ast: parsed source; ir: lowered IR; opt: simplified IR and analyses; "
        "cuda: the functor header; torch: the PyTorch reference; params: the runtime param "
        "list as JSON (default: cuda)",
    )
    comp.add_argument(
        "-o", "--output-dir", metavar="DIR", help="write files here instead of stdout"
    )
    comp.set_defaults(func=_cmd_compile)

    lst = sub.add_parser("list", help="list the standard library variants with their docs")
    lst.set_defaults(func=_cmd_list)

    test = sub.add_parser(
        "test",
        help="check generated code against the reference (host harness; kernels too with a GPU)",
    )
    test.add_argument("file", metavar="FILE")
    test.add_argument("--variant", help="test only this variant")
    test.add_argument("--points", type=int, default=2000, help="random points per variant")
    test.add_argument("--seed", type=int, default=0)
    test.add_argument("--no-gpu", action="store_true", help="skip the kernel test even with a GPU")
    test.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="fix a scalar param (random values are drawn otherwise)",
    )
    test.set_defaults(func=_cmd_test)
    return parser


def _load(spec: str):
    from attnc.compiler.pipeline import compile_source, resolve_source

    text, file = resolve_source(spec)
    return compile_source(text, file)


def _print_warnings(warnings) -> None:
    for w in warnings:
        print(w.render(), file=sys.stderr)


def _cmd_check(args: argparse.Namespace) -> int:
    status = 0
    for spec in args.files:
        try:
            compiled, warnings = _load(spec)
        except AttnError as err:
            print(err.render(), file=sys.stderr)
            status = 1
            continue
        _print_warnings(warnings)
        names = ", ".join(c.variant.name for c in compiled) or "no variants"
        print(f"{spec}: ok ({names})")
    return status


def _select(compiled, name: str | None):
    if name is None:
        return compiled
    chosen = [c for c in compiled if c.variant.name == name]
    if not chosen:
        names = ", ".join(c.variant.name for c in compiled)
        raise LookupError(f"no variant '{name}'; the file defines: {names}")
    return chosen


def _cmd_compile(args: argparse.Namespace) -> int:
    from attnc.codegen import stages

    if args.emit == "ast":
        text = stages.emit_ast(args.file)
        _write(args, {"ast.attn": text})
        return 0
    compiled, warnings = _load(args.file)
    _print_warnings(warnings)
    outputs = {}
    for c in _select(compiled, args.variant):
        fname, text = stages.emit_stage(c, args.emit)
        outputs[fname] = text
    _write(args, outputs)
    return 0


def _write(args: argparse.Namespace, outputs: dict[str, str]) -> None:
    if not args.output_dir:
        sys.stdout.write("\n".join(outputs.values()))
        return
    os.makedirs(args.output_dir, exist_ok=True)
    for fname, text in outputs.items():
        path = os.path.join(args.output_dir, fname)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {path}")


def _cmd_list(args: argparse.Namespace) -> int:
    from attnc.compiler.pipeline import stdlib_names

    for name in stdlib_names():
        compiled, _ = _load(f"stdlib:{name}")
        for c in compiled:
            v = c.variant
            params = ", ".join(_describe_param(p) for p in v.params) or "no params"
            print(f"stdlib:{name:<16} {v.doc}")
            print(f"{'':23}params: {params}")
    return 0


def _describe_param(p) -> str:
    if p.kind == "tensor":
        return f"{p.name}: tensor<{p.dtype}>[{', '.join(str(d) for d in p.dims)}]"
    default = "" if p.default is None else f" = {p.default}"
    return f"{p.name}: {p.dtype}{default}"


def _cmd_test(args: argparse.Namespace) -> int:
    from attnc.testing.host_test import run_host_test

    compiled, warnings = _load(args.file)
    _print_warnings(warnings)
    fixed = dict(_parse_param(p) for p in args.param)
    failures = 0
    for c in _select(compiled, args.variant):
        report = run_host_test(c, points=args.points, seed=args.seed, fixed_params=fixed)
        print(report.summary())
        failures += not report.ok
        if not args.no_gpu:
            failures += _gpu_test(c, args.seed, fixed)
    return 1 if failures else 0


def _gpu_test(compiled, seed: int, fixed: dict[str, str]) -> int:
    try:
        import torch
    except ImportError:
        return 0
    if not torch.cuda.is_available():
        print(f"{compiled.variant.name}: kernels: skipped (no CUDA device)")
        return 0
    from attnc.testing.kernel_test import run_kernel_test

    report = run_kernel_test(compiled, seed=seed, fixed_params=fixed)
    print(report.summary())
    return 0 if report.ok else 1


def _parse_param(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ValueError(f"--param expects NAME=VALUE, got '{text}'")
    name, value = text.split("=", 1)
    return name.strip(), value.strip()


if __name__ == "__main__":
    sys.exit(main())
