"""A summarizer for any server that speaks the OpenAI chat-completions API.

That covers OpenAI itself and the usual local servers (llama.cpp, vLLM,
Ollama, LM Studio, ...). The model is given the batch's turns with their dates
and times, and the batch's dated digest (the deterministic summarizer's lines
for it) to rewrite as third-person prose. A summary that does not carry the
batch (the previous one unchanged, or none of the batch's names, numbers and
dates: see :mod:`voice_context.summarizers.check`) is a failed fold: it is
logged (``summary_fold_rejected``) and the deterministic lines stand in for
that batch, folded into the previous summary, so that no turn is lost.

The completion is streamed (``stream=True``), and one attempt is the request
and the whole stream, bounded by ``timeout``. A server like llama.cpp keeps
computing an answer nobody waits for unless the connection drops, so an
attempt that times out, or a compaction that is cancelled, closes its
connection: the server stops generating, and a retry does not queue behind
the abandoned work. A stream that ends without a finish reason (llama.cpp's
Python server cuts one off when another request arrives) is ``interrupted``.
An answer is read up to :func:`answer_limit`, four times the characters it was
asked to fit in: a server that ignores the token cap and sends a megabyte is
cut there (logged as ``summary_answer_cut``) and hung up on, so the fold
check and the session never spend time on text nobody will keep.

Retries, up to ``max_retries`` after the first attempt, follow the ``openai``
client's rules: after a timeout, a dropped connection, an interrupted stream,
a 408, 409, 429 or 5xx, waiting what the answer's ``Retry-After`` asks (up to
a minute) or 0.5 s, 1 s, 2 s, ... (at most 8 s, less a random quarter). A wait
that would not end before the deadline of the caller's scope (the compaction's
timeout) is not begun: the last failure is raised at once, with the
``Retry-After`` it carried, so that a 429 is told as ``rate_limited`` and the
session waits what the provider asked rather than its own backoff.
Whatever still fails is translated into
:class:`~voice_context.errors.SummarizerError` once, here, so nothing from
``openai`` leaks past this module.
"""

from __future__ import annotations

import email.utils
import math
import random
import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from types import TracebackType
from typing import Literal, Self

import anyio
import anyio.lowlevel
import openai
from openai.types.chat import (
    ChatCompletionMessageParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionUserMessageParam,
)

from voice_context.core.session import MAX_REPLY_FACTOR
from voice_context.core.text import normalize
from voice_context.errors import SummarizerError
from voice_context.logs import get_logger
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.check import missing_batch, rewritten_lines
from voice_context.summarizers.compress import compress
from voice_context.summarizers.deterministic import FOLD_THREAD, DeterministicSummarizer
from voice_context.summarizers.prompt import build_line_messages, build_messages

_log = get_logger("voice_context.summarizer")

DIGEST_CHARS = 4000
"""The most a batch's digest may take in the prompt."""

Fold = Literal["lines", "paragraph"]
FOLDS: tuple[Fold, ...] = ("lines", "paragraph")
"""How a model folds a batch: ``lines`` (the default) rewrites the batch's dated notes as
prose, line by line, and keeps the previous summary as it is; ``paragraph`` asks for the
whole summary again, previous summary and batch in one paragraph."""

__all__ = [
    "CHARS_PER_TOKEN",
    "MIN_OUTPUT_TOKENS",
    "OpenAISummarizer",
    "answer_limit",
    "clean_summary",
    "output_token_cap",
    "retry_after",
]

CHARS_PER_TOKEN = 4
"""Characters per token of English prose, the usual rule of thumb."""

MIN_OUTPUT_TOKENS = 16
"""The smallest output cap ever sent, so a tiny budget still leaves room for a sentence."""

INITIAL_RETRY_DELAY = 0.5
"""Seconds before the first retry when the answer asked for no wait; doubled for each next one."""

MAX_RETRY_DELAY = 8.0
"""The longest backoff between two attempts when the answer asked for no wait."""

MAX_RETRY_AFTER = 60.0
"""The longest ``Retry-After`` honoured between two attempts; a longer one ends the attempts."""

RETRY_STATUSES = frozenset({408, 409, 429})
"""HTTP statuses worth another attempt, besides every 5xx."""

TokenCapParam = Literal["max_tokens", "max_completion_tokens"]

_FENCE = re.compile(r"^```[^\n]*\n(?P<body>.*?)\n?```$", re.DOTALL)
_THINKING = re.compile(r"^<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_LABEL = re.compile(
    r"^(?:\*\*|__)?(?:(?:updated|running|new|condensed)\s+)?summary\s*(?::\s*(?:\*\*|__)?|(?:\*\*|__)\s*:)\s*",
    re.IGNORECASE,
)


def answer_limit(max_chars: int) -> int:
    """The most of an answer ever read for a summary of at most ``max_chars`` characters:
    :data:`~voice_context.core.session.MAX_REPLY_FACTOR` times that, which is as far as the
    session reads a summary too. The token cap keeps a model far below it; a server that
    ignores the cap (or a runaway answer) is cut there, before the fold check and the core
    spend time on text nobody will keep, and its connection is closed so that it stops."""
    return MAX_REPLY_FACTOR * max_chars


def output_token_cap(max_chars: int) -> int:
    """The hard cap on output tokens for a summary of at most ``max_chars`` characters.

    The design asks for an output cap that is already *below* the character
    budget: the cap is 90% of the budget at about four characters per token
    (1,200 chars -> 270 tokens, about 1,080 chars of prose). A model that
    writes up to the cap still lands under the budget most of the time; one
    that runs over anyway gets the core's re-compaction pass, and only then
    the sentence-boundary clamp. The cap also bounds what a runaway answer
    can cost.
    """
    return max(MIN_OUTPUT_TOKENS, (max_chars * 9 // 10) // CHARS_PER_TOKEN)


def clean_summary(text: str) -> str:
    """The summary without the wrapping models like to add.

    Strips surrounding whitespace, a leading ``<think>…</think>`` block (from
    reasoning models served locally), one enclosing code fence, and a leading
    ``Summary:`` label (also ``**Summary:**``, ``Updated summary:``, ...).
    """
    text = _THINKING.sub("", text.strip()).strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group("body").strip()
    return _LABEL.sub("", text, count=1).strip()


def _chat_messages(messages: Sequence[dict[str, str]]) -> list[ChatCompletionMessageParam]:
    out: list[ChatCompletionMessageParam] = []
    for message in messages:
        if message["role"] == "system":
            out.append(ChatCompletionSystemMessageParam(role="system", content=message["content"]))
        else:
            out.append(ChatCompletionUserMessageParam(role="user", content=message["content"]))
    return out


def _malformed(detail: str) -> SummarizerError:
    return SummarizerError(f"malformed chat completion: {detail}", retryable=True, kind="malformed")


def _summary_of(content: str) -> str:
    """The summary in a finished answer, or ``SummarizerError(kind="malformed")``."""
    if content.lstrip().lower().startswith("<think>") and "</think>" not in content.lower():
        raise _malformed("the answer stopped inside a <think> block")
    summary = clean_summary(content)
    if not summary:
        raise _malformed("empty content")
    return summary


async def _read_stream(stream: AsyncIterator[object], limit: int) -> str:
    """The text of the first choice of a streamed completion, once it has finished, or its
    first ``limit + 1`` characters as soon as more than ``limit`` have come (the rest is not
    read: the extra character tells that the answer ran past the limit).

    The client does not validate chunks, so every step is checked: JSON of
    the wrong shape comes back as a model with missing or odd attributes.
    Raises ``SummarizerError`` (``malformed``, or ``interrupted`` when the
    stream ends before a chunk gives a finish reason).
    """
    parts: list[str] = []
    read = 0
    finished = False
    async for chunk in stream:
        # the client parses a chunk at a time, but a burst of them in one read would be
        # parsed in one go: let the other sessions' replies in between
        await anyio.lowlevel.checkpoint()
        choices = getattr(chunk, "choices", None)
        if not isinstance(choices, list):
            raise _malformed("a chunk without choices")
        if not choices:
            continue  # the usage chunk some servers send last
        delta = getattr(choices[0], "delta", None)
        content = getattr(delta, "content", None)
        if content is not None and not isinstance(content, str):
            raise _malformed(f"content is {type(content).__name__}, not text")
        if content:
            parts.append(content)
            read += len(content)
            if read > limit:
                return "".join(parts)[: limit + 1]
        if getattr(choices[0], "finish_reason", None):
            finished = True
    if not finished:
        if not parts:
            raise _malformed("no choices")
        raise SummarizerError("the stream ended before the answer did", retryable=True, kind="interrupted")
    return "".join(parts)


def retry_after(headers: Mapping[str, str] | None, now: float) -> float | None:
    """The wait a response asks for, in seconds: ``retry-after-ms``, or ``Retry-After``
    as seconds or as an HTTP date; ``None`` when it asks for none we can read."""
    if headers is None:
        return None
    millis = headers.get("retry-after-ms")
    raw = headers.get("retry-after")
    try:
        if millis is not None:
            seconds = float(millis) / 1000
        elif raw is None:
            return None
        else:
            try:
                seconds = float(raw)
            except ValueError:
                seconds = email.utils.parsedate_to_datetime(raw).timestamp() - now
    except (TypeError, ValueError, OverflowError):
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


_RETRIED = frozenset({"timeout", "connection", "interrupted", "rate_limited", "server_error", "conflict"})
"""The kinds of failure another attempt may get past."""


def _translate(exc: openai.OpenAIError) -> SummarizerError:
    """One ``openai`` failure as a :class:`SummarizerError` (kind and retryable set)."""
    if isinstance(exc, openai.APIStatusError):
        translated = _translate_status(exc)
        translated.retry_after = retry_after(exc.response.headers, time.time())
        return translated
    return _translate_other(exc)


def _translate_status(exc: openai.APIStatusError) -> SummarizerError:
    if isinstance(exc, openai.RateLimitError):
        return SummarizerError(f"summarizer rate limited: {exc}", retryable=True, kind="rate_limited")
    status = exc.status_code
    if status == 408:  # the server gave up waiting: a timeout, whoever noticed it
        return SummarizerError(f"summarizer timed out (408): {exc}", retryable=True, kind="timeout")
    if status == 409:  # a lock timeout, by the API's own account
        return SummarizerError(f"summarizer busy (409): {exc}", retryable=True, kind="conflict")
    if status >= 500:
        return SummarizerError(
            f"summarizer server error {status}: {exc}", retryable=True, kind="server_error"
        )
    return SummarizerError(
        f"summarizer refused the request ({status}): {exc}", retryable=False, kind="bad_request"
    )


def _translate_other(exc: openai.OpenAIError) -> SummarizerError:
    if isinstance(exc, openai.APITimeoutError):
        return SummarizerError(f"summarizer timed out: {exc}", retryable=True, kind="timeout")
    if isinstance(exc, openai.APIConnectionError):
        return SummarizerError(f"cannot reach summarizer: {exc}", retryable=True, kind="connection")
    if isinstance(exc, openai.APIResponseValidationError):
        return _malformed(str(exc))
    return SummarizerError(f"summarizer failed: {exc}", retryable=False, kind="error")


def _fits(wait: float) -> bool:
    """Whether a wait of ``wait`` seconds ends before the deadline of the scope around the call
    (the compaction's timeout, a fallback's deadline). A wait that cannot is not begun: sleeping
    into that deadline would turn the last failure, and the ``Retry-After`` it carries, into a
    timeout, and the session would retry after its own backoff instead of the provider's."""
    return anyio.current_time() + wait < anyio.current_effective_deadline()


class OpenAISummarizer:
    """Folds turns into the summary with one chat-completions call.

    ``base_url`` is the API root (``http://127.0.0.1:8080/v1``); ``None`` means
    the ``openai`` client's default. ``api_key`` defaults to ``"not-needed"``:
    local servers ignore it, and the client insists on having one.
    ``timeout`` (seconds) bounds each attempt, from the request to the end of
    the streamed answer, and ``max_retries`` is how many more attempts are
    made, with backoff, after a timeout, a dropped connection, an interrupted
    stream, a 408, 409, 429 or a 5xx (see the module docstring).

    The output cap is sent as ``max_tokens`` by default, which every
    OpenAI-compatible server understands; pass
    ``token_cap_param="max_completion_tokens"`` for OpenAI models that reject
    ``max_tokens``.

    The batch is compressed first (filler and repeated turns left out, see
    :mod:`voice_context.summarizers.compress`) unless ``compress_input`` is false.

    A pre-built ``client`` can be shared between summarizers: it is used with
    this summarizer's ``timeout`` (and its own retries off, since the attempts
    are made here), ``base_url`` and ``api_key`` are ignored, and
    :meth:`aclose` leaves it open for its owner.
    """

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 20.0,
        max_retries: int = 2,
        temperature: float = 0.0,
        token_cap_param: TokenCapParam = "max_tokens",
        client: openai.AsyncOpenAI | None = None,
        compress_input: bool = True,
        fold: Fold = "lines",
    ) -> None:
        if not model:
            raise ValueError("model must not be empty")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if max_retries < 0:
            raise ValueError(f"max_retries must not be negative, got {max_retries}")
        if fold not in FOLDS:
            raise ValueError(f"fold must be one of {', '.join(FOLDS)}, got {fold!r}")
        self._model = model
        self.fold: Fold = fold
        if fold == "lines":  # the model writes the batch's lines alone: a long summary costs it nothing
            self.preferred_max_summary_chars = DeterministicSummarizer.preferred_max_summary_chars
        self._deterministic = DeterministicSummarizer()
        self._timeout = timeout
        self._max_retries = max_retries
        self._temperature = temperature
        self._token_cap_param: TokenCapParam = token_cap_param
        self._compress = compress_input
        self._owns_client = client is None
        if client is None:
            self._client = openai.AsyncOpenAI(
                base_url=base_url,
                api_key=api_key if api_key is not None else "not-needed",
                timeout=timeout,
                max_retries=0,
            )
        else:
            self._client = client.with_options(timeout=timeout, max_retries=0)

    @property
    def model(self) -> str:
        """The model name sent with every request."""
        return self._model

    def __repr__(self) -> str:
        return (
            f"<OpenAISummarizer model={self._model!r} timeout={self._timeout:g} "
            f"max_retries={self._max_retries}>"
        )

    def digest(self, request: SummaryRequest) -> str:
        """The batch's dated digest: the deterministic summarizer's lines for it alone."""
        if request.recompact or not (request.turns or request.notes):
            return ""
        alone = SummaryRequest(
            previous_summary="",
            turns=request.turns,
            notes=request.notes,
            max_chars=DIGEST_CHARS,
            max_note_chars=request.max_note_chars,
        )
        return self._deterministic.summarize_now(alone)

    async def summarize(self, request: SummaryRequest) -> str:
        """The new summary for ``request``; raises :class:`SummarizerError` on any failure.

        A summary that does not carry the batch is replaced by the deterministic
        fold of the batch into the previous summary (see the module docstring).
        """
        request = self._compressed(request)
        if self.fold == "lines":
            return await self._fold_lines(request)
        digest = await FOLD_THREAD.run(partial(self.digest, request))
        summary = await self._complete(request, digest)
        reason = missing_batch(request, summary, digest)
        if reason is None:
            return summary
        _log.warning(
            "summary_fold_rejected",
            model=self._model,
            reason=reason,
            first_index=request.first_index,
            turns=len(request.turns),
            notes=len(request.notes),
        )
        return await self._deterministic.summarize(request)

    async def _fold_lines(self, request: SummaryRequest) -> str:
        """A ``lines`` fold: the model rewrites the batch's dated digest as prose, line by line;
        each line it rewrote without losing a fact replaces its note, the rest stay notes;
        the previous summary is kept as it is, and the whole is fitted to the ceiling the
        deterministic way (value per char, older lines first). A re-compaction never calls
        the model."""
        digest = await FOLD_THREAD.run(partial(self.digest, request))
        if request.recompact or not digest.strip():
            return await self._deterministic.summarize(request)
        room = min(DIGEST_CHARS, int(len(digest) * 1.5) + 200)
        answer = await self._complete_messages(_chat_messages(build_line_messages(digest)), room)
        lines, kept = rewritten_lines(digest, answer)
        _log.info(
            "summary_lines_folded",
            model=self._model,
            first_index=request.first_index,
            lines=len(lines),
            rewritten=kept,
        )
        previous = normalize(request.previous_summary)
        text = "\n".join([previous, *lines]) if previous else "\n".join(lines)
        fit = SummaryRequest(previous_summary=text, turns=(), max_chars=request.max_chars, recompact=True)
        return await self._deterministic.summarize(fit)

    def _compressed(self, request: SummaryRequest) -> SummaryRequest:
        """The request with its filler and repeated turns left out: fewer tokens sent."""
        if not self._compress or not request.turns:
            return request
        done = compress(request.turns)
        if not done.dropped and done.chars_after == done.chars_before:
            return request
        _log.info(
            "summary_input_compressed",
            model=self._model,
            first_index=request.first_index,
            turns=len(request.turns),
            kept=len(done.turns),
            filler=done.filler,
            exact=done.exact,
            fuzzy=done.fuzzy,
            chars_before=done.chars_before,
            chars_after=done.chars_after,
        )
        return replace(request, turns=done.turns)

    async def _complete(self, request: SummaryRequest, digest: str) -> str:
        messages = _chat_messages(build_messages(request, digest))
        return await self._complete_messages(messages, request.max_chars)

    async def _complete_messages(self, messages: list[ChatCompletionMessageParam], fit: int) -> str:
        """The model's answer to ``messages``, asked to fit in ``fit`` characters (its token
        cap, :func:`output_token_cap`) and read no further than :func:`answer_limit` of them."""
        retries = 0
        while True:
            try:
                return await self._attempt(messages, output_token_cap(fit), answer_limit(fit))
            except SummarizerError as error:
                wait = self._backoff(error, retries)
                if wait is None or not _fits(wait):
                    raise
            retries += 1
            await anyio.sleep(wait)

    def _backoff(self, error: SummarizerError, retries: int) -> float | None:
        """Seconds to wait before the next attempt after ``error``, or ``None``: no more."""
        if retries >= self._max_retries or error.kind not in _RETRIED:
            return None
        if error.retry_after is not None:
            return error.retry_after if error.retry_after <= MAX_RETRY_AFTER else None
        delay = min(INITIAL_RETRY_DELAY * 2.0**retries, MAX_RETRY_DELAY)
        return delay * (1 - 0.25 * random.random())

    async def _attempt(self, messages: list[ChatCompletionMessageParam], cap: int, limit: int) -> str:
        """One request and its whole streamed answer (up to ``limit`` characters), within ``timeout``.

        Leaving the ``async with`` early (the timeout, or a cancellation from
        outside) closes the response, hence the connection, which is what
        tells a local server to stop generating.
        """
        try:
            with anyio.fail_after(self._timeout):
                if self._token_cap_param == "max_completion_tokens":
                    stream = await self._client.chat.completions.create(
                        model=self._model,
                        messages=messages,
                        temperature=self._temperature,
                        max_completion_tokens=cap,
                        stream=True,
                    )
                else:
                    stream = await self._client.chat.completions.create(
                        model=self._model,
                        messages=messages,
                        temperature=self._temperature,
                        max_tokens=cap,
                        stream=True,
                    )
                async with stream:
                    content = await _read_stream(stream, limit)
        except TimeoutError as exc:
            raise SummarizerError(
                f"summarizer timed out: no whole answer in {self._timeout:g}s", retryable=True, kind="timeout"
            ) from exc
        except openai.OpenAIError as exc:
            raise _translate(exc) from exc
        except ValueError as exc:  # a body or an event that is not JSON, or not the expected shape
            raise _malformed(str(exc)) from exc
        if len(content) > limit:
            _log.warning("summary_answer_cut", model=self._model, limit=limit, max_tokens=cap)
        return _summary_of(content)

    async def aclose(self) -> None:
        """Close the HTTP client, unless it was handed in pre-built."""
        if self._owns_client:
            await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
