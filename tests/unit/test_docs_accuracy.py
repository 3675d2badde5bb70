"""What README.md and docs/*.md state is true of the code: every `.attn` example compiles
(and the shipped ones are the stdlib files), every documented error message is the one the
compiler gives, every ``attnc`` command, flag and ``stdlib:NAME`` exists, every ``ATTNC_*``
variable is read where the docs say and every path they name exists (the Python examples and
signatures: test_docs_python_api.py). Pure Python: nothing is built."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

from attnc import cli
from attnc.codegen import stages
from attnc.compiler.pipeline import STDLIB_DIR, compile_source, resolve_source, stdlib_names
from attnc.dsl.errors import AttnError

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/language.md", "docs/runtime.md", "docs/clients.md")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
INLINE_CODE = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")
SHELL_WORDS = ("attnc ", "pip ", "python ", "ruff ", "mypy ")
OUTLINE_STARTS = ("module      :=", "o   = sum_j", "attnc/dsl/")  # grammar, formula, layout


# --- reading the docs -------------------------------------------------------------------------


def doc_text(name: str) -> str:
    return (ROOT / name).read_text("utf-8")


def fenced_blocks(name: str) -> list[tuple[str, str, str]]:
    """(``name:line``, fence language, text) of every fenced block of one doc."""
    text = doc_text(name)
    return [
        (f"{name}:{text[: m.start()].count(chr(10)) + 1}", m.group(1), m.group(2))
        for m in FENCE.finditer(text)
    ]


def all_blocks() -> list[tuple[str, str, str]]:
    return [block for name in DOCS for block in fenced_blocks(name)]


def inline_spans(name: str) -> list[str]:
    """The inline code spans of one doc (outside fenced blocks), whitespace collapsed."""
    prose = FENCE.sub("", doc_text(name))
    return [" ".join(span.split()) for span in INLINE_CODE.findall(prose)]


def all_code_text() -> list[str]:
    """Every fenced block and inline span of every doc."""
    return [text for _, _, text in all_blocks()] + [s for d in DOCS for s in inline_spans(d)]


def block_kind(lang: str, text: str) -> str:
    """attn, error (a rendered diagnostic), shell, python or outline; '' for anything else."""
    if lang:
        return lang
    lines = [line for line in text.splitlines() if line.strip()]
    code = [line for line in lines if not line.lstrip().startswith("#")]
    if code and code[0].startswith(('import "', "def ", "variant ")):
        return "attn"
    if re.match(r"\S+\.attn:\d+:\d+: error: ", lines[0]):
        return "error"
    if lines[0].startswith(SHELL_WORDS):
        return "shell"
    if lines[0].startswith(OUTLINE_STARTS):
        return "outline"
    return ""


def blocks_of_kind(kind: str) -> list[tuple[str, str]]:
    return [(where, text) for where, lang, text in all_blocks() if block_kind(lang, text) == kind]


def section(name: str, heading: str) -> str:
    """The text of a doc from ``heading`` to the next heading of the same level."""
    text = doc_text(name)
    level = heading.split(" ")[0]
    start = text.index(heading + "\n")
    end = text.find(f"\n{level} ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def test_every_fenced_block_has_a_known_kind() -> None:
    unknown = [where for where, lang, text in all_blocks() if not block_kind(lang, text)]
    assert unknown == []
    assert blocks_of_kind("attn") and blocks_of_kind("error") and blocks_of_kind("shell")


# --- .attn examples ---------------------------------------------------------------------------


def compile_as_shipped(text: str):
    """Compile ``text`` as if it sat beside the stdlib files (so ``import "masks.attn"``
    finds the shipped helpers)."""
    return compile_source(text, str(Path(STDLIB_DIR) / "doc_example.attn"))


@pytest.mark.parametrize(("where", "text"), blocks_of_kind("attn"))
def test_attn_example_compiles_to_cuda(where: str, text: str) -> None:
    compiled, warnings = compile_as_shipped(text)
    assert compiled or "def " in text, f"{where}: no variant"
    assert not warnings, f"{where}: {[w.render() for w in warnings]}"
    for c in compiled:
        _, cuda = stages.emit_stage(c, "cuda")
        assert f"Variant_{c.variant.name}" in cuda


def without_comments(text: str) -> list[str]:
    lines = (line.split("#")[0].rstrip() for line in text.splitlines())
    return [line for line in lines if line.strip()]


def test_worked_examples_are_the_shipped_files() -> None:
    worked = section("docs/language.md", "## Worked examples: the standard variants")
    blocks = [m.group(2) for m in FENCE.finditer(worked)]
    shipped = {}
    for name in ("masks", *stdlib_names()):
        shipped[name] = without_comments((Path(STDLIB_DIR) / f"{name}.attn").read_text("utf-8"))
    shown = set()
    for block in blocks:
        name = re.search(r"(?:variant (\w+)|# (masks)\.attn)", block)
        key = name.group(1) or name.group(2)
        assert without_comments(block) == shipped[key], key
        shown.add(key)
    assert shown == set(shipped)


# --- documented error messages ----------------------------------------------------------------


def rendered_error(text: str, file: str) -> str:
    with pytest.raises(AttnError) as err:
        compile_source(text, file)
    return err.value.render()


def error_block(first_line: str) -> str:
    found = [text for _, text in blocks_of_kind("error") if text.startswith(first_line)]
    assert len(found) == 1, first_line
    return found[0].rstrip("\n")


def test_rendered_errors_look_as_shown() -> None:
    readme = "variant bad {\n\n  mask = kv_idx <= q_pos && foo;\n}\n"
    assert rendered_error(readme, "bad.attn") == error_block("bad.attn:3:29:")
    softcap = blocks_of_kind("attn")[0][1].splitlines()  # README's softcap.attn
    softcap[4] = "    score = x"
    shown = error_block("softcap.attn:5:14:")
    assert rendered_error("\n".join(softcap), "softcap.attn") == shown
    assert len(blocks_of_kind("error")) == 2


def documented_error_messages() -> list[str]:
    """The message column of the error tables of docs/language.md."""
    rows = re.findall(r"^\| .+? \| `(.+)`.*\|$", section("docs/language.md", "## Errors"), re.M)
    return [row.replace("\\|", "|") for row in rows]


def nested_defs(depth: int) -> str:
    calls = "".join(f"def g{i}() = g{i + 1}();\n" for i in range(depth))
    return calls + f"def g{depth}() = 1.0;\nvariant v {{ score = score + g0(); }}"


def chained_lets(depth: int) -> str:
    lets = "".join(f"let a{i + 1} = -a{i};\n" for i in range(depth))
    return f"variant v {{ let a0 = score;\n{lets}score = a{depth}; }}"


def imports_chain(tmp: Path, depth: int) -> str:
    for i in range(depth):
        (tmp / f"c{i}.attn").write_text(f'import "c{i + 1}.attn";\n')
    (tmp / f"c{depth}.attn").write_text("")
    return 'import "c0.attn";\nvariant v { }'


ERROR_SOURCES = {
    "missing ;": "variant v {\n    score = x\n    mask = kv_idx <= q_pos;\n}",
    "missing }": "variant softcap {\n    mask = kv_idx <= q_pos;\n",
    "missing operand": "variant v { score = score + ; }",
    "stray character": "variant v { score = $; }",
    "unclosed string": 'variant v { doc "abc; }',
    "unknown type": "variant v { param x: float; }",
    "keyword": "variant v { param param: f32; }",
    "literal": "variant v { let x = 4294967296; }",
    "deep": "variant v { score = " + "-" * 2001 + "score; }",
    "deep lets": chained_lets(2001),
    "deep defs": nested_defs(2001),
    "int inf": "variant v { score = score + float(int(3.0e38 * 10.0)); }",
    "int nan": "variant v { score = score + float(int(0.0 / (1.0 - 1.0))); }",
    "import passwd": 'import "/etc/passwd";\nvariant v { }',
    "params": "variant v {\n" + "".join(f"param p{i}: f32;\n" for i in range(1025)) + "}",
    "kv_len index": "variant v { param doc: tensor<i32>[kv_len]; mask = doc[kv_idx + 1] == 0; }",
    "batch index": "variant v { param window: tensor<i32>[batch_size]; mask = 0 < window[0]; }",
    "kv_len dim": "variant v { param t: tensor<f32>[num_qo_heads, kv_len]; }",
    "sink kv_idx": "variant v { sink = float(kv_idx); }",
    "sink twice": "variant v {\n    sink = 0.0;\n    sink = 1.0;\n}",
    "sink none": "variant v {\n    sink = 0.0;\n    normalize = none;\n}",
    "lone CR": "variant v { } # note\rvariant w { }\r",
}


def error_source(label: str, tmp: Path) -> tuple[str, str]:
    """(text, file name) of one documented mistake; file-based ones are written under ``tmp``
    (a file that is not UTF-8 fails as it is read)."""
    if label.startswith("import of a file that is not UTF-8 text"):
        (tmp / "x.attn").write_bytes(b"\xff")
        return 'import "x.attn";\nvariant v { }', str(tmp / "main.attn")
    if label == "imports too deep":
        return imports_chain(tmp, 101), str(tmp / "main.attn")
    if label == "bad UTF-8":
        (tmp / "x.attn").write_bytes(b'variant v { doc "\xff"; }')
        return resolve_source(str(tmp / "x.attn"))
    return ERROR_SOURCES[label], "x.attn"


def error_message(label: str, tmp: Path) -> str:
    with pytest.raises(AttnError) as err:
        compile_source(*error_source(label, tmp))
    return err.value.message


FILE_CASES = (
    "import of a file that is not UTF-8 text, or of a link to a file not named `.attn` that "
    "does not parse",
    "imports too deep",
    "bad UTF-8",
)


def test_error_tables_give_the_compilers_messages(tmp_path: Path) -> None:
    produced = []
    for label in (*ERROR_SOURCES, *FILE_CASES):
        case_dir = tmp_path / label.replace(" ", "_")
        case_dir.mkdir()
        produced.append(error_message(label, case_dir))
    assert sorted(produced) == sorted(documented_error_messages())


def test_forbidden_builtin_through_a_let_is_worded_as_documented() -> None:
    with pytest.raises(AttnError) as err:
        compile_source("variant v { let s2 = score * 2.0; mask = s2 > 0.0; }", "x.attn")
    assert err.value.message in " ".join(doc_text("docs/language.md").split())


def test_stdlib_import_is_refused_as_documented() -> None:
    assert '`import "stdlib:causal.attn";` is **not** supported' in doc_text("docs/language.md")
    with pytest.raises(AttnError):
        compile_source('import "stdlib:causal.attn";\nvariant v { }', "x.attn")


# --- the command line -------------------------------------------------------------------------


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli._build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: a for a in parser._actions for flag in a.option_strings}


def attnc_commands() -> list[str]:
    """Every ``attnc SUBCOMMAND ...`` written in the docs' code, with the continuation lines
    of the README's command list joined on."""
    commands = []
    for text in all_code_text():
        for line in text.splitlines():
            if commands and line.startswith("            [") and text.startswith("attnc check"):
                commands[-1] += " " + line.strip()
                continue
            for m in re.finditer(r"(?:^|&& |\()attnc ([^&#`)]*)", line):
                commands.append(m.group(1).strip())
    return commands


def flags_with_values(command: str) -> list[tuple[str, str | None]]:
    """(flag, its documented value) pairs of one command: ``--emit ast|ir`` gives
    ("--emit", "ast|ir")."""
    words = command.replace("[", " ").replace("]", " ").split()
    pairs = []
    for i, word in enumerate(words):
        if re.fullmatch(r"--?[a-z][a-z0-9-]*", word):
            following = words[i + 1] if i + 1 < len(words) else None
            pairs.append((word, following))
    return pairs


def test_documented_commands_and_flags_exist() -> None:
    subs = subparsers()
    seen = set()
    for command in attnc_commands():
        sub, *_ = command.split()
        if sub == "--version":
            continue
        assert sub in subs, command
        known = options(subs[sub])
        for flag, value in flags_with_values(command):
            assert flag in known, f"attnc {command}: {flag}"
            seen.add((sub, flag))
            choices = known[flag].choices
            if choices and value and "|" in value:
                assert set(value.split("|")) == set(choices), f"attnc {command}: {flag}"
    assert ("build", "--arch") in seen and ("test", "--no-gpu") in seen


def test_points_limit_is_as_documented() -> None:
    from attnc.testing.host_test import MAX_POINTS

    assert "`--points` is at most\n10^6" in doc_text("README.md") and MAX_POINTS == 10**6


def readme_command_list() -> str:
    (block,) = [t for _, t in blocks_of_kind("shell") if t.startswith("attnc check")]
    return block


def test_readme_command_list_names_every_subcommand_and_option() -> None:
    block = readme_command_list()
    assert "attnc --version" in block
    for name, sub in subparsers().items():
        assert f"attnc {name}" in block
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert any(flag in block for flag in action.option_strings), f"{name} {action}"


SCRIPT = re.compile(r"python (?:-m ([\w.]+)|(\S+\.py))")


def script_path(command: str) -> Path:
    """The file a ``python X.py`` or ``python -m pkg.mod`` command runs."""
    m = SCRIPT.match(command)
    if m.group(2):
        return ROOT / m.group(2)
    module = ROOT / m.group(1).replace(".", "/")
    return module / "__main__.py" if module.is_dir() else module.with_suffix(".py")


def test_documented_script_commands_exist_with_their_flags() -> None:
    commands = [
        m.group(0)
        for text in all_code_text()
        for m in re.finditer(r"python (?:-m [\w.]+|\S+\.py)[^`#&;)\n]*", text)
    ]
    assert len(commands) >= 5
    for command in (c for c in commands if not c.startswith("python -m pytest")):
        path = script_path(command)
        assert path.is_file(), command
        # the script's folder: its options may be declared by a module beside it
        folder = "".join(p.read_text("utf-8") for p in path.parent.glob("*.py"))
        for flag, _ in flags_with_values(SCRIPT.sub("", command, count=1)):
            assert f'"{flag}"' in folder, command


def test_every_documented_flag_exists_somewhere() -> None:
    sources = [(ROOT / "attnc/cli.py").read_text("utf-8")]
    for folder in ("examples", "benchmarks"):
        sources += [p.read_text("utf-8") for p in (ROOT / folder).rglob("*.py")]
    flags = {
        m.group(1) for d in DOCS for s in inline_spans(d) for m in re.finditer(r"^(--[a-z-]+)", s)
    }
    assert "--points" in flags
    missing = [f for f in sorted(flags) if not any(f'"{f}"' in src for src in sources)]
    assert missing == []


# --- the standard library ---------------------------------------------------------------------


def test_every_stdlib_name_in_the_docs_exists() -> None:
    names = {m for d in DOCS for m in re.findall(r"stdlib:(\w+)", doc_text(d))} - {"NAME"}
    assert names and names <= set(stdlib_names())


def test_readme_lists_every_stdlib_variant_with_its_params() -> None:
    listed = section("README.md", "## Standard library")
    for name in stdlib_names():
        assert f"`{name}`" in listed, name
        (compiled,), _ = compile_source(*resolve_source(f"stdlib:{name}"))
        for param in compiled.variant.params:
            assert f"`{param.name}" in listed, f"{name}: {param.name}"


# --- environment variables --------------------------------------------------------------------


def env_reads(tree: ast.Module) -> set[str]:
    """The ``ATTNC_*`` names one module reads from the environment: ``os.environ.get``,
    ``os.environ[...]``, ``os.getenv`` and ``env_flag``, with a literal or a module constant."""
    constants = {
        t.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for t in node.targets
        if isinstance(t, ast.Name)
    }

    def name_of(arg: ast.expr) -> object:
        return constants.get(arg.id) if isinstance(arg, ast.Name) else getattr(arg, "value", None)

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            callee = ast.unparse(node.func)
            if callee in ("os.environ.get", "os.getenv", "env_flag"):
                found.add(name_of(node.args[0]))
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            if isinstance(node.ctx, ast.Load):
                found.add(name_of(node.slice))
    return {n for n in found if isinstance(n, str) and n.startswith("ATTNC_")}


def package_env_reads() -> set[str]:
    found = set()
    for path in (ROOT / "attnc").rglob("*.py"):
        found |= env_reads(ast.parse(path.read_text("utf-8")))
    return found


def script_env_reads() -> set[str]:
    """``ATTNC_*`` names the scripts and benchmarks read (shell or Python)."""
    text = "".join(p.read_text("utf-8") for p in (ROOT / "scripts").glob("*.sh"))
    text += "".join(p.read_text("utf-8") for p in (ROOT / "benchmarks").rglob("*.py"))
    return set(re.findall(r"ATTNC_[A-Z0-9_]+", text))


def kernel_macros() -> set[str]:
    headers = (ROOT / "attnc/kernels").rglob("*.cuh")
    return {m for h in headers for m in re.findall(r"#define (ATTNC_\w+)", h.read_text("utf-8"))}


def test_documented_environment_variables_are_read() -> None:
    documented = {m for d in DOCS for m in re.findall(r"ATTNC_[A-Z0-9_]+", doc_text(d))}
    macros_named_as_examples = documented & kernel_macros()  # ``ATTNC_HD`` as a param name
    unread = documented - package_env_reads() - script_env_reads() - macros_named_as_examples
    assert unread == set()


def test_every_environment_variable_read_is_documented() -> None:
    reads = package_env_reads()
    assert {"ATTNC_CACHE_DIR", "ATTNC_NVCC", "ATTNC_VERBOSE"} <= reads
    documented = "".join(doc_text(d) for d in DOCS)
    assert sorted(v for v in reads if v not in documented) == []


def test_switch_values_and_lock_timeout_default_are_as_documented() -> None:
    from attnc import verbose
    from attnc.runtime.build import cache

    readme = doc_text("README.md")
    assert "`1`/`true`/`yes`/`on` and `0`/`false`/`no`/`off` or\n  empty" in readme
    assert verbose.FLAG_ON == ("1", "true", "yes", "on")
    assert verbose.FLAG_OFF == ("", "0", "false", "no", "off")
    assert "default 900, `inf`" in readme and cache.DEFAULT_LOCK_TIMEOUT_S == 900


# --- files and modules the docs point at ------------------------------------------------------

REPO_PATH = re.compile(r"(?:attnc|tests|benchmarks|examples|scripts|docs|\.ci)/[\w./*-]*")
INCLUDE_DIR = ROOT / "attnc/kernels/include"  # ``attnc/tile_map.cuh`` is an include path
OUTPUTS = {"benchmarks/results/clients-generate.json"}  # written by the benchmark it documents


def looks_like_a_path(text: str) -> bool:
    """``attnc/sdpa`` (a ratio) is not; a file name, a glob or a folder with ``/`` is."""
    last = text.rstrip("/").rsplit("/", 1)[-1]
    return text.endswith("/") or "." in last or "*" in last


def exists(path: str) -> bool:
    return any(list(base.glob(path)) for base in (ROOT, INCLUDE_DIR))


def test_every_repository_path_in_the_docs_exists() -> None:
    spans = [s for d in DOCS for s in inline_spans(d)]
    links = [m for d in DOCS for m in re.findall(r"\]\(([\w./-]+)\)", doc_text(d))]
    paths = {m.rstrip(".") for s in spans for m in REPO_PATH.findall(s)}
    paths = {p for p in paths if looks_like_a_path(p)} - OUTPUTS
    paths |= {f"docs/{link}" if "/" not in link else link for link in links}
    assert "attnc/runtime/build/backends.py" in paths
    assert [p for p in sorted(paths) if not exists(p)] == []


def test_every_benchmark_module_in_the_docs_exists() -> None:
    modules = {m for d in DOCS for m in re.findall(r"\bbenchmarks\.(\w+)", doc_text(d))}
    assert "timing_probe" in modules
    assert [m for m in sorted(modules) if not (ROOT / "benchmarks" / f"{m}.py").is_file()] == []
