"""The ``ATTNC_VERBOSE`` switch, in one place for every layer (the front end's parser cache and
the runtime's builds and backend choice read it)."""

from __future__ import annotations

import os


def verbose() -> bool:
    """True when ``ATTNC_VERBOSE`` asks for commands, cache paths and reasons on stderr."""
    return os.environ.get("ATTNC_VERBOSE", "") not in ("", "0")
