"""The root folder of attnc's on-disk caches, in one place for every layer: the front end keeps
its parser tables under it (``attnc/dsl/parser_cache.py``) and the runtime its compiled
variants and modules (``attnc/runtime/build/cache.py``)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_VARIABLE = "ATTNC_CACHE_DIR"


def _shown(text: str) -> str:
    """``text`` with control characters escaped (``attnc.dsl.errors.printable``; imported
    here so that this module stays free of the front end at import time)."""
    from attnc.dsl.errors import printable

    return printable(text)


def cache_dir() -> Path:
    """The cache root, an absolute path: ``$ATTNC_CACHE_DIR`` (``~`` expanded, a relative
    path taken from the working directory) or ``~/.cache/attnc``. A ``~user`` that names no
    user, a home directory that cannot be found, or a relative path while the working
    directory is gone, is a ``ValueError`` naming the variable."""
    env = os.environ.get(CACHE_DIR_VARIABLE)
    try:
        root = Path(env).expanduser() if env else Path.home() / ".cache" / "attnc"
    except RuntimeError:  # pathlib: "Could not determine home directory."
        value = f"'{_shown(env)}'" if env else "unset, which means ~/.cache/attnc"
        raise ValueError(
            f"{CACHE_DIR_VARIABLE}: cannot find the home directory of the cache root "
            f"({CACHE_DIR_VARIABLE} is {value}); set it to an absolute path"
        ) from None
    if root.is_absolute():
        return root
    try:
        return Path.cwd() / root
    except OSError as exc:  # the working directory was removed
        raise ValueError(
            f"{CACHE_DIR_VARIABLE}: '{_shown(str(env))}' is a relative path and the working "
            f"directory it is taken from cannot be read ({exc.strerror}); set it to an "
            "absolute path"
        ) from None
