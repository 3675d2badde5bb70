"""The ``attnc`` command: check, compile, list, test and build `.attn` variants.

Errors in user programs print ``file:line:col: error: message``, the line and a caret, and
exit with status 1 (never a traceback). Output cut short by a closed pipe (``attnc list |
head``) ends quietly with status 0.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import os
import stat
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import NoReturn

from attnc.dsl.errors import AttnError, printable
from attnc.dsl.literals import INTEGER_TEXT
from attnc.regular_file import write_atomically
from attnc.version import __version__

EMIT_STAGES = ("ast", "ir", "opt", "cuda", "torch", "params")
"""How an integer is written on the command line: ASCII digits, an optional sign."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    with _lenient_output():
        return _run(argv)


@contextlib.contextmanager
def _lenient_output() -> Iterator[None]:
    """Let stdout and stderr write any text, a character their encoding lacks as its escape
    (``\\u65e5``): a file name or message the terminal cannot show must not end the command
    (``attnc check A B`` still checks B after printing A's name to an ASCII-only stdout).
    Each stream gets its own error handler back when the last of the calls running at once
    (``main`` called from several threads) ends."""
    streams = [s for s in (sys.stdout, sys.stderr) if isinstance(s, io.TextIOWrapper)]
    with _LENIENT_LOCK:
        for stream in streams:
            entered = _LENIENT.get(id(stream))
            if entered is None:
                _LENIENT[id(stream)] = (stream, stream.errors or "strict", 1)
                _set_errors(stream, "backslashreplace")
            else:
                _LENIENT[id(stream)] = (stream, entered[1], entered[2] + 1)
    try:
        yield
    finally:
        with _LENIENT_LOCK:
            for stream in streams:
                _, errors, count = _LENIENT.pop(id(stream))
                if count > 1:
                    _LENIENT[id(stream)] = (stream, errors, count - 1)
                else:
                    _set_errors(stream, errors)


# Streams made lenient by the calls of main() running now: the stream (kept, so its id is not
# reused), its own error handler, and how many calls use it.
_LENIENT: dict[int, tuple[io.TextIOWrapper, str, int]] = {}
_LENIENT_LOCK = threading.Lock()


def _set_errors(stream: io.TextIOWrapper, errors: str) -> None:
    """``stream``'s encoding error handler set to ``errors`` (the flush this takes may fail on
    a closed pipe or a closed stream: its output is lost anyway)."""
    with contextlib.suppress(OSError, ValueError):
        stream.reconfigure(errors=errors)


def _run(argv: Sequence[str] | None) -> int:
    """``main`` with its output streams set up."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except AttnError as err:
        print(err.render(), file=sys.stderr)
        return 1
    except (OSError, LookupError, ValueError, RuntimeError) as err:
        # Bad paths, unknown variants, bad --param values, failed builds (the message names
        # the generated file and the exact compiler command; build errors begin "attnc: ").
        message = str(err)
        print(f"attnc: error: {message.removeprefix('attnc: ')}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush raises nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _integer(text: str) -> int:
    """``text`` as an integer written in ASCII digits with an optional sign: ``int()`` alone
    also takes other scripts' digits (``١٢٨`` is 128), ``1_000`` and surrounding spaces."""
    if INTEGER_TEXT.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(f"expected an integer, got '{printable(text)}'")
    return int(text)


def _whole_number(text: str, low: int, high: int | None = None) -> int:
    """``text`` as an integer in [low, high] (no upper bound when high is None); the type of
    every integer option (argparse names the option in the error)."""
    value = _integer(text)
    if value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"{low} or more"
        raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
    return value


def _points(text: str) -> int:
    from attnc.testing.host_test import MAX_POINTS

    return _whole_number(text, 1, MAX_POINTS)


def _jobs(text: str) -> int:
    return _whole_number(text, 1)


def _seed(text: str) -> int:
    # The range torch.manual_seed takes.
    return _whole_number(text, -(2**63), 2**64 - 1)


def _directory(text: str) -> str:
    """``-o``: a directory name; an empty one (a script's unset variable) is refused rather
    than taken for no ``-o``."""
    if not text:
        raise argparse.ArgumentTypeError("an empty directory name")
    return text


class _Parser(argparse.ArgumentParser):
    """argparse with its error messages printable: some quote the user's arguments as they
    are ('unrecognized arguments: ...', 'ambiguous option: ...'), control characters
    included, which would drive the terminal."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {printable(message)}\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="attnc",
        description="Compile attention variants written in the .attn language to CUDA kernels.",
        epilog="FILE may be a path or stdlib:NAME (see `attnc list`).",
    )
    parser.add_argument("--version", action="version", version=f"attnc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = sub.add_parser("check", help="report errors and warnings (exit 1 on any error)")
    check.add_argument("files", nargs="+", metavar="FILE")
    check.set_defaults(func=_cmd_check)

    _add_compile_parser(sub)
    lst = sub.add_parser("list", help="list the standard library variants with their docs")
    lst.set_defaults(func=_cmd_list)
    _add_test_parser(sub)
    _add_build_parser(sub)
    return parser


def _add_compile_parser(sub) -> None:
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
        "-o",
        "--output-dir",
        metavar="DIR",
        type=_directory,
        help="write files here instead of stdout",
    )
    comp.set_defaults(func=_cmd_compile)


def _add_test_parser(sub) -> None:
    test = sub.add_parser(
        "test",
        help="check generated code against the reference (host harness; kernels too with a GPU)",
    )
    test.add_argument("file", metavar="FILE")
    test.add_argument("--variant", help="test only this variant")
    test.add_argument(
        "--points",
        type=_points,
        default=2000,
        help="random points per variant, drawn in 6 cases of POINTS // 6 each (at least one): "
        "the report counts what ran (at most 10^6)",
    )
    test.add_argument("--seed", type=_seed, default=0)
    test.add_argument("--no-gpu", action="store_true", help="skip the kernel test even with a GPU")
    test.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="fix a scalar param (random values are drawn otherwise)",
    )
    test.set_defaults(func=_cmd_test)


def _add_build_parser(sub) -> None:
    build = sub.add_parser(
        "build",
        help="build the kernel modules a deployment needs into the cache (no GPU needed)",
        description="Build the prefill and decode modules of every variant in FILE for one "
        "arch, so a serving host sharing the cache (same attnc install) starts without nvcc. "
        "--arch 90a also builds the Hopper prefill module when this install has it.",
    )
    build.add_argument("file", metavar="FILE")
    build.add_argument("--variant", help="build only this variant")
    build.add_argument("--arch", required=True, help="target arch: 80, 86, 89, 90a, ...")
    build.add_argument("--dtype", default="bf16", help="bf16, fp16 or both: bf16,fp16")
    build.add_argument("--head-dim", default="128", help="64, 128, 256, or a list: 64,128")
    build.add_argument("--kind", choices=("prefill", "decode", "all"), default="all")
    build.add_argument(
        "-o",
        "--output-dir",
        metavar="DIR",
        type=_directory,
        help="cache directory to fill (default: the cache)",
    )
    jobs = "nvcc processes at once at most, each on its share of the CPUs (default: a module "
    build.add_argument("-j", "--jobs", type=_jobs, help=jobs + "a CPU, each nvcc on every CPU)")
    build.set_defaults(func=_cmd_build)


def _load(spec: str):
    from attnc.compiler.pipeline import compile_source, resolve_source

    text, file = resolve_source(spec)
    return compile_source(text, file)


def _print_warnings(warnings) -> None:
    for w in warnings:
        print(w.render(), file=sys.stderr)


def _cmd_check(args: argparse.Namespace) -> int:
    # Every file is checked, whatever fails before it; the status says whether any failed.
    status = 0
    for spec in args.files:
        try:
            compiled, warnings = _load(spec)
        except AttnError as err:
            print(err.render(), file=sys.stderr)
            status = 1
            continue
        except (OSError, LookupError, ValueError, RuntimeError) as err:
            print(f"attnc: error: {printable(spec)}: {_load_failure(spec, err)}", file=sys.stderr)
            status = 1
            continue
        _print_warnings(warnings)
        names = ", ".join(c.variant.name for c in compiled) or "no variants"
        print(f"{printable(spec)}: ok ({names})")
    return status


def _load_failure(spec: str, err: Exception) -> str:
    """Why ``spec`` could not be loaded, for a message that already names ``spec``."""
    if isinstance(err, OSError) and err.strerror and err.filename == spec:
        return err.strerror  # "No such file or directory", without repeating the path
    return str(err)


def _select(compiled, name: str | None):
    """The compiled variants a command works on: all, or the one ``--variant`` names. A file
    that defines none (only masks and functions, or variants it imports) is an error: the
    command would do nothing and exit 0."""
    if not compiled:
        raise LookupError(
            "the file defines no variant (imported variants are not compiled from it; name "
            "their own file)"
        )
    if name is None:
        return compiled
    chosen = [c for c in compiled if c.variant.name == name]
    if not chosen:
        names = ", ".join(c.variant.name for c in compiled)
        raise LookupError(f"no variant '{printable(name)}'; the file defines: {names}")
    return chosen


def _cmd_compile(args: argparse.Namespace) -> int:
    from attnc.codegen import stages

    if args.emit == "ast":
        if args.variant is not None:
            raise ValueError(
                "--variant: --emit ast prints the syntax tree of the whole file (nothing is "
                "lowered yet to pick a variant from); drop --variant"
            )
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
    if args.output_dir is None:  # a terminal, maybe: no control or bidi character reaches it
        if sys.stdout is None:
            raise OSError("stdout is closed; pass -o DIR to write files")
        text = "\n".join(outputs.values())
        sys.stdout.write("\n".join(printable(line) for line in text.split("\n")))
        return
    _check_output_dir(args.output_dir)
    try:
        os.makedirs(args.output_dir, exist_ok=True)
    except OSError as exc:
        raise type(exc)(
            f"-o: cannot create {printable(args.output_dir)}: {exc.strerror or exc}"
        ) from None
    for fname, text in outputs.items():
        path = os.path.join(args.output_dir, fname)
        _write_file(path, text)
        print(f"wrote {printable(str(path))}")


def _check_output_dir(text: str) -> None:
    """Refuse an ``-o DIR`` that no path can be (a NUL byte, a character the file system's
    encoding cannot hold), a file, a symbolic link to nothing (its target would be created,
    unlike the cache root's) or one that loops, by name."""
    shown = printable(text)
    if "\0" in text:
        raise ValueError(f"-o: {shown}: a path cannot hold a NUL byte")
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        raise ValueError(f"-o: {shown}: a path cannot hold this character") from None
    if os.path.islink(text) and not os.path.exists(text):
        raise NotADirectoryError(f"-o: {shown} is {_broken_link_kind(text)}")
    if os.path.exists(text) and not os.path.isdir(text):
        raise NotADirectoryError(f"-o: {shown} is not a directory")


def _broken_link_kind(path: str) -> str:
    """What a symbolic link that ``os.path.exists`` refuses is: one that loops or one to
    nothing (``stat`` of such a link always fails; its errno tells the two apart)."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link that loops"
    return "a symbolic link to nothing"


def _write_file(path: str, text: str) -> None:
    """``text`` written to ``path`` through a temporary file renamed over it: a pipe, link or
    device already there is refused (writing to a pipe blocked forever)."""
    if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
        raise OSError(f"-o: {printable(path)} exists and is not a regular file; remove it")
    try:
        write_atomically(path, text.encode("utf-8"), f".{os.path.basename(path)}.")
    except OSError as exc:  # its message names the temporary file, which the user never asked for
        why = exc.strerror or str(exc) or type(exc).__name__
        raise OSError(f"-o: cannot write {printable(path)}: {why}") from None


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
    default = "" if p.kind == "tensor" or p.default is None else f" = {p.default}"
    return f"{p.name}: {p.type_text()}{default}"


def _cmd_test(args: argparse.Namespace) -> int:
    from attnc.testing.cli_params import fixed_params
    from attnc.testing.host_test import run_host_test

    compiled, warnings = _load(args.file)
    _print_warnings(warnings)
    chosen = _select(compiled, args.variant)
    fixed = fixed_params([c.variant for c in chosen], args.param)
    failures = 0
    for c in chosen:
        values = fixed[c.variant.name]
        report = run_host_test(c, points=args.points, seed=args.seed, fixed_params=values)
        print(report.summary())
        failures += not report.ok
        if not args.no_gpu:
            failures += _gpu_test(c, args.seed, values)
    return 1 if failures else 0


def _cmd_build(args: argparse.Namespace) -> int:
    from attnc.runtime.build import toolchain

    arch = toolchain.named_arch(args.arch)  # a bad --arch fails before any compile
    if not args.output_dir:
        return _build_into_cache(args, arch)
    _check_output_dir(args.output_dir)
    # Both caches (modules, compiled variants) go there for this build only: a caller of
    # main() keeps its own cache root afterwards, whatever the build's outcome.
    before = os.environ.get("ATTNC_CACHE_DIR")
    os.environ["ATTNC_CACHE_DIR"] = os.path.realpath(args.output_dir)  # as the kernel reads ..
    try:
        return _build_into_cache(args, arch)
    finally:
        if before is None:
            os.environ.pop("ATTNC_CACHE_DIR", None)
        else:
            os.environ["ATTNC_CACHE_DIR"] = before


def _build_into_cache(args: argparse.Namespace, arch: str) -> int:
    """``attnc build`` into the cache root in force (``-o`` has set it)."""
    from attnc.compiler.pipeline import resolve_source
    from attnc.runtime.build import aot, cache
    from attnc.runtime.build.variant_cache import compile_cached

    dtypes, head_dims = aot.parse_dtypes(args.dtype), aot.parse_head_dims(args.head_dim)
    compiled, warnings = compile_cached(*resolve_source(args.file))
    _print_warnings(warnings)
    chosen = _select(compiled, args.variant)

    def progress(line: str) -> None:
        print(f"attnc build: {line}", file=sys.stderr, flush=True)

    built = aot.build_deployment(
        chosen, arch, dtypes, head_dims, args.kind, jobs=args.jobs, progress=progress
    )
    for module, path in built:
        if module.head_dim:
            print(
                f"{module.variant} {module.kind} {module.dtype} d{module.head_dim}: "
                f"{printable(str(path))}"
            )
        else:  # a module every variant shares
            print(f"{module.kind}: {printable(str(path))}")
    progress(f"done: {len(built)} module(s) in {printable(str(cache.cache_dir()))}")
    return 0


def _gpu_test(compiled, seed: int, fixed: dict[str, object]) -> int:
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


if __name__ == "__main__":
    sys.exit(main())
