"""The alternating attnc/FA4 probe's argument checks and FLOP count (no GPU, no FA4)."""

import pytest

from benchmarks import fa4_alternating as alt


def test_rows_parse_in_order():
    assert alt.parse_rows("8192:128, 2048:64") == [(8192, 128), (2048, 64)]
    assert alt.parse_rows(alt.DEFAULT_ROWS) == [(8192, 128), (8192, 64), (2048, 128)]


@pytest.mark.parametrize(
    "text", ["8192", "8192:96", "0:128", "8k:128", "1:2:3", "8192:128\x1b", "\u00b2:128"]
)
def test_bad_rows_are_named_escaped(text):
    with pytest.raises(ValueError) as err:
        alt.parse_rows(text)
    assert "--rows" in str(err.value) and "\x1b" not in str(err.value)


@pytest.mark.parametrize(
    "argv", [["--rows", "1:7"], ["--rounds", "0"], ["--pause", "nan"], ["--pause", "-1"]]
)
def test_main_refuses_bad_arguments_before_any_gpu_work(argv, capsys):
    with pytest.raises(SystemExit) as done:
        alt.main(argv)
    assert done.value.code == 2
    assert "error" in capsys.readouterr().err


def test_causal_flops_count_the_pairs_as_the_suite_does():
    """The diagonal is visible: L (L + 1) / 2 causal pairs, the count of benchmarks.flops."""
    from benchmarks.flops import prefill_flops
    from benchmarks.workloads import Mask

    assert alt.causal_flops(8192, 128) == 4 * 32 * 128 * 8192 * 8193 / 2
    for length, head_dim in [(1, 64), (7, 128), (2048, 256)]:
        suite = prefill_flops(Mask("causal"), length, length, alt.HQ, head_dim)
        assert alt.causal_flops(length, head_dim) == suite
