"""Hostile index tables, arguments and cache files, on the CPU: an empty page table, index
tensors that hold no plain array of ids (meta, sparse, nested), a flag given as a string, a
path object, and cache files replaced by pipes or devices. Each case failed before its fix:
a paged plan read as ragged, a torch-internal error, graph mode turned on by ``"no"``, a
process waiting forever on a pipe."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading

import pytest
import torch

import attnc
from attnc.regular_file import read_regular
from attnc.runtime.build import artifact
from attnc.runtime.planning.tensor_stamps import TensorStamp, check_planned_tensors
from tests.unit.test_prefill_call_memo import HKV, HQ, D, _wrapper, cpu_run  # noqa: F401

I32 = dict(dtype=torch.int32)


def _ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, **I32)


def _within(seconds: float, fn):
    """``fn()``'s result, or a failure when it has not returned after ``seconds`` (a read
    that waits on a pipe would otherwise hang the test run)."""
    box: list[object] = []

    def call() -> None:
        try:
            box.append(fn())
        except Exception as exc:  # raised again in the test's thread
            box.append(exc)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(seconds)
    assert box, f"still waiting after {seconds} s"
    if isinstance(box[0], Exception):
        raise box[0]
    return box[0]


# ---- prefill page tables -------------------------------------------------------------------


def test_an_empty_page_table_for_pages_is_refused_not_planned_as_ragged(cpu_run) -> None:  # noqa: F811
    """An empty kv_indices tensor has data_ptr() 0, which the C++ check took for 'ragged'."""
    w, _ = _wrapper("vanilla")
    with pytest.raises(ValueError, match=r"kv_indices: has 0 entries, but kv_indptr\[-1\] = 3"):
        w.plan(
            _ids(0, 5), _ids(0, 3), HQ, HKV, D,
            kv_indices=_ids(), kv_last_page_len=_ids(-7, 99), page_size=16,
        )  # fmt: skip


def test_a_paged_batch_without_pages_stays_paged(cpu_run) -> None:  # noqa: F811
    """Every request with no page (an empty page table, rightly) is still a paged plan:
    run() takes a paged cache and reads a (k, v) pair as paged caches too."""
    w, _ = _wrapper("vanilla")
    w.plan(
        _ids(0, 5), _ids(0, 0), HQ, HKV, D,
        kv_indices=_ids(), kv_last_page_len=_ids(1), page_size=16,
    )  # fmt: skip
    q = torch.randn(5, HQ, D).bfloat16()
    w.run(q, torch.zeros(2, 2, 16, HKV, D).bfloat16())
    with pytest.raises(ValueError, match=r"k_cache: expected shape \[\*, 16, 2, 64\]"):
        w.run(q, (torch.zeros(0, HKV, D).bfloat16(),) * 2)


def _meta(t: torch.Tensor) -> torch.Tensor:
    return t.to("meta")


def _sparse(t: torch.Tensor) -> torch.Tensor:
    return t.to_sparse()


def _nested(t: torch.Tensor) -> torch.Tensor:
    return torch.nested.nested_tensor([t], layout=torch.jagged)


KINDS = [(_meta, "must be on the CPU or a CUDA device, got meta"),
         (_sparse, "expected a dense tensor, got a sparse_coo one"),
         (_nested, "expected a dense tensor, got a nested one")]  # fmt: skip


@pytest.mark.parametrize("which", ["qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"])
@pytest.mark.parametrize("make, words", KINDS)
def test_prefill_index_tensors_without_plain_ids_are_named(cpu_run, which, make, words) -> None:  # noqa: F811
    """They used to reach torch's copy (NotImplementedError, RuntimeError) instead."""
    w, _ = _wrapper("vanilla")
    tables = {
        "qo_indptr": _ids(0, 5), "kv_indptr": _ids(0, 1),
        "kv_indices": _ids(0), "kv_last_page_len": _ids(3),
    }  # fmt: skip
    tables[which] = make(tables[which])
    with pytest.raises(ValueError, match=f"{which}: {words}"):
        w.plan(
            tables["qo_indptr"], tables["kv_indptr"], HQ, HKV, D,
            kv_indices=tables["kv_indices"], kv_last_page_len=tables["kv_last_page_len"],
            page_size=16,
        )  # fmt: skip


@pytest.mark.parametrize("make, words", KINDS)
def test_decode_page_ids_without_plain_ids_are_named(make, words) -> None:
    """A meta kv_indices passed the decode check as 'host ids' and the planner read address
    0 (a segfault)."""
    from attnc.runtime.wrappers.decode import BatchDecodeWrapper

    w = object.__new__(BatchDecodeWrapper)
    w._device = torch.device("cuda:0")
    with pytest.raises(ValueError, match=f"kv_indices: {words}"):
        w._check_indices(make(_ids(0, 1, 2)))


@pytest.mark.parametrize("flag", ["no", "false", 0, 1, None])
def test_use_cuda_graph_must_be_a_bool(flag) -> None:
    """``bool("no")`` is True: graph mode was turned on by a string."""
    from attnc.runtime.wrappers.decode import BatchDecodeWrapper

    variant = attnc.load("stdlib:causal")
    with pytest.raises(TypeError, match="use_cuda_graph: expected True or False"):
        BatchDecodeWrapper(variant, torch.empty(1 << 20, dtype=torch.uint8), use_cuda_graph=flag)


def test_the_planned_tensor_message_reads_as_a_sentence() -> None:
    t = torch.zeros(2, **I32)
    stamps = {"window": TensorStamp.of(t)}
    t += 1
    with pytest.raises(ValueError) as err:
        check_planned_tensors("v", stamps, {"window": t})
    assert str(err.value).startswith(
        "variant 'v': param 'window': run() was given the planned tensor, written since "
        "plan(); plan() built the work list"
    )


# ---- arguments -----------------------------------------------------------------------------


def test_reference_names_a_head_dim_of_0() -> None:
    """``sm_scale`` None divided by sqrt(0): a ZeroDivisionError."""
    v = attnc.load("stdlib:causal")
    with pytest.raises(ValueError, match="head_dim: q, k and v have a last dim of 0"):
        v.reference(torch.zeros(3, 4, 0), torch.zeros(5, 2, 0), torch.zeros(5, 2, 0))


def test_an_sm_scale_of_many_digits_is_quoted_short() -> None:
    from attnc.runtime.checks import tensors

    with pytest.raises(ValueError) as err:
        tensors.check_sm_scale(10**400, 64)
    assert len(str(err.value)) < 160 and "(401 chars)" in str(err.value)


def test_load_takes_a_path_object(tmp_path) -> None:
    path = tmp_path / "v.attn"
    path.write_text("variant a { mask = kv_idx <= q_pos; }\n")
    assert attnc.load(path).name == "a"
    with pytest.raises(FileNotFoundError):  # a path object is a file, never source text
        attnc.load(pathlib.Path(str(tmp_path / "variant b.attn")))


@pytest.mark.parametrize(
    "spec, why",
    [("a\x00b", "a path cannot hold a NUL byte"),
     ("a" * 5000, "the name is longer than the system allows")],
)  # fmt: skip
def test_text_no_file_can_have_is_a_missing_file(spec, why) -> None:
    """A ValueError (embedded null byte) and an OSError (name too long) before."""
    with pytest.raises(FileNotFoundError, match=f"no such file \\({why}\\)") as err:
        attnc.load(spec)
    assert len(str(err.value)) < 300


def test_build_to_an_output_that_is_a_file_names_it_before_building(tmp_path, capsys) -> None:
    from attnc import cli

    out = tmp_path / "file"
    out.write_text("")
    assert cli.main(["build", "stdlib:causal", "--arch", "80", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"-o: {out} is not a directory" in err and "module(s)" not in err


def test_compile_to_an_output_that_is_a_file_names_it(tmp_path, capsys) -> None:
    """``attnc compile -o FILE`` said only "[Errno 17] File exists", naming neither -o nor
    the problem."""
    from attnc import cli

    out = tmp_path / "file"
    out.write_text("")
    assert cli.main(["compile", "stdlib:causal", "-o", str(out)]) == 1
    assert f"-o: {out} is not a directory" in capsys.readouterr().err


# ---- files that are not regular files ------------------------------------------------------


def test_read_regular_refuses_pipes_devices_and_directories(tmp_path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        _within(10, lambda: read_regular(fifo, 100))
    with pytest.raises(OSError, match="not a regular file"):
        read_regular("/dev/zero", 100)
    with pytest.raises(IsADirectoryError):
        read_regular(tmp_path, 100)
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing", 100)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 1000)
    assert read_regular(big, 10) == b"x" * 11  # limit + 1: the caller sees it is too long


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_build_record_that_is_not_a_file_is_unreadable(tmp_path, special) -> None:
    """A FIFO for built.ok hung the build; a link to /dev/zero read without end."""
    stamp = tmp_path / "built.ok"
    if special == "fifo":
        os.mkfifo(stamp)
    else:
        stamp.symlink_to(special)
    assert _within(10, lambda: artifact._read_record(stamp)) is None


def _load_in_child(cache: pathlib.Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "ATTNC_CACHE_DIR": str(cache)}
    code = "import attnc; print(attnc.load('stdlib:causal').name)"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("folder, pattern", [("compiled", "*.json"), ("parser", "*")])
def test_cache_entries_replaced_by_pipes_are_rebuilt(tmp_path, folder, pattern) -> None:
    """attnc.load waited forever on a FIFO in the compiled-variant or parser cache."""
    cache = tmp_path / "cache"
    assert _load_in_child(cache).stdout.strip() == "causal"
    entries = [p for p in (cache / folder).glob(pattern) if p.is_file()]
    assert entries
    for p in entries:
        p.unlink()
        os.mkfifo(p)
    done = _load_in_child(cache)
    assert done.returncode == 0 and done.stdout.strip() == "causal", done.stderr


@pytest.mark.parametrize(
    "command", [["compile", "stdlib:causal"], ["build", "stdlib:causal", "--arch", "80"]]
)
def test_an_empty_output_directory_is_refused(command, capsys) -> None:
    """``-o ""`` (a script's unset variable) was taken for no -o: compile printed to stdout
    and build filled the default cache."""
    from attnc import cli

    with pytest.raises(SystemExit) as err:
        cli.main([*command, "-o", ""])
    assert err.value.code == 2
    assert "-o/--output-dir: an empty directory name" in capsys.readouterr().err


def test_compile_over_a_pipe_is_refused_not_blocked(tmp_path, capsys) -> None:
    """A FIFO where the output goes: open() for writing blocked forever."""
    from attnc import cli

    os.mkfifo(tmp_path / "causal.cuh")
    assert cli.main(["compile", "stdlib:causal", "-o", str(tmp_path)]) == 1
    assert "causal.cuh exists and is not a regular file" in capsys.readouterr().err


def test_compile_replaces_a_link_not_its_target(tmp_path, capsys) -> None:
    from attnc import cli

    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "causal.cuh").symlink_to(victim)
    assert cli.main(["compile", "stdlib:causal", "-o", str(out)]) == 1
    assert victim.read_text() == "keep\n"


def test_compile_to_a_closed_stdout_is_an_error(monkeypatch, capsys) -> None:
    """With stdout closed (``>&-``) sys.stdout is None: an AttributeError traceback."""
    from attnc import cli

    monkeypatch.setattr("sys.stdout", None)
    assert cli.main(["compile", "stdlib:causal"]) == 1
    assert "stdout is closed; pass -o DIR" in capsys.readouterr().err


def test_compile_writes_a_long_variant_name_to_a_short_file(tmp_path, capsys) -> None:
    """A valid 260-character variant name: '[Errno 36] File name too long'."""
    from attnc import cli

    src = tmp_path / "long.attn"
    src.write_text("variant " + "v" * 260 + " { }\n")
    out = tmp_path / "out"
    assert cli.main(["compile", str(src), "--emit", "ir", "-o", str(out)]) == 0
    (written,) = out.iterdir()
    assert written.suffix == ".ir" and len(written.name) <= 84 and written.name.startswith("vvvv")


def test_emit_opt_of_a_long_conjunction(tmp_path, capsys) -> None:
    """1000 '&&' terms: --emit opt ran its analyses outside the raised recursion limit."""
    from attnc import cli

    src = tmp_path / "and.attn"
    terms = " && ".join(f"kv_idx != {i}" for i in range(1000))
    src.write_text(f"variant v {{ mask = {terms}; }}\n")
    assert cli.main(["compile", str(src), "--emit", "opt"]) == 0
    assert "mask:" in capsys.readouterr().out


def test_last_page_len_names_the_first_request_out_of_range() -> None:
    """Checked as one tensor expression (a loop over 10^6 requests took seconds): the first
    request with pages whose entry is outside [1, page_size] is named; requests without
    pages may hold anything."""
    from attnc.runtime.checks.tensors import check_last_page_len

    n = 1_000_000
    kv_indptr = torch.arange(n + 1, dtype=torch.int32)
    kv_indptr[600_001:] = 600_000  # requests 600000.. have no page
    last = torch.ones(n, dtype=torch.int32)
    last[700_000] = 0  # no pages: accepted
    assert torch.equal(check_last_page_len(last, kv_indptr, 16), last)
    last[500_000], last[500_001] = 17, -1
    with pytest.raises(
        ValueError, match=r"kv_last_page_len\[500000\]=17 is outside \[1, page_size=16\]"
    ):
        check_last_page_len(last, kv_indptr, 16)
    last[400_000] = 0
    with pytest.raises(ValueError, match=r"kv_last_page_len\[400000\]=0 is outside"):
        check_last_page_len(last, kv_indptr, 16)
