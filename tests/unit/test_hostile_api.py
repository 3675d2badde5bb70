"""The public API's edges, on the CPU: merge_state's fake against its real results' strides,
the reference over a request without keys that reads a per-token tensor, the checks
``Variant.prefill`` runs while ``torch.compile`` traces it, the host harness's comparison of
non-finite values, the CLI's ``--emit ast --variant`` and repeated ``--param``, and the
example runner on variants with tensor params. Each failed before its fix."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import attnc
from attnc import cli
from attnc.runtime.wrappers import merge
from attnc.testing.host_test import _rel

ROOT = Path(__file__).resolve().parents[2]


def test_merge_states_fake_gives_contiguous_results_as_the_op_does() -> None:
    """The op makes its inputs contiguous and returns contiguous results; the fake kept a
    permuted input's strides, so a compiled merge of permuted states failed its checks."""
    with FakeTensorMode():
        o_a = torch.empty(4, 5, 64, device="cuda").permute(1, 0, 2)
        lse_a = torch.empty(4, 5, device="cuda").t()
        o_b, lse_b = torch.empty(5, 4, 64, device="cuda"), torch.empty(5, 4, device="cuda")
        o, lse = merge._merge_state_fake(o_a, lse_a, o_b, lse_b)
    assert o.shape == (5, 4, 64) and o.is_contiguous()
    assert lse.shape == (5, 4) and lse.is_contiguous()


def test_merge_states_fake_checks_shapes_as_the_op_does() -> None:
    with FakeTensorMode():
        o = torch.empty(5, 64, device="cuda")
        with pytest.raises(ValueError, match="lse_a: expected float32 of shape \\[5\\]"):
            merge._merge_state_fake(o, torch.empty(4, device="cuda"), o, torch.empty(5))


def test_merge_state_names_its_two_dims_rule() -> None:
    with pytest.raises(ValueError, match="o_a: expected at least two dims"):
        merge._check_shapes(torch.zeros(8), torch.zeros(()), torch.zeros(8), torch.zeros(()))


def test_the_reference_reads_a_per_token_tensor_of_a_request_without_keys() -> None:
    """``doc[q_pos]`` of a request without keys indexed an empty tensor (IndexError)."""
    v = attnc.load("stdlib:doc_causal")
    q, k = torch.randn(4, 2, 8), torch.randn(0, 2, 8)
    out, lse = v.reference(q, k, k, doc=torch.zeros(0, dtype=torch.int32), return_lse=True)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, torch.full_like(lse, -torch.inf))


def _traced_prefill(variant: str, v_shape=(20, 2, 64), **kw):
    v = attnc.load(f"stdlib:{variant}")
    with FakeTensorMode() as mode:
        q = torch.empty(9, 8, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(20, 2, 64, dtype=torch.bfloat16, device="cuda")
        vv = torch.empty(*v_shape, dtype=torch.bfloat16, device="cuda")
        with (  # what a compile on this thread sets up
            mock.patch("torch.compiler.is_compiling", return_value=True),
            torch._guards.tracing(torch._guards.TracingContext(mode)),
        ):
            return v.prefill(q, k, vv, **kw)


@pytest.mark.parametrize(
    "kw, words",
    [(dict(v_shape=(3, 1, 64)), "v: expected shape \\[20, 2, 64\\]"),
     (dict(sm_scale=torch.tensor(0.1)), "sm_scale: under torch.compile give a Python float"),
     (dict(sm_scale=-1.0), "sm_scale: must be a finite number > 0"),
     (dict(sm_scale=10**400), "sm_scale: an int from 3402823[0-9]* on is inf")],
)  # fmt: skip
def test_prefill_checks_what_eager_checks_while_traced(kw, words) -> None:
    """The traced branch passed a tensor scale to the op's float argument and checked
    neither v nor the scale's value."""
    with pytest.raises(ValueError, match=words):
        _traced_prefill("softcap", **kw)


def test_a_traced_int_scale_that_rounds_to_the_float32_max_is_taken_as_eager_takes_it() -> None:
    scale = int(3.4028234663852886e38) + 2**100  # float32 rounds it to its largest value
    assert _traced_prefill("softcap", sm_scale=scale).shape == (9, 8, 64)


def _compiled_prefill_scales(scales, fullgraph: bool) -> list[object]:
    """``v.prefill`` compiled by dynamo (backend ``eager``) on CPU tensors, once per scale,
    with the op stubbed: what each call did (the scale the op got, or the error raised)."""
    from attnc.runtime.checks import tensors
    from attnc.runtime.wrappers import single_prefill

    v = attnc.load("stdlib:softcap")
    q, k = torch.randn(9, 8, 64, dtype=torch.bfloat16), torch.randn(20, 2, 64, dtype=torch.bfloat16)

    given: list[object] = []

    def op(handle, q, k, v, sm_scale, *rest):
        given.append(sm_scale)
        return torch.empty_like(q), torch.empty(0)

    on_cpu = functools.partial(tensors.check_data_tensor, device_type="cpu")
    seen: list[object] = []
    with (
        mock.patch.object(tensors, "check_data_tensor", on_cpu),
        mock.patch.object(single_prefill, "single_prefill_op", op),
    ):
        torch._dynamo.reset()
        call = torch.compile(lambda q, k, s: v.prefill(q, k, k, sm_scale=s), backend="eager",
                             fullgraph=fullgraph)  # fmt: skip
        for scale in scales:
            try:
                call(q, k, scale)
                seen.append(given[-1])
            except Exception as exc:  # dynamo may wrap the check's error
                seen.append(exc)
    torch._dynamo.reset()
    return seen


_SCALE_WORDS = ("inf as the kernels", "expected a float", "must be a finite number > 0")


def _names_sm_scale(exc: object) -> bool:
    """``exc`` or an exception it chains (dynamo wraps a traced raise in ``Unsupported``)
    says sm_scale is inf in float32 (the traced check, or eager's after a graph break), no
    float, or not > 0."""
    while isinstance(exc, BaseException):
        text = str(exc)  # dynamo's observed exception: raised exception ValueError("...")
        if isinstance(exc, ValueError) or text.startswith("raised exception ValueError("):
            words = text.removeprefix("raised exception ValueError(").lstrip("'\"")
            if words.startswith("sm_scale: ") and any(w in words for w in _SCALE_WORDS):
                return True
        exc = exc.__cause__ or exc.__context__
    return False


@pytest.mark.parametrize("fullgraph", [True, False])
def test_a_compiled_prefill_names_an_int_scale_past_float32s_range(fullgraph) -> None:
    """Dynamo could not trace float() of an int past float64's range nor struct.pack of
    one past float32's: the call failed with InternalTorchDynamoError: OverflowError, and
    after ints had turned symbolic, an int that float32 rounds to its largest value failed
    on math.isfinite."""
    from attnc.compiler.numeric import F32_INT_LIMIT

    taken = F32_INT_LIMIT - 1  # float32 rounds it to its largest value, as eager takes it
    refused = [F32_INT_LIMIT, 10**400, -(10**400), -3, 0]
    seen = _compiled_prefill_scales([3, 5, 7, taken, *refused], fullgraph)
    assert seen[:4] == [3, 5, 7, taken]
    assert all(_names_sm_scale(exc) for exc in seen[4:]), seen[4:]


@pytest.mark.parametrize("fullgraph", [True, False])
def test_a_compiled_prefill_names_a_symbolic_float_scale_out_of_range(fullgraph) -> None:
    """Formatting a symbolic float into the message failed as dynamo traced it (BUILD_STRING;
    floats are symbolic once they change between calls where dynamo does not specialise them)."""
    with torch._dynamo.config.patch(specialize_float=False):
        seen = _compiled_prefill_scales([0.1, 0.2, 0.3, -1.0, float("inf")], fullgraph)
    assert seen[:3] == [0.1, 0.2, 0.3]
    assert all(_names_sm_scale(exc) for exc in seen[3:]), seen[3:]


def test_the_harness_compares_non_finite_values_by_value() -> None:
    inf, nan = float("inf"), float("nan")
    assert _rel(torch.tensor([1.0, inf]), torch.tensor([1.0, -inf])) == inf
    assert _rel(torch.tensor([nan]), torch.tensor([inf])) == inf
    assert _rel(torch.tensor([1.0, -inf, nan]), torch.tensor([1.0, -inf, nan])) == 0.0


def test_emit_ast_with_a_variant_is_refused(capsys) -> None:
    """It printed the whole file and exited 0 whatever the name."""
    assert cli.main(["compile", "stdlib:causal", "--emit", "ast", "--variant", "nosuch"]) == 1
    assert (
        "--variant: --emit ast prints the syntax tree of the whole file" in capsys.readouterr().err
    )


def test_a_param_given_twice_is_refused(capsys) -> None:
    """The last value won silently."""
    argv = ["test", "stdlib:softcap", "--no-gpu", "--param", "cap=1", "--param", "cap=2"]
    assert cli.main(argv) == 1
    assert "--param: cap is given more than once" in capsys.readouterr().err


@pytest.mark.parametrize(
    "spec",
    ["stdlib:doc_causal", "stdlib:per_request_window", "examples/packed_documents.attn",
     "examples/prefix_lm_windows.attn"],
)  # fmt: skip
def test_the_example_runner_gives_tensor_params_their_declared_shapes(spec) -> None:
    """Every tensor param was ``[num_qo_heads]`` float32: kv_len and batch_size tensors
    were refused."""
    done = subprocess.run(
        [sys.executable, "examples/run_variant.py", spec, "--q-len", "16", "--kv-len", "48"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "float32 reference vs float64" in done.stdout
