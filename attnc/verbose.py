"""The environment's on/off switches, read one way for every layer: :func:`env_flag`, and the
``ATTNC_VERBOSE`` switch (the front end's parser cache and the runtime's builds and backend
choice read it)."""

from __future__ import annotations

import os

FLAG_OFF = ("", "0", "false", "no", "off")
FLAG_ON = ("1", "true", "yes", "on")


def env_flag(name: str, default: bool = False) -> bool:
    """The switch ``$name``: ``default`` when unset; off for empty, ``0``, ``false``, ``no``,
    ``off`` and on for ``1``, ``true``, ``yes``, ``on`` (any case, surrounding spaces
    ignored); anything else is a ``ValueError`` naming the variable and these values."""
    text = os.environ.get(name)
    if text is None:
        return default
    word = text.strip().lower()
    if word in FLAG_OFF:
        return False
    if word in FLAG_ON:
        return True
    raise ValueError(
        f"{name}: expected 1, true, yes or on (on), or 0, false, no, off or empty (off), "
        f"got {text!r}"
    )


def verbose() -> bool:
    """True when ``ATTNC_VERBOSE`` asks for commands, cache paths and reasons on stderr."""
    return env_flag("ATTNC_VERBOSE")
