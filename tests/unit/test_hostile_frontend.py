"""Hostile inputs to the front end: each one once gave a raw exception or a wrong result,
and now compiles correctly or fails with a located error."""

from __future__ import annotations

import pytest

from attnc.dsl import ast
from attnc.dsl.errors import AttnError
from attnc.dsl.parser import parse_expr


def test_integer_literal_with_thousands_of_leading_zeros_is_its_value() -> None:
    e = parse_expr("0" * 5000 + "17")
    assert isinstance(e, ast.Num) and e.value == 17 and not e.is_float


def test_long_zero_padded_literal_too_large_for_i32_is_located() -> None:
    text = "1 + " + "0" * 5000 + "4294967296"
    with pytest.raises(AttnError) as info:
        parse_expr(text, "z.attn")
    assert (info.value.loc.file, info.value.loc.col) == ("z.attn", 5)
    assert "too large for i32" in info.value.message
