"""Files the caches write get the mode ``open()`` would give (0666 less the umask).

The compiled-variant cache and the parser cache wrote through ``tempfile.mkstemp``, whose
files are 0600: a cache filled by one user (a deployment's build step) was unreadable to
another (its server), which missed every entry and compiled again."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from attnc.regular_file import _umask, temporary_file

LOAD = "import attnc; attnc.load('stdlib:softcap')"


def _modes(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode)
        for p in root.rglob("*")
        if p.is_file()
    }


def test_a_fresh_process_writes_its_cache_entries_as_the_umask_allows(tmp_path: Path) -> None:
    env = {**os.environ, "ATTNC_CACHE_DIR": str(tmp_path)}
    env.pop("ATTNC_COMPILE_CACHE", None)
    script = f"import os; os.umask(0o022); {LOAD}"
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=300)
    modes = _modes(tmp_path)
    assert any(name.startswith("compiled") for name in modes), modes
    assert {name: mode for name, mode in modes.items() if mode != 0o644} == {}


def test_a_temporary_file_takes_the_umask(tmp_path: Path) -> None:
    before = os.umask(0o027)
    try:
        assert _umask() == 0o027 and os.umask(0o027) == 0o027  # read without changing it
        fd, path = temporary_file(tmp_path, ".x.", ".tmp")
        os.close(fd)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    finally:
        os.umask(before)
