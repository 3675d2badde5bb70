"""benchmarks/sass_blocks.py on a made-up SASS listing: functions, loops and basic blocks."""

import subprocess
import sys
from pathlib import Path

from benchmarks import sass_blocks as sb

ROOT = Path(__file__).resolve().parents[2]

SASS = """
	code for sm_90a
		Function : _Z3onev
	.headerflags	@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x0 */
        /*0010*/              @!P0 BRA 0x40 ;                             /* 0x0 */
        /*0020*/                   FADD R2, R2, R3 ;                      /* 0x0 */
        /*0030*/                   FADD R2, R2, R3 ;                      /* 0x0 */
        /*0040*/                   HGMMA.64x80x16.F32.BF16 R8, gdesc[UR4], R8 ;  /* 0x0 */
        /*0050*/              @P1 BRA P2, 0x20 ;                          /* 0x0 */
        /*0060*/                   EXIT ;                                 /* 0x0 */
		Function : _Z3twov
        /*0000*/                   BRA 0x0 ;                              /* 0x0 */
"""


def test_functions_loops_and_blocks():
    found = sb.kernels(SASS)
    assert list(found) == ["_Z3onev", "_Z3twov"]
    code = found["_Z3onev"]
    assert len(code) == 7 and code[1] == (0x10, "@!P0 BRA 0x40")
    assert sb.back_edges(code) == [(0x50, 0x20)]
    assert sb.back_edges(found["_Z3twov"]) == [(0x0, 0x0)]
    got = sb.blocks(code, 0x0, 0x70)
    assert [b.start for b in got] == [0x0, 0x20, 0x40, 0x60]
    assert got[1].opcodes() == {"FADD": 2}
    assert got[2].opcodes() == {"HGMMA.64x80x16.F32.BF16": 1, "BRA": 1}
    assert [b.start for b in sb.blocks(code, 0x20, 0x50)] == [0x20, 0x40]


def test_bad_arguments_are_named(tmp_path):
    sass = tmp_path / "k.sass"
    sass.write_text(SASS)

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "benchmarks.sass_blocks", *args],
            cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip

    ok = run(str(sass), "--kernel", "one")
    assert ok.returncode == 0 and "loop: 0x20 .. 0x50 (4 instructions)" in ok.stdout
    blocks = run(str(sass), "--kernel", "one", "--range", "0:70")
    assert blocks.returncode == 0 and "0x20    2 | FADD R2, R2, R3 | FADD:2" in blocks.stdout
    for args, message in [
        ((str(sass), "--kernel", "three"), "no function of"),
        ((str(sass), "--kernel", "("), "not a regular expression"),
        ((str(sass), "--range", "zz"), "want LO:HI in hex"),
        ((str(sass), "--range", "70:20"), "LO must be below HI"),
        ((str(tmp_path / "missing\x1b.sass"),), "cannot read"),
    ]:
        bad = run(*args)
        assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr)
