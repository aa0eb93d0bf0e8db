"""Summarizers for tests and demos: scripted words, a slow one, a failing one.

They stand in for a model's words only; they never pretend to be a server.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

import anyio

from voice_context.errors import SummarizerError
from voice_context.summarizers.base import Summarizer, SummaryRequest


class ScriptedSummarizer:
    """Answers from a script: each entry is a string to return or an exception to raise.

    When the script runs out, ``default`` (a function of the request) answers.
    Every request is kept in ``requests``.
    """

    def __init__(
        self,
        script: Iterable[str | BaseException] = (),
        *,
        default: Callable[[SummaryRequest], str] | None = None,
    ) -> None:
        self.script: deque[str | BaseException] = deque(script)
        self.default = default or _count_summary
        self.requests: list[SummaryRequest] = []

    @property
    def model(self) -> str:
        return "scripted"

    def __repr__(self) -> str:
        return f"<ScriptedSummarizer left={len(self.script)} calls={len(self.requests)}>"

    async def summarize(self, request: SummaryRequest) -> str:
        self.requests.append(request)
        await anyio.lowlevel.checkpoint()
        if self.script:
            step = self.script.popleft()
            if isinstance(step, BaseException):
                raise step
            return step
        return self.default(request)


class SlowSummarizer:
    """Wraps another summarizer and takes ``delay`` seconds longer to answer."""

    def __init__(self, inner: Summarizer, delay: float) -> None:
        self.inner = inner
        self.delay = delay
        self.started = 0
        self.finished = 0

    @property
    def model(self) -> str:
        return f"slow({self.inner.model})"

    async def summarize(self, request: SummaryRequest) -> str:
        self.started += 1
        await anyio.sleep(self.delay)
        text = await self.inner.summarize(request)
        self.finished += 1
        return text


class FailingSummarizer:
    """Always fails, as a dead endpoint would."""

    def __init__(self, kind: str = "connection", *, retryable: bool = True) -> None:
        self.kind = kind
        self.retryable = retryable
        self.calls = 0

    @property
    def model(self) -> str:
        return "failing"

    async def summarize(self, request: SummaryRequest) -> str:
        self.calls += 1
        await anyio.lowlevel.checkpoint()
        raise SummarizerError(
            f"summarizer unavailable ({self.kind})", retryable=self.retryable, kind=self.kind
        )


def _count_summary(request: SummaryRequest) -> str:
    """A plain, checkable summary: which turns were folded, by whom."""
    if not request.turns:
        return request.previous_summary[: request.max_chars]
    last = request.first_index + len(request.turns) - 1
    speakers = sorted({t.speaker for t in request.turns})
    line = f"Turns {request.first_index}-{last}: {', '.join(speakers)} spoke."
    text = f"{request.previous_summary} {line}".strip()
    return text[-request.max_chars :] if len(text) > request.max_chars else text
