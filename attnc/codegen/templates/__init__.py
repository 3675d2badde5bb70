"""Jinja2 templates of the generated artefacts (one per artefact) and their loader."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jinja2


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("attnc.codegen", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_template(template: str, **context: Any) -> str:
    """Render ``templates/<template>`` with ``context`` (undefined names are errors)."""
    return _environment().get_template(template).render(**context)
