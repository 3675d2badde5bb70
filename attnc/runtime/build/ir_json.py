"""Owns: turning the compiler's frozen dataclasses (IR, analyses, diagnostics) into plain JSON
data and back, without ever running code named by the data.

The encoding is generic over dataclass fields, so new node kinds and fields need no change
here. Every dataclass instance becomes one row of a node table, children before parents,
and is referred to by its row index; an object reachable twice (a shared sub-expression of
a DAG) is stored once and decoded as one shared object. Decoding accepts only dataclasses
defined in the allowed ``attnc`` modules, requires exactly their init fields, and raises
:class:`DecodeError` for anything else. An IR node's hash is taken as it is decoded (the
rows come children first), as the compiler's passes take it, so a deep expression decoded
here is as cheap to hash as one compiled.

Values: ``None``/``bool``/``int``/``str`` and finite floats are themselves; a tuple is a
JSON list; a non-finite float is ``{"F": "inf"|"-inf"|"nan"}``; a dataclass is
``{"N": row}``; a list is ``{"L": [...]}``; a dict is ``{"D": [[key, value], ...]}``. A file
name (a ``file`` field) is written as the plain string; decoding may give names back as
other strings equal to them (``decode``'s ``files``: a name referring to its text).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Mapping
from typing import Any

from attnc.compiler.ir import ExprNode, ParamDecl, VariantIR, postorder_of

ALLOWED_MODULES = ("attnc.compiler.", "attnc.dsl.")
# The node types that cache their hash (``ir._shared``): decoding takes each one's hash as it
# is built, children first, so no later hash of the IR recurses through its depth.
_HASH_CACHED = (ExprNode, ParamDecl, VariantIR)
_MAX_NODES = 1_000_000


class DecodeError(ValueError):
    """The data is not a valid encoding (wrong shape, unknown type, bad reference)."""


def _type_name(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def _is_instance(obj: object) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def _children(value: object) -> list[object]:
    """Dataclass instances directly inside ``value`` (through plain containers)."""
    if _is_instance(value):
        return [value]
    if isinstance(value, (tuple, list)):
        return [c for item in value for c in _children(item)]
    if isinstance(value, dict):
        return [c for pair in value.items() for item in pair for c in _children(item)]
    return []


def _fields(node: Any) -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(node)


def _node_children(node: object) -> list[object]:
    return [c for f in _fields(node) for c in _children(getattr(node, f.name))]


def _post_order(root: object) -> list[object]:
    """Every dataclass instance reachable from ``root``, each once, children first
    (iterative: deep expression trees need no recursion)."""
    return postorder_of(_children(root), _node_children)


def _encode_value(value: object, index: dict[int, int]) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"F": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if _is_instance(value):
        return {"N": index[id(value)]}
    if isinstance(value, tuple):
        return [_encode_value(v, index) for v in value]
    if isinstance(value, list):
        return {"L": [_encode_value(v, index) for v in value]}
    if isinstance(value, dict):
        return {"D": [[_encode_value(k, index), _encode_value(v, index)] for k, v in value.items()]}
    raise TypeError(f"cannot encode a {type(value).__name__} as data")


def encode(root: object) -> dict[str, Any]:
    """``root`` (dataclasses, tuples, lists, dicts and scalars) as JSON-ready data."""
    nodes = _post_order(root)
    index = {id(n): i for i, n in enumerate(nodes)}
    rows = []
    for node in nodes:
        if not type(node).__module__.startswith(ALLOWED_MODULES):
            raise TypeError(f"cannot encode {_type_name(node)}: not an attnc compiler type")
        fields = {f.name: _encode_value(getattr(node, f.name), index) for f in _fields(node)}
        rows.append({"t": _type_name(node), "f": fields})
    return {"nodes": rows, "root": _encode_value(root, index)}


def _resolve_type(name: object) -> type:
    if not isinstance(name, str) or ":" not in name:
        raise DecodeError(f"bad type name {name!r}")
    module_name, qualname = name.split(":", 1)
    if not module_name.startswith(ALLOWED_MODULES) or not qualname.isidentifier():
        raise DecodeError(f"type {name!r} is not an attnc compiler type")
    try:
        cls = getattr(importlib.import_module(module_name), qualname)
    except (ImportError, AttributeError) as exc:
        raise DecodeError(f"unknown type {name!r}") from exc
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise DecodeError(f"type {name!r} is not a dataclass")
    return cls


def _decode_value(data: Any, nodes: list[object]) -> Any:
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return tuple(_decode_value(v, nodes) for v in data)
    if not isinstance(data, dict) or len(data) != 1:
        raise DecodeError(f"bad value {str(data)[:80]!r}")
    ((tag, body),) = data.items()
    if tag == "N":
        if type(body) is not int or not 0 <= body < len(nodes):
            raise DecodeError(f"bad node reference {body!r}")
        return nodes[body]
    if tag == "F" and body in ("inf", "-inf", "nan"):
        return float(body)
    if tag == "L" and isinstance(body, list):
        return [_decode_value(v, nodes) for v in body]
    if tag == "D" and isinstance(body, list):
        pairs = [_decode_value(p, nodes) for p in body]
        if not all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
            raise DecodeError("bad dict entry")
        return dict(pairs)
    raise DecodeError(f"bad value tag {tag!r}")


def _decode_node(row: Any, nodes: list[object], files: Mapping[str, str]) -> object:
    if not isinstance(row, dict) or set(row) != {"t", "f"} or not isinstance(row["f"], dict):
        raise DecodeError("bad node row")
    cls = _resolve_type(row["t"])
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    if set(row["f"]) != names:
        raise DecodeError(f"{row['t']}: fields {sorted(row['f'])} are not {sorted(names)}")
    values = {k: _decode_value(v, nodes) for k, v in row["f"].items()}
    file = values.get("file")
    if type(file) is str and file in files:
        values["file"] = files[file]
    try:
        node = cls(**values)
        if isinstance(node, _HASH_CACHED):
            hash(node)  # its children's hashes are cached already: this costs one level
    except Exception as exc:  # a constructor check rejected the values (or an unhashable one)
        raise DecodeError(f"{row['t']}: {exc}") from exc
    return node


def decode(data: Any, files: Mapping[str, str] | None = None) -> Any:
    """The object that :func:`encode` turned into ``data``; :class:`DecodeError` otherwise.
    A ``file`` field of a decoded dataclass that is a key of ``files`` takes its value (an
    equal string: a :class:`~attnc.dsl.errors.SourceName` referring to the file's text)."""
    files = {} if files is None else files
    if not isinstance(data, dict) or set(data) != {"nodes", "root"}:
        raise DecodeError("not an encoded object")
    rows = data["nodes"]
    if not isinstance(rows, list) or len(rows) > _MAX_NODES:
        raise DecodeError("bad node table")
    nodes: list[object] = []
    for row in rows:
        nodes.append(_decode_node(row, nodes, files))
    return _decode_value(data["root"], nodes)
