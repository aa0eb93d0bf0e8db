"""Context sources: what happened around a conversation, folded in beside what was said.

A bot's calendar, its mail, a ticket queue: each compacted window of the
conversation is a stretch of time, and a context source can say what happened in
it ("Dentist at 2 pm, in 45 minutes"). For every fold, :class:`SourcedSummarizer`
asks each configured source for a summary of that window (``from`` / ``to`` in
ISO 8601, UTC, and the source's own prompt), all at once, each within its
``timeout``, and adds what they answer to the new summary as lines of their own,
dated by the window and attributed to the source::

    [1 May 2024, 14:03] calendar (context source): Dentist at 2 pm, in 45 minutes.

So a source's words are stored, restored and shared by replicas with the summary,
age and shrink with it, and reach every later context inside its fence (a record,
not instructions). A source's text is external content: it is flattened to one
line with every fence marker defused (:func:`~voice_context.summarizers.prompt.neutralise`)
and clipped to ``max_chars``, so it can neither close the summary's fence nor pass
for a speaker's line. A source that is slow, fails or answers nothing is skipped
after its timeout and logged (``voice_context_source_skipped``); the fold goes on
without it, and no reply ever waits for a source.

A source is any object with a ``name``, a ``timeout`` and an async
``summary(window) -> str`` (:class:`ContextSource`); :class:`HTTPSource` is one
over HTTP, configured in TOML as ``[[sources]]`` (see docs/model.md, "Context sources").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from voice_context.core.landmarks import stamp
from voice_context.core.text import clip, condense_summary
from voice_context.errors import ConfigError
from voice_context.logs import get_logger
from voice_context.summarizers.base import Summarizer, SummaryRequest
from voice_context.summarizers.prompt import neutralise

if TYPE_CHECKING:
    import httpx

__all__ = ["ContextSource", "HTTPSource", "SourceWindow", "SourcedSummarizer", "source_line", "with_sources"]

log = get_logger("voice_context.sources")

MAX_SOURCE_CHARS = 400
"""A source's answer is clipped to this many chars in the summary."""


@dataclass(frozen=True, slots=True)
class SourceWindow:
    """The stretch of a conversation one fold compacts: from its first turn to its last."""

    session: str
    start: float
    end: float

    @property
    def start_iso(self) -> str:
        return datetime.fromtimestamp(self.start, UTC).isoformat().replace("+00:00", "Z")

    @property
    def end_iso(self) -> str:
        return datetime.fromtimestamp(self.end, UTC).isoformat().replace("+00:00", "Z")


class ContextSource(Protocol):
    """Says what happened in a window of time, from somewhere other than the conversation."""

    @property
    def name(self) -> str: ...

    @property
    def timeout(self) -> float: ...

    async def summary(self, window: SourceWindow) -> str: ...


class HTTPSource:
    """A context source behind an HTTP endpoint: ``POST url`` with the JSON body
    ``{"session", "from", "to", "prompt"}``; the answer is JSON ``{"summary": "..."}`` or plain
    text. Anything but a 2xx is a failure."""

    def __init__(
        self,
        name: str,
        url: str,
        *,
        prompt: str = "",
        timeout: float = 2.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        if not name.strip():
            raise ConfigError("a context source needs a name")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"context source {name!r}: url must be http:// or https://, got {url!r}")
        if timeout <= 0:
            raise ConfigError(f"context source {name!r}: timeout must be positive")
        self.name = name
        self.url = url
        self.prompt = prompt
        self.timeout = timeout
        self.headers = dict(headers or {})
        self._client: httpx.AsyncClient | None = None

    def __repr__(self) -> str:
        return f"<HTTPSource {self.name!r} {self.url} timeout={self.timeout:g}>"

    async def summary(self, window: SourceWindow) -> str:
        if self._client is None:
            import httpx  # on a source's first question: a server with no HTTP source never loads it

            self._client = httpx.AsyncClient(timeout=self.timeout, headers=self.headers)
        body = {"session": window.session, "from": window.start_iso, "to": window.end_iso}
        body["prompt"] = self.prompt
        reply = await self._client.post(self.url, json=body)
        reply.raise_for_status()
        if reply.headers.get("content-type", "").startswith("application/json"):
            data: Any = reply.json()
            text = data.get("summary") if isinstance(data, dict) else None
            return text if isinstance(text, str) else ""
        return reply.text

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def source_line(name: str, window: SourceWindow, text: str, max_chars: int = MAX_SOURCE_CHARS) -> str:
    """A source's answer as a summary line: dated by its window, attributed, one defused line."""
    said = clip(neutralise(text), max_chars)
    return f"[{stamp(window.start)}] {neutralise(name)} (context source): {said}"


class SourcedSummarizer:
    """A summarizer whose folds also carry what the context sources say of each folded window."""

    def __init__(
        self, inner: Summarizer, sources: Sequence[ContextSource], *, close_inner: bool = True
    ) -> None:
        self.inner = inner
        self.sources = tuple(sources)
        self.close_inner = close_inner
        self.skipped = 0
        preferred = getattr(inner, "preferred_max_summary_chars", None)
        if preferred is not None:
            self.preferred_max_summary_chars = preferred

    def __repr__(self) -> str:
        return f"<SourcedSummarizer {self.inner!r} sources={[s.name for s in self.sources]}>"

    @property
    def model(self) -> str:
        return str(getattr(self.inner, "model", "summarizer"))

    async def summarize(self, request: SummaryRequest) -> str:
        if not request.turns or not self.sources:
            return await self.inner.summarize(request)
        window = SourceWindow(request.session, request.turns[0].at, request.turns[-1].at)
        answers: dict[str, str] = {}
        text = ""

        async def fold() -> None:
            nonlocal text
            text = await self.inner.summarize(request)

        async with anyio.create_task_group() as tg:
            tg.start_soon(fold)
            for source in self.sources:
                tg.start_soon(self._ask, source, window, answers)
        lines = [source_line(s.name, window, answers[s.name]) for s in self.sources if answers.get(s.name)]
        if not lines:
            return text
        merged = "\n".join(part for part in (text, *lines) if part)
        if len(merged) > request.max_chars:
            merged = condense_summary(merged, request.max_chars)
        return merged

    async def _ask(self, source: ContextSource, window: SourceWindow, answers: dict[str, str]) -> None:
        reason = "empty"
        try:
            with anyio.fail_after(source.timeout):
                said = await source.summary(window)
            if said.strip():
                answers[source.name] = said
                return
        except TimeoutError:
            reason = "timeout"
        except Exception as exc:  # a source is someone else's service: any failure skips it
            reason = f"{type(exc).__name__}: {exc}"
        self.skipped += 1
        log.warning(
            "voice_context_source_skipped",
            source=source.name,
            session=window.session,
            window=[window.start_iso, window.end_iso],
            reason=reason,
        )

    async def aclose(self) -> None:
        for source in self.sources:
            close = getattr(source, "aclose", None)
            if close is not None:
                await close()
        close_inner = getattr(self.inner, "aclose", None)
        if self.close_inner and close_inner is not None:
            await close_inner()


def with_sources(
    summarizer: Summarizer, sources: Sequence[ContextSource], *, close_inner: bool = True
) -> Summarizer:
    """``summarizer``, asking ``sources`` at every fold (itself when there are none);
    ``close_inner``: whether closing it closes ``summarizer`` too."""
    return SourcedSummarizer(summarizer, sources, close_inner=close_inner) if sources else summarizer
