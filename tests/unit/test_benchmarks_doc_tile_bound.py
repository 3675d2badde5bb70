"""The document-row ceiling by tile shape: checked against a direct count on small cases."""

import numpy as np
import pytest

from benchmarks import doc_tile_bound as tb


def test_shapes_parse_and_refuse_escaped():
    assert tb.parse_shapes("192x64, 64x64") == [(192, 64), (64, 64)]
    for bad in ("192", "0x64", "ax64", "64x64x1", "64x\x1b", "\u00b2x64", "1x1", "4x64"):
        with pytest.raises(ValueError) as err:
            tb.parse_shapes(bad)
        assert "\x1b" not in str(err.value)


def test_useful_share_counts_only_tiles_with_a_visible_pair():
    # causal 4x4 in 2x2 tiles: tiles (0,0) 3 of 4, (1,0) 4 of 4, (1,1) 3 of 4; (0,1) empty
    share = tb.useful_share(lambda q, k: k <= q, 4, 2, 2)
    assert share == pytest.approx(10 / 12)
    # one-row tiles waste nothing
    assert tb.useful_share(lambda q, k: k <= q, 5, 1, 1) == 1.0


def test_documents_never_beat_causal_and_one_document_equals_it():
    doc = np.repeat([0, 1, 2], [5, 9, 2])
    rows = tb.bound_rows(doc, [(4, 4), (1, 1)])
    assert rows[0]["documents_over_causal_ceiling"] < 1.0
    assert rows[1]["documents_over_causal_ceiling"] == 1.0
    same = tb.bound_rows(np.zeros(16, dtype=np.int64), [(4, 4)])[0]
    assert same["documents_over_causal_ceiling"] == 1.0


def test_main_refuses_a_bad_shape(capsys):
    with pytest.raises(SystemExit) as done:
        tb.main(["--shapes", "12"])
    assert done.value.code == 2
