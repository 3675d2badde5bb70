"""resolve_params: defaults, exact error messages, no silent casts (CPU tensors only)."""

import re
from collections.abc import Mapping

import pytest
import torch

from attnc.compiler.ir import ParamDecl
from attnc.runtime.checks.params import check_params_arg, describe_decl, resolve_params

WINDOW = ParamDecl("window", "scalar", "i32")
CAP = ParamDecl("cap", "scalar", "f32", default=50.0)
FLAG = ParamDecl("causal", "scalar", "bool", default=True)
SLOPES = ParamDecl("slopes", "tensor", "f32", ("num_qo_heads",))
TABLE = ParamDecl("table", "tensor", "i32", ("num_kv_heads", 3))
DECLS = (WINDOW, CAP, FLAG, SLOPES, TABLE)


def _resolve(decls=DECLS, device=None, **kwargs):
    return resolve_params(
        decls,
        kwargs,
        variant_name="v",
        num_qo_heads=4,
        num_kv_heads=2,
        head_dim=64,
        device=device,
    )


def _good(**over):
    kw = {
        "window": 8,
        "slopes": torch.arange(4, dtype=torch.float32),
        "table": torch.zeros(2, 3, dtype=torch.int32),
    }
    kw.update(over)
    return kw


def test_defaults_and_order():
    out = _resolve(**_good())
    assert list(out) == ["window", "cap", "causal", "slopes", "table"]
    assert out["window"] == 8 and type(out["window"]) is int
    assert out["cap"] == 50.0 and type(out["cap"]) is float
    assert out["causal"] is True
    assert torch.equal(out["slopes"], torch.arange(4, dtype=torch.float32))


def test_int_accepted_for_f32():
    out = _resolve(**_good(cap=30))
    assert out["cap"] == 30.0 and type(out["cap"]) is float


def test_missing_required_message():
    decls = (WINDOW,)
    with pytest.raises(ValueError) as e:
        resolve_params(
            decls, {}, variant_name="sliding_window", num_qo_heads=1, num_kv_heads=1, head_dim=64
        )
    assert str(e.value) == "variant 'sliding_window': missing param 'window' (i32)"


def test_missing_tensor_message():
    kw = _good()
    del kw["slopes"]
    with pytest.raises(
        ValueError, match=re.escape("missing param 'slopes' (tensor<f32>[num_qo_heads])")
    ):
        _resolve(**kw)


def test_unknown_param_suggests_closest():
    with pytest.raises(ValueError) as e:
        _resolve(**_good(windw=3))
    assert str(e.value) == "variant 'v': unknown param 'windw'; did you mean 'window'?"


def test_unknown_param_no_params():
    with pytest.raises(ValueError) as e:
        _resolve(decls=(), x=1)
    assert str(e.value) == "variant 'v': unknown param 'x'; this variant takes no params"


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("cap", True, "param 'cap' (f32): expected a float, got bool"),
        ("cap", "1.0", "param 'cap' (f32): expected a float, got str"),
        ("window", 2.0, "param 'window' (i32): expected an int, got float"),
        ("window", False, "param 'window' (i32): expected an int, got bool"),
        ("window", 2**31, "param 'window' (i32): value 2147483648 does not fit in int32"),
        ("causal", 1, "param 'causal' (bool): expected a bool, got int"),
    ],
)
def test_wrong_scalar_type(name, value, expected):
    with pytest.raises(ValueError) as e:
        _resolve(**_good(**{name: value}))
    assert str(e.value) == "variant 'v': " + expected


def test_tensor_wrong_shape():
    with pytest.raises(ValueError) as e:
        _resolve(**_good(table=torch.zeros(4, 3, dtype=torch.int32)))
    assert str(e.value) == (
        "variant 'v': param 'table' (tensor<i32>[num_kv_heads, 3]): "
        "expected shape [2, 3], got [4, 3]"
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int32])
def test_tensor_wrong_dtype_is_not_cast(dtype):
    with pytest.raises(ValueError) as e:
        _resolve(**_good(slopes=torch.zeros(4, dtype=dtype)))
    assert str(e.value) == (
        f"variant 'v': param 'slopes' (tensor<f32>[num_qo_heads]): expected dtype torch.float32, "
        f"got {dtype} (no implicit casts)"
    )


def test_tensor_not_a_tensor():
    with pytest.raises(
        ValueError,
        match=re.escape(
            "param 'slopes' (tensor<f32>[num_qo_heads]): expected a torch.Tensor, got list"
        ),
    ):
        _resolve(**_good(slopes=[1.0, 2.0, 3.0, 4.0]))


def test_tensor_wrong_device_names_both():
    with pytest.raises(ValueError) as e:
        _resolve(device="meta", **_good())
    assert str(e.value) == (
        "variant 'v': param 'slopes' (tensor<f32>[num_qo_heads]): tensor is on cpu, expected meta"
    )


def test_tensor_made_contiguous():
    t = torch.arange(8, dtype=torch.float32)[::2]
    assert not t.is_contiguous()
    out = _resolve(device="cpu", **_good(slopes=t))
    assert out["slopes"].is_contiguous()
    assert torch.equal(out["slopes"], torch.tensor([0.0, 2.0, 4.0, 6.0]))


def test_describe_decl():
    assert describe_decl(TABLE) == "tensor<i32>[num_kv_heads, 3]"
    assert describe_decl(CAP) == "f32"


def test_a_params_mapping_is_read_once_into_a_dict() -> None:
    """A mapping other than a dict is read once (its ``items()``), and a failure of that
    read is a TypeError naming ``params`` with the caller's message escaped."""

    class Items(Mapping):
        def __init__(self, items):
            self._items = items

        def __getitem__(self, key):
            raise KeyError(key)  # never read: the items are

        def __iter__(self):
            return iter(k for k, _ in self._items())

        def __len__(self) -> int:
            return 1

        def items(self):  # type: ignore[override]
            return self._items()

    read = check_params_arg(Items(lambda: [("cap", 30.0)]))
    assert type(read) is dict and read == {"cap": 30.0}

    def boom():
        raise RuntimeError("boom\x1b[2J")

    with pytest.raises(
        TypeError, match=r"^params: its items could not be read \(RuntimeError: boom\\x1b\[2J\)$"
    ):
        check_params_arg(Items(boom))
