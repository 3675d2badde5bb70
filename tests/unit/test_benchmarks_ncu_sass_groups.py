"""benchmarks.ncu_sass_groups on a small page in Nsight Compute's CSV layout: instructions
that ran equally often form one group, groups are ranked by stall samples with their main
reasons, and a file without the needed columns is refused with its name."""

from __future__ import annotations

import csv

import pytest

from benchmarks.ncu_sass_groups import group_by_count, main, read_page, report

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
          "stall_wait", "stall_short_sb", "stall_wait (Not Issued)"]  # fmt: skip
ROWS = [
    ["0x10", "FFMA R1, R2, R3, R4", "30", "1,200", "20", "10", "5"],
    ["0x20", "MUFU.EX2 R5, R5", "50", "1,200", "5", "45", "1"],
    ["0x30", "STG.E [R6.64], R7", "40", "12", "1", "39", "0"],
    ["0x40", "EXIT", "0", "0", "0", "0", "0"],
]


def _page(tmp_path, header=HEADER, rows=ROWS):
    path = tmp_path / "page.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(["Kernel Name", "k"])
        w.writerow(header)
        w.writerows(rows)
    return path


def test_groups_by_execution_count(tmp_path):
    instructions = read_page(_page(tmp_path))
    assert [i.executed for i in instructions] == [1200, 1200, 12, 0]
    groups = group_by_count(instructions)
    assert [(g.executed_each, len(g.instructions), g.samples) for g in groups] == [
        (1200, 2, 80),
        (12, 1, 40),
    ]
    assert groups[0].top_stalls() == [("short_sb", 55), ("wait", 25)]
    lines = report(instructions, top=5)
    assert lines[0] == "4 instructions, 120 samples, 2412 executed"
    assert "1200x" in lines[1] and "samples  66.7%" in lines[1] and "executed  99.5%" in lines[1]


def test_refuses_a_page_without_the_counters(tmp_path):
    path = _page(tmp_path, header=["Address", "Source"], rows=[["0x10", "NOP"]])
    with pytest.raises(ValueError, match="page.csv"):
        read_page(path)


def test_the_command_line_names_a_bad_argument_or_file(tmp_path, capsys):
    page = _page(tmp_path)
    with pytest.raises(SystemExit):
        main([str(page), "--top", "0"])
    assert "--top must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing.csv")])
    assert "missing.csv" in capsys.readouterr().err
    main([str(page), "--show", "12"])
    out = capsys.readouterr().out
    assert "STG.E [R6.64], R7" in out and out.startswith("4 instructions")
