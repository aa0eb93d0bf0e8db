"""voice-context's loggers: quiet in a program that has not configured logging.

An application that configures structlog gets every line voice-context logs through its own
configuration (``voice-context serve`` does: info and up, to stderr; so do the tests, and
``structlog.testing.capture_logs``). One that never configures it gets warnings and errors
only, on stderr. structlog's own defaults print every level to stdout, which suits an
application's own lines, not a library's among them: a bot that embeds the session manager,
the client or an integration would find compactions and reconnects logged between the lines
it prints.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, cast

import structlog

__all__ = ["get_logger"]

_WARNINGS: Any = structlog.make_filtering_bound_logger(logging.WARNING)  # a class, called as structlog does


def _bound(logger: Any, *, processors: Any, context: Any) -> Any:
    """The bound logger of one use of a voice-context logger (structlog makes one at each use
    until the configuration says to cache it): the configured one, or, with structlog
    unconfigured, warnings and up to stderr through structlog's default processors."""
    if structlog.is_configured():
        wrapper = structlog.get_config()["wrapper_class"]
        return wrapper(logger, processors=processors, context=context)
    return _WARNINGS(structlog.PrintLogger(sys.stderr), processors=processors, context=context)


def get_logger(name: str) -> Any:
    """The logger ``name`` (``voice_context.<part>``), quiet unless structlog is configured."""
    # structlog calls its wrapper class as cls(logger, processors=..., context=...): a function
    # that picks the class at each use stands in for one.
    return structlog.wrap_logger(None, wrapper_class=cast(Any, _bound), logger_factory_args=(name,))
