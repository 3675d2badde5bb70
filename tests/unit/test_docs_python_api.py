"""What README.md and docs/*.md state of the Python API is true of the code: the Python
examples are valid and name existing objects, and the documented call signatures match the
code. Pure Python: nothing is built."""

from __future__ import annotations

import ast
import importlib
import inspect
import re

import pytest

from tests.unit.test_docs_accuracy import (
    DOCS,
    all_code_text,
    blocks_of_kind,
    doc_text,
    inline_spans,
)

# --- Python examples and names ----------------------------------------------------------------


@pytest.mark.parametrize(("where", "text"), blocks_of_kind("python"))
def test_python_example_is_valid_python(where: str, text: str) -> None:
    compile(text, where, "exec")


def resolve_dotted(name: str) -> object:
    """The object ``attnc.a.b.c`` names: the longest importable module, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def test_every_attnc_name_in_the_docs_exists() -> None:
    names = {m for text in all_code_text() for m in re.findall(r"\battnc(?:\.[A-Za-z_]\w*)+", text)}
    for _, text in blocks_of_kind("python"):
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnc"):
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
    assert "attnc.load" in names and "attnc.runtime.reference.request_reference" in names
    for name in sorted(names):
        resolve_dotted(name)


def test_variant_attributes_in_the_docs_exist() -> None:
    import attnc

    variant = attnc.load("stdlib:softcap")
    runtime = doc_text("docs/runtime.md")  # where ``v`` is a variant (README's is a tensor)
    named = set(re.findall(r"\bv\.(\w+)", runtime))
    named |= {m for d in DOCS for m in re.findall(r"\bVariant\.(\w+)", doc_text(d))}
    assert {"params", "cuda_source", "reference", "prefill", "doc"} <= named
    assert [n for n in sorted(named) if not hasattr(variant, n)] == []


# --- documented signatures --------------------------------------------------------------------


def documented_signature(start: str) -> str:
    """The parameter list of the runtime doc's inline span that starts with ``start``."""
    (span,) = {s for s in inline_spans("docs/runtime.md") if s.startswith(start)}
    return span[span.index("(") + 1 : span.rindex(")")]


def check_signature(documented: str, func) -> None:
    """Every documented parameter is a real one, in the same order and kind, with the same
    default; parameters the doc leaves out must have defaults."""
    actual = [p for p in inspect.signature(func).parameters.values() if p.name != "self"]
    by_name = {p.name: p for p in actual}
    items = [i.strip() for i in documented.split(",")]
    positional_only = "/" in items
    keyword_only, order = False, []
    for item in items:
        if item == "/":
            positional_only = False
            continue
        if item == "*":
            keyword_only = True
            continue
        name, _, default = item.lstrip("*").partition("=")
        param = by_name.get(name)
        assert param is not None, f"{func.__qualname__}: no parameter {name!r}"
        order.append(param)
        if param.kind is not inspect.Parameter.VAR_KEYWORD:
            is_kw = param.kind is inspect.Parameter.KEYWORD_ONLY
            assert is_kw == keyword_only, f"{func.__qualname__}: {name}"
            is_po = param.kind is inspect.Parameter.POSITIONAL_ONLY
            assert is_po == positional_only, f"{func.__qualname__}: {name}"
        if default:
            assert default.replace('"', "'") in (repr(param.default), str(param.default)), name
    assert order == sorted(order, key=actual.index), func.__qualname__
    for param in actual:
        if param not in order and param.kind not in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            assert param.default is not param.empty, f"{func.__qualname__}: {param.name}"


def test_documented_signatures_match_the_code() -> None:
    import attnc

    prefill, decode = attnc.BatchPrefillWrapper, attnc.BatchDecodeWrapper
    cases = {
        "attnc.BatchPrefillWrapper(": prefill.__init__,
        "plan(qo_indptr,": prefill.plan,
        "run(q, kv, /, *": prefill.run,
        "attnc.BatchDecodeWrapper(": decode.__init__,
        "plan(kv_indptr, kv_indices,": decode.plan,
        "run(q, kv_cache, /, *": decode.run,
        "v.reference(q, k, v, /, *": attnc.Variant.reference,
    }
    for start, func in cases.items():
        check_signature(documented_signature(start), func)
