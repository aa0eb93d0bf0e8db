"""What the examples (``examples/``) run against when no real service is named, so that each runs
offline in one command: a voice-context server in this process unless ``VOICE_CONTEXT_URL``
names one, and a stand-in for OpenAI's API unless ``OPENAI_API_KEY`` is set.

    async with voice_context_url() as url, openai_stand_in():
        ...  # Client(url); AsyncOpenAI(), and pipecat's and LiveKit's OpenAI services, reach the stand-in
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from voice_context.config import Settings
from voice_context.server import Server
from voice_context.testing.answers import answer_chat
from voice_context.testing.openai_server import OpenAIServer, ReplyWith

__all__ = ["openai_stand_in", "voice_context_url"]

STAND_IN_KEY = "stand-in"
"""The API key the OpenAI clients send the stand-in (it takes any)."""


@asynccontextmanager
async def voice_context_url() -> AsyncIterator[str]:
    """The server ``VOICE_CONTEXT_URL`` names, when it is set; otherwise the URL of a
    voice-context server this process runs for the block, as ``voice-context serve --port 0
    --store memory`` would: on 127.0.0.1 at a free port, the sessions in memory, the
    deterministic summarizer."""
    url = os.environ.get("VOICE_CONTEXT_URL")
    if url:
        yield url
        return
    settings = Settings().with_values("server", {"port": 0}).with_values("store", {"url": "memory"})
    async with Server(settings) as server:
        yield server.url


@asynccontextmanager
async def openai_stand_in() -> AsyncIterator[OpenAIServer | None]:
    """Unless ``OPENAI_API_KEY`` is set (then OpenAI answers, and this yields ``None``), an
    OpenAI-compatible stand-in on 127.0.0.1 for the block, whose words quote its prompt
    (:func:`~voice_context.testing.answers.answer_chat`): what the bot says is what its memory
    gave it. The OpenAI clients made in the block (``openai.AsyncOpenAI()``, and the OpenAI
    services of pipecat and LiveKit, which make one) reach it through ``OPENAI_BASE_URL`` and
    ``OPENAI_API_KEY``, set for the block and restored after."""
    if os.environ.get("OPENAI_API_KEY"):
        yield None
        return
    async with OpenAIServer(default=ReplyWith(answer_chat)) as server:
        with _environment(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY=STAND_IN_KEY):
            yield server


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
