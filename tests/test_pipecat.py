"""A real pipecat pipeline (pipecat's own test runner) with the voice-context processor in it,
against a real server on 127.0.0.1, and against one that is down."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.frames.frames import (
    EndWorkerFrame,
    Frame,
    LLMContextAssistantTurnFrame,
    LLMContextFrame,
    LLMMessagesAppendFrame,
    LLMMessagesUpdateFrame,
    StartFrame,
    VisionTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.tests.utils import run_test
from serving import TIMEOUT, running, settings
from structlog.testing import capture_logs

from voice_context.client import Client
from voice_context.core.turns import Turn
from voice_context.integrations.pipecat import (
    RESULT_CHARS,
    ContextLedger,
    VoiceContextProcessor,
    result_text,
)
from voice_context.store.memory import MemoryStore
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.testing.openai_server import CallTool, OpenAIServer, Reply

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
        "voice_context_pipecat_fallback",
        "voice_context_pipecat_unsent",  # at the end: the call's words were never stored
    ]


# -- a real pipeline: the user and assistant aggregators, pipecat's OpenAI service on a real
# -- HTTP server speaking the OpenAI API, and the memory around the LLM


class Caller(FrameProcessor):
    """The person on the call, at the top of the pipeline: says each line (the frames a user
    turn, or a reset, puts in the pipeline) once the bot's answer to the one before is in
    the context (the assistant aggregator announces it up the pipeline), then hangs up."""

    def __init__(self, *lines: Sequence[Frame]) -> None:
        super().__init__()
        self.lines = deque(lines)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, StartFrame | LLMContextAssistantTurnFrame):
            await self.say_next()

    async def say_next(self) -> None:
        if not self.lines:
            await self.push_frame(EndWorkerFrame(), FrameDirection.UPSTREAM)
            return
        for frame in self.lines.popleft():
            await self.push_frame(frame)


class OpenAILLM(OpenAILLMService):
    """pipecat's OpenAI service, which closes its HTTP client when the pipeline is cleaned up
    (pipecat's own leaves it to the garbage collector)."""

    def create_client(self, *args: Any, **kwargs: Any) -> Any:
        self.http = super().create_client(*args, **kwargs)
        return self.http

    async def cleanup(self) -> None:
        await super().cleanup()
        await self.http.close()


def says(text: str) -> list[Frame]:
    """A user turn put in the context with pipecat's own frame: appended, then an LLM run."""
    return [LLMMessagesAppendFrame(messages=[{"role": "user", "content": text}], run_llm=True)]


async def call(
    memory: VoiceContextProcessor, model: OpenAIServer, context: LLMContext, *lines: Sequence[Frame]
) -> None:
    """Run a call through a real pipecat pipeline with pipecat's runner until the caller hangs up."""
    llm = OpenAILLM(api_key="test", base_url=model.base_url, settings=OpenAILLM.Settings(model="scripted"))
    aggregators = LLMContextAggregatorPair(context)
    pipeline = Pipeline([Caller(*lines), aggregators.user(), memory.around(llm), aggregators.assistant()])
    with anyio.fail_after(TIMEOUT * 4):
        await run_test(pipeline, frames_to_send=[], send_end_frame=False)


async def stored(store: MemoryStore, session: str) -> list[Turn]:
    return await store.read_turns(session, 0, 1000)


def request_messages(model: OpenAIServer, n: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = model.completions[n].json["messages"]
    return messages


@pytest.mark.asyncio
async def test_after_a_context_reset_new_turns_are_stored_and_the_llm_hears_the_newest() -> None:
    store = MemoryStore()
    async with (
        running(settings(), summarizer=DeterministicSummarizer(), store=store) as server,
        OpenAIServer() as model,
    ):
        model.script(
            Reply("Sure. For how many people?"),
            Reply("Two window seats, noted."),
            Reply("Paid with the card ending 4242."),
            Reply("A taxi will wait at arrivals."),
        )
        memory = VoiceContextProcessor(server.url, session="call-7", budget_chars=4000, timeout=TIMEOUT)
        payment = {"role": "system", "content": "You are Nova. Now take the payment."}
        await call(
            memory,
            model,
            LLMContext(messages=[SYSTEM]),  # type: ignore[list-item]
            says("Let's book Lisbon for May 3rd, flying out of Porto."),
            says("Two of us, window seats please."),
            # pipecat-flows moving to its next node with the RESET strategy: a new context
            [LLMMessagesUpdateFrame(messages=[payment]), *says("Pay with the card ending 4242.")],  # type: ignore[list-item]
            says("And a taxi to the hotel?"),
        )
        turns = await stored(store, "call-7")
    assert [t.text for t in turns] == [
        "Let's book Lisbon for May 3rd, flying out of Porto.",
        "Sure. For how many people?",
        "Two of us, window seats please.",
        "Two window seats, noted.",
        "Pay with the card ending 4242.",
        "Paid with the card ending 4242.",
        "And a taxi to the hotel?",
        "A taxi will wait at arrivals.",  # the bot's last reply, stored when the call ended
    ]
    after_reset = request_messages(model, 3)
    assert after_reset[0] == payment, "the pipeline's own system message first"
    assert "And a taxi to the hotel?" in after_reset[-1]["content"], "the LLM hears the newest turn"
    assert any("Lisbon" in str(m["content"]) for m in after_reset), "what came before the reset is remembered"
    assert (memory.replaced, memory.fallbacks) == (4, 0)


FLIGHT = {"flight": "TP 1234", "departs": "09:40"}


async def find_flight(params: FunctionCallParams) -> None:
    await params.result_callback(FLIGHT)


FIND_FLIGHT = FunctionSchema(
    name="find_flight",
    description="Find a flight to an airport.",
    properties={"to": {"type": "string"}},
    required=["to"],
    handler=find_flight,
)


@pytest.mark.asyncio
async def test_the_run_after_a_tool_result_gets_the_bounded_context_and_the_tool_turns_are_stored() -> None:
    store = MemoryStore()
    history: list[dict[str, Any]] = [
        {
            "role": ("user", "assistant")[k % 2],
            "content": f"Earlier, about hotel number {k}: " + "details " * 12,
        }
        for k in range(60)
    ]
    pipeline_context = LLMContext(messages=[SYSTEM, *history], tools=[FIND_FLIGHT])  # type: ignore[list-item]
    budget = 1500
    async with (
        running(settings(), summarizer=DeterministicSummarizer(), store=store) as server,
        OpenAIServer() as model,
    ):
        model.script(
            CallTool("find_flight", {"to": "LIS"}, call_id="call_1"), Reply("TP 1234 leaves at 09:40.")
        )
        memory = VoiceContextProcessor(server.url, session="call-7", budget_chars=budget, timeout=TIMEOUT)
        await call(memory, model, pipeline_context, says("Can you find me a flight to Lisbon?"))
        turns = await stored(store, "call-7")
    asked, follow_up = request_messages(model, 0), request_messages(model, 1)
    assert len(model.completions) == 2
    assert follow_up[0] == SYSTEM
    remembered = follow_up[1:]
    assert sum(len(str(m.get("content") or "")) for m in remembered) <= budget
    assert len(pipeline_context.get_messages()) > 60, "the pipeline's own context holds the whole call"
    call_message, result_message = remembered[-2:]
    assert call_message["tool_calls"][0]["id"] == "call_1"
    assert result_message == {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(FLIGHT)}
    assert "Can you find me a flight to Lisbon?" in asked[-1]["content"]
    the_call = next(t for t in turns if t.is_tool_call)
    the_result = next(t for t in turns if t.is_tool_result)
    assert (the_call.tool_call_id, the_call.tool_name, json.loads(the_call.tool_arguments or "")) == (
        "call_1",
        "find_flight",
        {"to": "LIS"},
    )
    assert (the_result.tool_call_id, json.loads(the_result.text)) == ("call_1", FLIGHT)
    assert [t.text for t in turns[-4:]] == [
        "Can you find me a flight to Lisbon?",
        "",
        json.dumps(FLIGHT),
        "TP 1234 leaves at 09:40.",
    ]
    assert (memory.replaced, memory.fallbacks) == (2, 0)


@pytest.mark.asyncio
async def test_a_speculative_run_gets_the_guessed_turn_but_only_the_confirmed_one_is_stored() -> None:
    store = MemoryStore()
    guess = {"role": "user", "content": "And a vegetarian"}
    confirmed = {"role": "user", "content": "And a vegetarian meal for both."}
    async with running(settings(), summarizer=DeterministicSummarizer(), store=store) as server:
        processor = VoiceContextProcessor(server.url, session="call-7", budget_chars=4000, timeout=TIMEOUT)
        speculative = LLMContextFrame(context=LLMContext(messages=[*TALK, guess]), speculation=True)  # type: ignore[list-item]
        down, _ = await run_test(
            processor,
            frames_to_send=[frame(TALK), speculative, frame([*TALK, confirmed])],
            expected_down_frames=[LLMContextFrame, LLMContextFrame, LLMContextFrame],
        )
        turns = await stored(store, "call-7")
    assert [t.text for t in turns] == [
        "Let's book Lisbon for May 3rd, flying out of Porto.",
        "Sure. For how many people?",
        "Two of us, window seats please.",
        "And a vegetarian meal for both.",  # what the user finished saying, not the guess
    ]
    _, guessed, _ = down
    assert isinstance(guessed, LLMContextFrame) and guessed.speculation, "the LLM still holds its answer back"
    assert guessed.context.get_messages()[-1] == guess


@pytest.mark.asyncio
async def test_the_bots_last_words_are_stored_when_the_call_ends() -> None:
    store = MemoryStore()
    async with (
        running(settings(), summarizer=DeterministicSummarizer(), store=store) as server,
        OpenAIServer() as model,
    ):
        model.script(Reply("Goodbye, and safe travels."))
        memory = VoiceContextProcessor(server.url, session="call-7", timeout=TIMEOUT)
        await call(memory, model, LLMContext(messages=[SYSTEM]), says("That's all, thanks."))  # type: ignore[list-item]
        turns = await stored(store, "call-7")
    assert [(t.role, t.text) for t in turns] == [
        ("user", "That's all, thanks."),
        ("assistant", "Goodbye, and safe travels."),
    ]


# -- the ledger: what is stored is known by the messages themselves


def test_a_summary_put_before_known_messages_is_not_a_turn_and_the_same_words_twice_are_two() -> None:
    ledger = ContextLedger(prefix="t")
    first = [SYSTEM, {"role": "user", "content": "Yes."}]
    assert ledger.look(first, at=1.0) == 1
    answered = [
        *first,
        {"role": "assistant", "content": "Window or aisle?"},
        {"role": "user", "content": "Yes."},
    ]
    assert ledger.look(answered, at=2.0) == 2, "the second 'Yes.' is new words"
    summary = {"role": "user", "content": "Conversation summary: the user agreed."}
    summarized = [SYSTEM, summary, *answered[2:], {"role": "user", "content": "Window."}]
    assert ledger.look(summarized, at=3.0) == 1, "only 'Window.': the summary sits before known messages"
    reset = [{"role": "system", "content": "Now the payment."}, {"role": "user", "content": "Window."}]
    assert ledger.look(reset, at=4.0) == 1, "after a reset every message is new"
    assert [t.text for t in ledger.outbox] == ["Yes.", "Window or aisle?", "Yes.", "Window.", "Window."]
    assert len({t.id for t in ledger.outbox}) == 5


def test_a_tool_call_is_planned_once_and_a_call_left_open_is_settled() -> None:
    ledger = ContextLedger(bot="Nova", prefix="t")
    assert ledger.call("call_1", "find_flight", {"to": "LIS"}, at=1.0)
    assert not ledger.call("call_1", "find_flight", {"to": "LIS"}, at=1.1), (
        "the other way's copy of the frame"
    )
    assert ledger.result("call_1", "find_flight", {"to": "LIS"}, '{"flight": "TP 1234"}', at=2.0)
    assert not ledger.result("call_1", "find_flight", {"to": "LIS"}, '{"flight": "TP 1234"}', at=2.1)
    assert ledger.call("call_2", "book", {}, at=3.0)
    assert ledger.cancel_open_calls(at=4.0) == 1
    assert [(t.role, t.tool_call_id, t.is_tool_call, t.text) for t in ledger.outbox] == [
        ("assistant", "call_1", True, ""),
        ("tool", "call_1", False, '{"flight": "TP 1234"}'),
        ("assistant", "call_2", True, ""),
        ("tool", "call_2", False, "CANCELLED"),
    ]
    assert len(result_text("x" * (RESULT_CHARS + 10))) < RESULT_CHARS + 30
