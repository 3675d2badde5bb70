"""Shared test options: ``--update-golden`` regenerates tests/codegen/golden/."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite the golden files of tests/codegen/test_golden.py instead of comparing",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when the run was started with ``--update-golden``."""
    return bool(request.config.getoption("--update-golden"))
