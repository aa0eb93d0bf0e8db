"""A real pipecat pipeline (pipecat's own test runner) with the voice-context processor in it,
against a real server on 127.0.0.1, and against one that is down."""

from __future__ import annotations

from typing import Any

import pytest
from pipecat.frames.frames import LLMContextFrame, VisionTextFrame
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.tests.utils import run_test
from serving import running, settings
from structlog.testing import capture_logs

from voice_context.client import Client
from voice_context.integrations.pipecat import VoiceContextProcessor
from voice_context.summarizers.deterministic import DeterministicSummarizer

SYSTEM = {"role": "system", "content": "You are Nova, a travel agent."}
TALK: list[dict[str, Any]] = [
    SYSTEM,
    {"role": "user", "content": "Let's book Lisbon for May 3rd, flying out of Porto."},
    {"role": "assistant", "content": "Sure. For how many people?"},
    {"role": "user", "content": [{"type": "text", "text": "Two of us, window seats please."}]},
]


def frame(messages: list[dict[str, Any]]) -> LLMContextFrame:
    return LLMContextFrame(context=LLMContext(messages=list(messages)))  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_each_llm_run_stores_the_new_words_and_gets_the_remembered_context() -> None:
    async with running(settings(), summarizer=DeterministicSummarizer()) as server:
        processor = VoiceContextProcessor(server.url, session="call-7", budget_chars=4000, timeout=5)
        first, second = (
            frame(TALK),
            frame([*TALK, {"role": "assistant", "content": "Two window seats, noted."}]),
        )
        down, _ = await run_test(
            processor,
            frames_to_send=[first, VisionTextFrame(text="a seat map of a plane"), second],
            expected_down_frames=[LLMContextFrame, VisionTextFrame, LLMContextFrame],
        )
        async with Client(server.url) as client:
            room = await client.open("call-7")
            state = await room.state()
            context = await room.context("messages")
    assert state["turns"] == 4, "three words of the first run, one new in the second; none twice"
    assert state["live_notes"] == 1
    sent = [f.context.get_messages() for f in down if isinstance(f, LLMContextFrame)]
    assert sent[0] is not first.context.get_messages(), "the pipeline's own context is left as it was"
    assert first.context.get_messages() == TALK
    assert sent[0][0] == SYSTEM  # the pipeline's system messages first, then what voice-context keeps
    last = sent[1]
    assert last[1:] == context["messages"]
    assert any("a seat map of a plane" in str(m["content"]) for m in last), "the vision note reached the LLM"
    assert last[-1]["content"] == "Two window seats, noted."
    assert (processor.replaced, processor.fallbacks) == (2, 0)


@pytest.mark.asyncio
async def test_when_voice_context_is_down_the_llm_gets_the_pipelines_own_context_at_once() -> None:
    async with running(settings()) as server:
        url = server.url  # a port nobody listens on once this server stops
    processor = VoiceContextProcessor(url, session="call-7", timeout=0.5)
    first = frame(TALK)
    with capture_logs() as logs:
        down, _ = await run_test(processor, frames_to_send=[first], expected_down_frames=[LLMContextFrame])
    (sent,) = down
    assert isinstance(sent, LLMContextFrame) and sent.context is first.context
    assert processor.fallbacks == 1
    assert [e["event"] for e in logs if e["event"].startswith("voice_context_pipecat")] == [
        "voice_context_pipecat_fallback"
    ]
