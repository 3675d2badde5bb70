"""The generated functor's row at the documented request limits (2^31 - 2^16 queries and keys)
under UBSan: ``q_pos = q_idx + kv_len - q_len`` overflowed a signed int on the way (undefined
behaviour, right only because it wrapped)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from attnc.codegen.functor import emit_functor
from attnc.compiler.pipeline import compile_source
from attnc.testing.host_test import INCLUDE_DIR

LIMIT = 2**31 - 2**16

_MAIN = """#include <cstdio>
#include "functor.cuh"
int main() {
  Variant_c::Params p{};
  attnc::RequestInfo r{0, %(n)d, %(n)d, 1, 1, 128, 0.088f, 0, 0};
  Variant_c v(p, r);
  auto row = v.row(%(q)d, 0);
  std::printf("%%d %%d\\n", row.q_pos, int(v.mask(row, 5)));
  return 0;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_row_position_at_the_size_limit_has_no_signed_overflow(tmp_path: Path) -> None:
    compiled, _ = compile_source("variant c { mask = kv_idx <= q_pos; }\n", "c.attn")
    (tmp_path / "functor.cuh").write_text(emit_functor(compiled[0]))
    (tmp_path / "m.cpp").write_text(_MAIN % {"n": LIMIT, "q": LIMIT - 1})
    flags = ["-fsanitize=undefined", "-fno-sanitize-recover=all"]
    cmd = ["g++", "-std=c++17", "-O1", *flags, "-I", INCLUDE_DIR, "-I", str(tmp_path)]
    subprocess.run([*cmd, str(tmp_path / "m.cpp"), "-o", str(tmp_path / "m")], check=True)
    run = subprocess.run([str(tmp_path / "m")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(LIMIT - 1), "1"]
