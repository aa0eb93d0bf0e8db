"""Generic fixtures only; builders live in ``helpers.py``."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
from helpers import ManualClock
from structlog.testing import capture_logs


@pytest.fixture
def clock() -> ManualClock:
    """A clock that stands still until the test advances it."""
    return ManualClock()


@pytest.fixture
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """Every structlog event emitted during the test, as dicts."""
    with capture_logs() as captured:
        yield captured
