"""Generic fixtures only; builders live in ``helpers.py``. The tests are in folders by kind
(``core/``, ``properties/``, ``wire/``, ...): ``README.md`` here says which is which."""

from __future__ import annotations

import os
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each worker has a core: BLAS threads of its own would only fight the other workers for it
    # (the embedding table's distillation ran a third slower so). Before numpy loads.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import structlog
from helpers import ManualClock
from structlog.testing import capture_logs

# structlog's default renderer draws a logged exception with rich: each frame's source
# highlighted, with its locals. A warning about a Redis that is down took seconds of a core
# so (the Redis restarted mid-session story spent five of its six there); a plain traceback
# says the same.
structlog.configure(
    processors=[
        *structlog.get_config()["processors"][:-1],
        structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback),
    ]
)


@pytest.fixture
def clock() -> ManualClock:
    """A clock that stands still until the test advances it."""
    return ManualClock()


@pytest.fixture
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """Every structlog event emitted during the test, as dicts."""
    with capture_logs() as captured:
        yield captured


#: Files whose tests start first: the longest, so that no worker is left with one at the end.
FIRST = (
    "test_embedding.py",  # distils the static embedding table, half a minute of one core
    "test_examples.py",  # runs every example in a process of its own, a few seconds each
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first; the ``slow`` tier (a real local model) only with ``VOICE_CONTEXT_SLOW=1``."""
    items.sort(key=lambda item: item.path.name not in FIRST)
    if os.environ.get("VOICE_CONTEXT_SLOW") == "1":
        return
    skip = pytest.mark.skip(
        reason="slow tier: needs a real local model; run scripts/models smollm2, then VOICE_CONTEXT_SLOW=1"
    )
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)
