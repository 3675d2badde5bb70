"""The row pieces of the kernels' online softmax (attnc/online_softmax.cuh) on the CPU: sinks in
the exp2 domain (identity scores in raw-dot units and general scores), the split path that
adds the sink in the merge, and NaN honesty (a NaN score the mask keeps makes O and LSE NaN;
only a row without keys is empty), against an fp64 reference (o = sum e^s v / (e^sink +
sum e^s), LSE with the sink; no key: O 0, LSE sink)."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_fixture import NVCC_MARKS, build_host_fixture

pytestmark = NVCC_MARKS

D = 4


@pytest.fixture(scope="module")
def host_binary(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("softmax_rows") / "softmax_rows_host"
    build_host_fixture("softmax_rows_host.cu", out)
    return out


def reference(scores, visible, v, sink):
    """(o [D], lse, seen) in fp64 for one row (sink -inf: none)."""
    keep = visible.astype(bool)
    s = scores[keep].astype(np.float64)
    vv = v[keep].astype(np.float64)
    if s.size == 0:
        return np.zeros(v.shape[1]), float(sink), False
    if np.isnan(s).any() or math.isnan(sink):
        return np.full(v.shape[1], np.nan), math.nan, True
    m = max(s.max(), sink)
    p = np.exp(s - m)
    denom = p.sum() + (math.exp(sink - m) if sink != -math.inf else 0.0)
    return (p[:, None] * vv).sum(0) / denom, m + math.log(denom), True


def make_case(rng, n, sink, identity, nan_at=None, all_masked=False):
    scores = rng.normal(0.0, 3.0, n).astype(np.float32)
    visible = (rng.random(n) < 0.7).astype(np.int32)
    if all_masked:
        visible[:] = 0
    if nan_at is not None:
        scores[nan_at] = np.nan
        visible[nan_at] = 1
    v = rng.normal(0.0, 1.0, (n, D)).astype(np.float32)
    cut = int(rng.integers(0, n + 1))
    return dict(identity=identity, sm_scale=0.125, sink=sink, scores=scores, visible=visible,
                v=v, cut=cut)  # fmt: skip


def run_cases(binary, cases):
    lines = [str(len(cases))]
    for c in cases:
        lines.append(f"{c['identity']} {c['sm_scale']} {c['sink']!r} {len(c['scores'])} {D}")
        pairs = zip(c["scores"].tolist(), c["visible"].tolist(), strict=True)
        lines += [f"{s!r} {int(m)}" for s, m in pairs]
        lines.append(" ".join(repr(x) for x in c["v"].reshape(-1).tolist()))
        lines.append(str(c["cut"]))
    run = subprocess.run([str(binary)], input="\n".join(lines) + "\n", capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = [line.split() for line in run.stdout.splitlines()]
    assert len(out) == 4 * len(cases)
    return [out[4 * i : 4 * i + 4] for i in range(len(cases))]


def parse(row):
    vals = [float(x) for x in row[1:]]
    return np.array(vals[:D]), vals[D], bool(int(vals[D + 1]))


def check(got, want, tag):
    o, lse, seen = got
    ro, rlse, rseen = want
    assert seen == rseen, tag
    if math.isnan(rlse):
        assert math.isnan(lse) and np.isnan(o).all(), (tag, got)
        return
    assert np.allclose(o, ro, rtol=1e-5, atol=1e-6), (tag, o, ro)
    if rlse == -math.inf:
        assert lse == -math.inf, (tag, lse)
    else:
        assert abs(lse - rlse) <= 1e-5 * max(1.0, abs(rlse)), (tag, lse, rlse)


def test_sinks_match_the_reference_unsplit_and_split(host_binary):
    rng = np.random.default_rng(7)
    cases = []
    for identity in (0, 1):
        for sink in (-math.inf, -30.0, -2.5, 0.0, 1.75, 9.0, 40.0):
            for n in (1, 5, 16, 17, 64, 100):
                cases.append(make_case(rng, n, sink, identity))
            cases.append(make_case(rng, 33, sink, identity, all_masked=True))
    results = run_cases(host_binary, cases)
    for c, (a, s, b, z) in zip(cases, results, strict=True):
        args = (c["scores"], c["visible"], c["v"])
        want = reference(*args, c["sink"])
        check(parse(a), want, "unsplit, sink added at the end")
        check(parse(s), want[:2] + (parse(s)[2],), "unsplit, sink in l from the start")
        check(parse(b), want, "split")
        check(parse(z), reference(*args, -math.inf), "no sink")


def test_row_without_keys_gives_zero_and_the_sink_as_lse(host_binary):
    c = make_case(np.random.default_rng(1), 20, 3.5, 1, all_masked=True)
    ((a, s, b, z),) = run_cases(host_binary, [c])
    for row in (a, b):
        o, lse, seen = parse(row)
        assert not seen and (o == 0).all() and lse == pytest.approx(3.5, abs=1e-6)
    o, lse, _ = parse(s)  # without an output transform `seen` is not needed
    assert (o == 0).all() and lse == pytest.approx(3.5, abs=1e-6)
    o, lse, seen = parse(z)
    assert not seen and (o == 0).all() and lse == -math.inf


@pytest.mark.parametrize("identity", [0, 1])
@pytest.mark.parametrize("where", ["first", "middle", "only"])
def test_nan_score_makes_the_row_nan(host_binary, identity, where):
    """A row whose scores are all NaN, or that meets one NaN among finite ones, is NaN in O and
    LSE (it used to come out as an empty row: O 0, LSE -inf)."""
    rng = np.random.default_rng(3)
    n = 1 if where == "only" else 40
    at = {"first": 0, "middle": 23, "only": 0}[where]
    cases = [make_case(rng, n, sink, identity, nan_at=at) for sink in (-math.inf, 1.0)]
    cases.append(make_case(rng, 1, -math.inf, identity, nan_at=0))
    for a, s, b, z in run_cases(host_binary, cases):
        for row in (a, s, b, z):
            o, lse, seen = parse(row)
            assert seen and math.isnan(lse) and np.isnan(o).all(), (where, row)


def test_nan_sink_makes_the_row_nan(host_binary):
    c = make_case(np.random.default_rng(5), 30, math.nan, 1)
    ((a, s, b, _),) = run_cases(host_binary, [c])
    for row in (a, s, b):
        o, lse, _ = parse(row)
        assert math.isnan(lse) and np.isnan(o).all(), row
