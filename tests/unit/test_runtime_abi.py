"""The ctypes mirror matches prefill_args.h field for field; Params structs are laid out right."""

import ctypes
import re

import pytest
import torch

from attnc.compiler.ir import ParamDecl
from attnc.runtime import abi
from attnc.runtime.build.cache import INCLUDE_DIR
from attnc.runtime.checks.kv import paged_kv
from attnc.runtime.planning import host_planner_abi
from attnc.runtime.planning.host_planner_abi import HOST_DIR

HEADER = INCLUDE_DIR / "attnc" / "prefill_args.h"
CODES = INCLUDE_DIR / "attnc" / "abi_codes.h"
C_TO_CTYPES = {"int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32, "float": ctypes.c_float}


def _header_fields():
    text = HEADER.read_text()
    body = re.search(r"typedef struct AttncPrefillArgs \{(.*?)\} AttncPrefillArgs;", text, re.S)
    assert body is not None
    fields = []
    for line in body.group(1).splitlines():
        decl = line.split("//")[0].strip()
        if not decl:
            continue
        m = re.fullmatch(r"((?:const\s+)?\w+)\s*(\*?)\s*(.*);", decl)
        assert m is not None, decl
        base, star, names = m.groups()
        for name in names.split(","):
            name = name.strip()
            ctype = ctypes.c_void_p if star else C_TO_CTYPES[base]
            fields.append((name, ctype))
    return fields


def test_prefill_args_mirror_matches_header():
    header = _header_fields()
    assert len(header) == 38
    assert [(n, t) for n, t in abi.AttncPrefillArgs._fields_] == header


def test_abi_version_matches_header():
    version = re.search(r"#define ATTNC_PREFILL_ABI_VERSION (\d+)", HEADER.read_text())
    assert int(version.group(1)) == abi.PREFILL_ABI_VERSION


def test_error_codes_match_header():
    codes = dict(re.findall(r"#define (ATTNC_E_\w+) (\d+)", CODES.read_text()))
    assert {int(v): k for k, v in codes.items()} == abi.ERROR_NAMES
    assert abi.error_name(10002) == "ATTNC_E_BAD_HEAD_DIM"
    assert abi.error_name(2) == "cudaError_t 2"


def test_kv_layout_values_match_header():
    text = HEADER.read_text()
    found = dict(re.findall(r"(ATTNC_KV_\w+) = (\d+)", text))
    assert found == {
        "ATTNC_KV_RAGGED": str(abi.KV_RAGGED),
        "ATTNC_KV_PAGED_NHD": str(abi.KV_PAGED_NHD),
        "ATTNC_KV_PAGED_HND": str(abi.KV_PAGED_HND),
    }


@pytest.mark.parametrize("layout, code", [("NHD", abi.KV_PAGED_NHD), ("HND", abi.KV_PAGED_HND)])
def test_a_paged_cache_carries_its_layouts_code(layout, code):
    assert abi.paged_kv_code(layout) == code
    inner = (16, 2) if layout == "NHD" else (2, 16)
    cache = torch.zeros(3, 2, *inner, 64, dtype=torch.bfloat16)
    assert paged_kv(cache, layout, 16, 2, 64, "cpu").layout == code


def test_prefill_args_layout_is_natural_c_layout():
    # 13 pointers, 7 int64 strides, 9 int32, sm_scale, the params pointer and its size, the
    # page-status pointer, num_pages and its padding, the three language-v2 pointers
    # (kv_token_start, tile_map, tile_map_start), tile_map_kv_block and its tail padding.
    base = 13 * 8 + 7 * 8 + 9 * 4 + 4 + 8 + 8 + 8 + 4 + 4
    assert ctypes.sizeof(abi.AttncPrefillArgs) == base + 3 * 8 + 4 + 4


def test_tile_map_class_values_match_header():
    found = dict(re.findall(r"(ATTNC_TILE_\w+) = (\d+)", HEADER.read_text()))
    assert found == {
        "ATTNC_TILE_EMPTY": str(abi.TILE_EMPTY),
        "ATTNC_TILE_FULL": str(abi.TILE_FULL),
        "ATTNC_TILE_PARTIAL": str(abi.TILE_PARTIAL),
    }


DECLS = (
    ParamDecl("cap", "scalar", "f32", default=1.0),
    ParamDecl("window", "scalar", "i32"),
    ParamDecl("flag", "scalar", "bool", default=False),
    ParamDecl("slopes", "tensor", "f32", ("num_qo_heads",)),
)


def test_params_struct_layout():
    struct = abi.params_struct(DECLS)
    assert [(n, t) for n, t in struct._fields_] == [
        ("p_cap", ctypes.c_float),
        ("p_window", ctypes.c_int32),
        ("p_flag", ctypes.c_int32),
        ("p_slopes", ctypes.c_void_p),
    ]
    assert ctypes.sizeof(struct) == 4 + 4 + 4 + 4 + 8
    assert struct.p_slopes.offset == 16


def test_empty_params_struct_matches_generated_unused_member():
    # The generated Params of a variant without params holds one `int unused_`.
    assert ctypes.sizeof(abi.params_struct(())) == 4


def test_fill_params():
    slopes = torch.ones(4)
    values = {"cap": 2.5, "window": -3, "flag": True, "slopes": slopes}
    filled = abi.fill_params(abi.params_struct(DECLS), DECLS, values)
    assert filled.p_cap == 2.5
    assert filled.p_window == -3
    assert filled.p_flag == 1
    assert filled.p_slopes == slopes.data_ptr()


@pytest.mark.parametrize("flag", [False, True])
def test_fill_bool(flag):
    decls = (ParamDecl("flag", "scalar", "bool"),)
    assert abi.fill_params(abi.params_struct(decls), decls, {"flag": flag}).p_flag == int(flag)


def test_range_row_columns_match_header():
    """The range-row columns of host_planner_abi are mask_range_rows.h's ATTNC_PR_*."""
    header = HOST_DIR / "mask_range_rows.h"
    found = dict(re.findall(r"#define ATTNC_(PR_\w+) (\d+)", header.read_text()))
    mirror = {n: getattr(host_planner_abi, n) for n in dir(host_planner_abi) if n[:3] == "PR_"}
    assert len(found) == 8
    assert {n: int(v) for n, v in found.items()} == mirror
