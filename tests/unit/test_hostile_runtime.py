"""Hostile inputs to the runtime's host side: each is refused with a ValueError or TypeError
that names the argument, never a raw RuntimeError, AttributeError or a silently wrong plan."""

from __future__ import annotations

import os
import re
import shutil

import pytest
import torch

import attnc
from attnc import verbose
from attnc.runtime.build import variant_cache
from attnc.runtime.build.backends import PrefillChoice, check_backend
from attnc.runtime.build.cache import file_lock, make_dir
from attnc.runtime.build.toolchain import UnsupportedArch, normalize_arch
from attnc.runtime.checks import tensors
from attnc.runtime.checks.page_status import PageStatus, debug_checks_enabled
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper
from tests.unit.test_decode_fast_path import _inputs, cpu_decode  # noqa: F401 (a fixture)

I32 = dict(dtype=torch.int32)
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="host planner needs nvcc")


def _sparse(t: torch.Tensor) -> torch.Tensor:
    return t.to_sparse()


def _nested(t: torch.Tensor) -> torch.Tensor:
    return torch.nested.nested_tensor([t[:1], t[1:]])


NOT_DENSE = [pytest.param(_sparse, id="sparse"), pytest.param(_nested, id="nested")]


def _prefill(variant: str) -> BatchPrefillWrapper:
    """A prefill wrapper on a CPU workspace whose module choice needs no GPU."""
    w = BatchPrefillWrapper(attnc.load(variant), torch.empty(1 << 20, dtype=torch.uint8))
    module = type("Module", (), {"module_id": "cpu", "ir": w.variant.ir})()
    w._module_choice = lambda *args: PrefillChoice("fa2", module, 128)  # type: ignore[method-assign]
    return w


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("make", NOT_DENSE)
def test_a_tensor_param_that_is_not_dense_is_refused_by_name(make) -> None:
    slopes = make(torch.rand(4))
    q, k = torch.randn(3, 4, 64), torch.randn(3, 2, 64)
    with pytest.raises(ValueError, match=r"^variant 'alibi': param 'slopes' .*: expected a dense"):
        attnc.load("stdlib:alibi").reference(q, k, k, slopes=slopes)


@needs_nvcc
@pytest.mark.nvcc
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("make", NOT_DENSE)
def test_plan_refuses_a_tensor_param_that_is_not_dense(make) -> None:
    w = _prefill("stdlib:per_request_window")
    indptr = torch.tensor([0, 4, 8], **I32)
    window = make(torch.tensor([3, 4], **I32))
    with pytest.raises(ValueError, match=r"^variant 'per_request_window': param 'window' .*dense"):
        w.plan(indptr, indptr, 4, 2, 128, params={"window": window})


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("make", NOT_DENSE)
def test_decode_run_refuses_a_tensor_param_that_is_not_dense(cpu_decode, make) -> None:  # noqa: F811
    w = cpu_decode("alibi")
    q, cache = _inputs()
    with pytest.raises(ValueError, match=r"^variant 'alibi': param 'slopes' .*: expected a dense"):
        w.run(q, cache, slopes=make(torch.rand(4)))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("make", NOT_DENSE)
@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_reference_refuses_data_tensors_that_are_not_dense(make, name) -> None:
    qkv = {"q": torch.randn(3, 4, 64), "k": torch.randn(3, 2, 64), "v": torch.randn(3, 2, 64)}
    qkv[name] = make(qkv[name])
    with pytest.raises(ValueError, match=f"^{name} must be a dense tensor, got a"):
        attnc.load("stdlib:causal").reference(qkv["q"], qkv["k"], qkv["v"])


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("make", NOT_DENSE)
def test_data_tensor_checks_refuse_tensors_that_are_not_dense(make) -> None:
    q = torch.zeros(6, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^k: expected a dense tensor, got a"):
        tensors.check_data_tensor("k", make(q), (None, 4, 64), "cpu")
    with pytest.raises(ValueError, match="^out: expected a dense tensor, got a"):
        tensors.check_out(make(q.clone()), q)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("make", NOT_DENSE)
def test_decode_run_refuses_a_kv_cache_that_is_not_dense(cpu_decode, make) -> None:  # noqa: F811
    w = cpu_decode("vanilla")
    q, cache = _inputs()
    with pytest.raises(ValueError, match="^kv: expected a dense tensor, got a"):
        w.run(q, make(cache))
    with pytest.raises(ValueError, match="^q: expected a dense tensor, got a"):
        w.run(make(q), cache)


def test_merge_state_refuses_states_that_are_not_dense() -> None:
    from attnc.runtime.wrappers.merge import _check

    o, lse = torch.zeros(4, 2, 64), torch.zeros(4, 2)
    with pytest.raises(ValueError, match="^o_a: expected a dense tensor, got a sparse_coo one"):
        _check(o.to_sparse(), lse, o, lse)


@needs_nvcc
@pytest.mark.nvcc
@pytest.mark.parametrize("params", [[("window", 3)], "window=3", 3])
def test_prefill_plan_params_must_be_a_mapping(params) -> None:
    indptr = torch.tensor([0, 4], **I32)
    with pytest.raises(TypeError, match="^params: expected a mapping of param names to values"):
        _prefill("stdlib:sliding_window").plan(indptr, indptr, 4, 2, 128, params=params)


@needs_nvcc
@pytest.mark.nvcc
def test_prefill_plan_param_names_that_are_not_strings_are_unknown_params() -> None:
    indptr = torch.tensor([0, 4], **I32)
    with pytest.raises(ValueError, match="^variant 'sliding_window': unknown param '1'; params"):
        _prefill("stdlib:sliding_window").plan(indptr, indptr, 4, 2, 128, params={1: 3})


@pytest.mark.parametrize("params", [[("window", 3)], "window=3"])
def test_decode_plan_params_must_be_a_mapping(cpu_decode, params) -> None:  # noqa: F811
    w = cpu_decode("sliding_window")
    w._page_status = PageStatus(torch.device("cpu"))
    indptr, last = torch.tensor([0, 1], **I32), torch.tensor([1], **I32)
    with pytest.raises(TypeError, match="^params: expected a mapping of param names to values"):
        w.plan(indptr, indptr, last, 4, 2, 16, 4, params=params)


def test_run_time_param_names_that_are_not_strings_are_unknown_params() -> None:
    q = torch.randn(3, 4, 64)
    values = attnc.load("stdlib:softcap").resolve_for
    with pytest.raises(ValueError, match="^variant 'softcap': unknown param '7'; params are: cap"):
        values({7: 1.0, "cap": 2.0}, (4, 2, 64), q.device, {})


@pytest.mark.parametrize(
    ("capacity", "message"),
    [
        ({"max_num_pages": -1000}, r"max_num_pages: must be in \[1, 2147483647\], got -1000"),
        ({"max_num_pages": 4096.0}, "max_num_pages: expected an int, got float 4096.0"),
        ({"max_work_items": -5}, r"max_work_items: must be in \[1, 2147483647\], got -5"),
        ({"max_work_items": 0}, r"max_work_items: must be in \[1, 2147483647\], got 0"),
        ({"max_work_items": 2.5}, "max_work_items: expected an int, got float 2.5"),
        ({"max_batch_size": True}, "max_batch_size: expected an int, got bool True"),
    ],
)
def test_decode_capacities_are_checked_before_the_layout(capacity, message) -> None:
    """A negative max_num_pages placed kv_token_start inside the work items; floats made the
    region offsets floats."""
    workspace = torch.empty(1 << 20, dtype=torch.uint8)  # the check comes before its device's
    with pytest.raises(ValueError, match=f"^{message}"):
        attnc.BatchDecodeWrapper(attnc.load("stdlib:causal"), workspace, **capacity)


def test_a_bad_default_backend_names_the_environment_variable(monkeypatch) -> None:
    """The caller passed no backend=: the error names where the bad value came from."""
    monkeypatch.setenv("ATTNC_PREFILL_BACKEND", "FA2")
    with pytest.raises(ValueError, match=r"^ATTNC_PREFILL_BACKEND \(the default backend\): "):
        BatchPrefillWrapper(attnc.load("stdlib:causal"), torch.empty(64, dtype=torch.uint8))
    with pytest.raises(ValueError, match="^backend: expected one of"):
        check_backend("fa3")


@pytest.mark.parametrize("arch", [(9,), (8, 0, 0), ()])
def test_a_capability_tuple_of_another_length_is_an_unsupported_arch(arch) -> None:
    with pytest.raises(UnsupportedArch, match=r"^arch '\("):
        normalize_arch(arch)


@pytest.mark.parametrize("below", ["", "modules"])
def test_a_cache_root_in_a_symlink_loop_is_named(tmp_path, monkeypatch, below) -> None:
    """The loop itself was called a file; a directory below it raised a bare ELOOP OSError."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "a"))
    with pytest.raises(NotADirectoryError, match="a symbolic link that loops .*ATTNC_CACHE_DIR"):
        make_dir(tmp_path / "a" / below)


def test_a_dangling_cache_root_is_called_so(tmp_path, monkeypatch) -> None:
    """A cache root that is a symbolic link to nothing was called a file or a loop."""
    (tmp_path / "root").symlink_to(tmp_path / "gone")
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "root"))
    with pytest.raises(NotADirectoryError, match="a symbolic link to nothing .*ATTNC_CACHE_DIR"):
        make_dir(tmp_path / "root")


@pytest.mark.parametrize(
    ("head_dim", "message"),
    [(0, "got 0"), (2**31, "got 2147483648")],
    ids=["empty", "past-int32"],
)
def test_merge_state_refuses_a_head_dim_the_kernel_does_not_serve(head_dim, message) -> None:
    """Head_dim 0 returned an unwritten lse (the launcher returns before the kernel); a head_dim
    past int32 was truncated by the launcher's int32 argument."""
    from attnc.runtime.wrappers.merge import _check

    o, lse = torch.zeros(1, 1, 1).expand(4, 2, head_dim), torch.zeros(4, 2)
    with pytest.raises(
        ValueError, match=rf"^o_a: head_dim \(last dim\) must be in \[1, {2**31 - 1}\], {message}"
    ):
        _check(o, lse, o, lse)


@pytest.mark.parametrize(
    ("arch", "shown"),
    [
        (80.0, "80.0"),
        (8.6, "8.6"),
        (True, "True"),
        ((9.0, 0), r"\(9.0, 0\)"),
        ((8, True), r"\(8, True\)"),
    ],
)
def test_an_arch_that_is_a_float_or_a_bool_is_an_unsupported_arch(arch, shown) -> None:
    """80.0 became "800", which nvcc then refused with its own error; 8.6 and (9.0, 0) were
    taken as 86 and 90a, and True failed with a message naming no type."""
    with pytest.raises(UnsupportedArch, match=rf"^arch '{shown}': expected a string, an int or"):
        normalize_arch(arch)


@pytest.mark.parametrize(
    "arch", ["\u0668\u0660", "\u0668.\u0660", "sm_\u0669\u0660", "\uff18\uff10"]
)
def test_an_arch_in_digits_of_another_script_is_an_unsupported_arch(arch) -> None:
    """'٨٠' (Arabic-Indic digits) was returned as the arch '٨٠' for nvcc to refuse; '٨.٠'
    became '80' through str.isdigit."""
    with pytest.raises(UnsupportedArch, match="attnc builds for CUDA archs sm_80 and newer"):
        normalize_arch(arch)


def test_a_build_lock_that_is_a_directory_is_named(tmp_path, monkeypatch) -> None:
    """It raised a bare IsADirectoryError from open()."""
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path))
    (tmp_path / "m.lock").mkdir()
    message = (
        r"^cannot use .*m\.lock as a build lock: it is a directory, not a file; "
        r"remove it .*ATTNC_CACHE_DIR"
    )
    with pytest.raises(IsADirectoryError, match=message), file_lock(tmp_path / "m.lock"):
        pass


FLAGS = [
    pytest.param("ATTNC_DEBUG_CHECKS", debug_checks_enabled, id="debug-checks"),
    pytest.param("ATTNC_VERBOSE", verbose.verbose, id="verbose"),
    pytest.param("ATTNC_COMPILE_CACHE", variant_cache.enabled, id="compile-cache"),
]


@pytest.mark.parametrize(("name", "read"), FLAGS)
@pytest.mark.parametrize(
    ("text", "on"),
    [("", False), ("0", False), (" False ", False), ("no", False), ("OFF", False)]
    + [("1", True), ("true", True), (" Yes", True), ("on", True)],
)
def test_an_environment_flag_reads_the_usual_words(monkeypatch, name, read, text, on) -> None:
    """ATTNC_DEBUG_CHECKS=false turned on a synchronising check on every run(): each flag was
    on for anything but empty or 0."""
    monkeypatch.setenv(name, text)
    assert read() is on


@pytest.mark.parametrize(("name", "read"), FLAGS)
def test_an_environment_flag_of_another_word_names_the_variable(monkeypatch, name, read) -> None:
    monkeypatch.setenv(name, "enabled")
    with pytest.raises(ValueError, match=f"^{name}: expected 1, true, yes or on .*got 'enabled'"):
        read()


def test_an_unset_environment_flag_is_its_default(monkeypatch) -> None:
    for name in ("ATTNC_DEBUG_CHECKS", "ATTNC_VERBOSE", "ATTNC_COMPILE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    assert not debug_checks_enabled() and not verbose.verbose() and variant_cache.enabled()


@pytest.mark.parametrize(
    ("hq", "hkv", "name", "got"),
    [
        (2**31 - 1, 1, "num_qo_heads", 2**31 - 1),
        (2**30, 2**30, "num_qo_heads", 2**30),
        (4, 2**30, "num_kv_heads", 2**30),
    ],
)
def test_a_head_count_past_the_planners_limit_is_named(hq, hkv, name, got) -> None:
    """The planners take heads below 2**30: prefill plan() passed 2**31 - 1 query heads on to
    the planner, whose error named no argument."""
    indptr = torch.tensor([0, 4], **I32)
    message = rf"^{name}: must be in \[1, 1073741823\], got {got}$"
    with pytest.raises(ValueError, match=message):
        _prefill("stdlib:causal").plan(indptr, indptr, hq, hkv, 128)
    with pytest.raises(ValueError, match=message):
        tensors.check_heads(hq, hkv, 128)  # decode plan() checks its heads here too


def test_a_tensor_param_past_int32_elements_is_refused_by_name() -> None:
    """The kernels index tensor params with 32-bit ints: a [kv_len, 64] tensor over 40M KV
    tokens (2.56e9 elements) was accepted and its far elements would be read at wrapped
    offsets. Expanded, so nothing is allocated."""
    from attnc.compiler.pipeline import compile_source
    from attnc.runtime.checks.params import resolve_params

    src = "variant big { param t: tensor<f32>[kv_len, 64]; score = score + t[kv_idx, 0]; }"
    decls = compile_source(src, "big.attn")[0][0].variant.params
    tokens = 40_000_000
    huge = torch.zeros(1, 1).expand(tokens, 64)
    with pytest.raises(ValueError, match=r"param 't'.*2560000000 elements, more than the kernels"):
        resolve_params(
            decls, {"t": huge}, variant_name="big", num_qo_heads=8, num_kv_heads=8,
            head_dim=64, batch_sizes={"kv_len": tokens, "q_len": 1, "batch_size": 1},
        )  # fmt: skip


@pytest.mark.parametrize("given", [[1.0], (1.0, 2.0), 3.0, None])
def test_merge_state_names_an_argument_that_is_not_a_tensor(given) -> None:
    """A list or a number reached torch's dispatcher first, whose schema error ("Expected a
    value of type 'Tensor' for argument 'o_a'") named no attnc rule."""
    o, lse = torch.zeros(4, 2, 64), torch.zeros(4, 2)
    with pytest.raises(ValueError, match="^o_a: expected a torch.Tensor, got"):
        attnc.merge_state(given, lse, o, lse)
    with pytest.raises(ValueError, match="^lse_b: expected a torch.Tensor, got"):
        attnc.merge_state(o, lse, o, given)


@pytest.mark.parametrize(("hq", "hk"), [(0, 2), (2, 0), (0, 0)])
def test_reference_names_a_q_or_k_without_heads(hq, hk) -> None:
    """Zero heads read "num_qo_heads (0) must be a multiple of num_kv_heads (0)"."""
    causal = attnc.load("stdlib:causal")
    q, k = torch.zeros(3, hq, 64, dtype=torch.float64), torch.zeros(3, hk, 64, dtype=torch.float64)
    with pytest.raises(
        ValueError, match=f"^q and k need at least one head each, got {hq} and {hk}"
    ):
        causal.reference(q, k, k)


@pytest.mark.parametrize("target_exists", [True, False])
def test_a_build_lock_that_is_a_symbolic_link_is_refused(
    tmp_path, monkeypatch, target_exists
) -> None:
    """The lock was opened through the link and the holder's stamp truncated its target (a
    file outside the cache overwritten, or one created there)."""
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    victim = tmp_path / "notes.txt"
    if target_exists:
        victim.write_text("my notes\n")
    (tmp_path / "cache" / "m.lock").symlink_to(victim)
    message = r"^cannot use .*m\.lock as a build lock: it is a symbolic link, not a file; remove it"
    with pytest.raises(OSError, match=message), file_lock(tmp_path / "cache" / "m.lock"):
        pass
    assert victim.read_text() == "my notes\n" if target_exists else not victim.exists()


def test_a_build_lock_that_is_a_pipe_is_refused(tmp_path, monkeypatch) -> None:
    """A FIFO in the lock's place is not taken for the lock."""
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path))
    os.mkfifo(tmp_path / "m.lock")
    with pytest.raises(OSError, match=r"m\.lock as a build lock: it is not a regular file"):
        with file_lock(tmp_path / "m.lock"):
            pass


@pytest.mark.parametrize(("arch", "plain"), [("100a", "100"), ("100f", "100"), ("120a", "120"), ("sm_86f", "86")])  # fmt: skip
def test_an_ahead_of_time_arch_the_runtime_never_looks_up_is_refused(arch, plain) -> None:
    """attnc build --arch 100a built modules under 100a, while the runtime builds and looks
    up 100 for a capability 10.0 device: the serving host ran nvcc after all."""
    from attnc.runtime.build.toolchain import named_arch

    with pytest.raises(UnsupportedArch, match=rf"runtime builds sm_{plain} .*: use {plain}$"):
        named_arch(arch)
    assert named_arch(plain) == plain


@pytest.mark.parametrize("arch", ["80.0", "91", "99", "85", "100.0", 800])
def test_an_ahead_of_time_arch_that_is_no_arch_is_refused_before_nvcc(arch) -> None:
    """'80.0' became 800 and '91' passed: nvcc then failed with its own words."""
    from attnc.runtime.build.toolchain import named_arch

    with pytest.raises(
        UnsupportedArch, match=r"(not a CUDA arch attnc|CUDA archs sm_80 and newer)"
    ):
        named_arch(arch)


@pytest.mark.parametrize(("arch", "text"), [("90", "90a"), ("sm_90a", "90a"), ("8.9", "89"), (121, "121"), ("101", "101")])  # fmt: skip
def test_named_archs_normalise(arch, text) -> None:
    from attnc.runtime.build.toolchain import named_arch

    assert named_arch(arch) == text


@pytest.mark.parametrize("value", [1, "no", None, torch.tensor(True)])
def test_wait_for_tile_map_takes_only_true_or_false(value) -> None:
    workspace = torch.empty(1 << 20, dtype=torch.uint8)
    shown = re.escape(repr(value))
    with pytest.raises(TypeError, match=rf"^wait_for_tile_map: expected .*, got .*{shown}$"):
        BatchPrefillWrapper(attnc.load("stdlib:causal"), workspace, wait_for_tile_map=value)
    for flag in (True, False):
        w = BatchPrefillWrapper(attnc.load("stdlib:causal"), workspace, wait_for_tile_map=flag)
        assert w._wait_for_map is flag
