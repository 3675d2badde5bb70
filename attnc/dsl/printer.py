"""AST -> canonical `.attn` text with the fewest parentheses the precedence rules allow.

Parsing the printed text gives back an equal AST (locations aside).
"""

from __future__ import annotations

from attnc.dsl import ast

INDENT = "    "

# Binding strength: higher binds tighter. Binary operators are left-associative.
TERNARY_PREC = 1
BINARY_PREC: dict[str, int] = {
    "||": 2,
    "&&": 3,
    "==": 4,
    "!=": 4,
    "<": 5,
    "<=": 5,
    ">": 5,
    ">=": 5,
    "+": 6,
    "-": 6,
    "*": 7,
    "/": 7,
    "%": 7,
}
UNARY_PREC = 8
ATOM_PREC = 9


def precedence(expr: ast.Expr) -> int:
    """How tightly ``expr``'s outermost operator binds."""
    if isinstance(expr, ast.Ternary):
        return TERNARY_PREC
    if isinstance(expr, ast.Binary):
        return BINARY_PREC[expr.op]
    if isinstance(expr, ast.Unary):
        return UNARY_PREC
    return ATOM_PREC


def _wrap(expr: ast.Expr, min_prec: int) -> str:
    text = format_expr(expr)
    return f"({text})" if precedence(expr) < min_prec else text


def _number(num: ast.Num) -> str:
    if num.is_float:
        return repr(float(num.value))
    return str(int(num.value))


def _args(args: tuple[ast.Expr, ...]) -> str:
    return ", ".join(format_expr(a) for a in args)


def format_expr(expr: ast.Expr) -> str:
    """Canonical source text of one expression."""
    if isinstance(expr, ast.Num):
        return _number(expr)
    if isinstance(expr, ast.BoolLit):
        return "true" if expr.value else "false"
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Call):
        return f"{expr.func}({_args(expr.args)})"
    if isinstance(expr, ast.Index):
        return f"{expr.name}[{_args(expr.indices)}]"
    if isinstance(expr, ast.Unary):
        return expr.op + _wrap(expr.operand, UNARY_PREC)
    if isinstance(expr, ast.Binary):
        prec = BINARY_PREC[expr.op]
        return f"{_wrap(expr.left, prec)} {expr.op} {_wrap(expr.right, prec + 1)}"
    cond = _wrap(expr.cond, TERNARY_PREC + 1)
    return f"{cond} ? {format_expr(expr.then)} : {_wrap(expr.otherwise, TERNARY_PREC)}"


def _string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _type(typ: ast.ScalarType | ast.TensorType) -> str:
    if isinstance(typ, ast.ScalarType):
        return typ.name
    return f"tensor<{typ.elem}>[{_args(typ.dims)}]"


def format_item(item: ast.VariantItem) -> str:
    """One variant item as a line of text (without indentation)."""
    if isinstance(item, ast.Doc):
        return f"doc {_string(item.text)};"
    if isinstance(item, ast.Param):
        default = "" if item.default is None else f" = {format_expr(item.default)}"
        return f"param {item.name}: {_type(item.type)}{default};"
    if isinstance(item, ast.Let):
        return f"let {item.name} = {format_expr(item.value)};"
    if isinstance(item, ast.Assign):
        return f"{item.target} = {format_expr(item.value)};"
    if isinstance(item, ast.Normalize):
        return f"normalize = {item.mode};"
    return f"kv_layout = {' | '.join(item.layouts)};"


def format_top_item(item: ast.TopItem) -> str:
    """One top-level item: an import, a def, or a whole variant block."""
    if isinstance(item, ast.Import):
        return f"import {_string(item.path)};"
    if isinstance(item, ast.Def):
        return f"def {item.name}({', '.join(item.params)}) = {format_expr(item.body)};"
    body = "".join(f"{INDENT}{format_item(i)}\n" for i in item.items)
    return f"variant {item.name} {{\n{body}}}"


def format_module(module: ast.Module) -> str:
    """Canonical source text of a whole file (items separated by blank lines)."""
    return "".join(format_top_item(item) + "\n\n" for item in module.items).rstrip("\n") + (
        "\n" if module.items else ""
    )
