"""The root folder of attnc's on-disk caches, in one place for every layer: the front end keeps
its parser tables under it (``attnc/dsl/parser_cache.py``) and the runtime its compiled
variants and modules (``attnc/runtime/build/cache.py``)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The cache root: ``$ATTNC_CACHE_DIR`` or ``~/.cache/attnc``."""
    env = os.environ.get("ATTNC_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "attnc"
