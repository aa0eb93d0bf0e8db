"""A real pipecat pipeline (pipecat's own test runner) with the voice-context processor in it,
against a real server on 127.0.0.1, and against one that is down."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import anyio
import pytest
from helpers import ManualClock
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.frames.frames import (
    Frame,
    LLMContextFrame,
    LLMMessagesUpdateFrame,
    LLMUpdateSettingsFrame,
    VisionTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.services.settings import LLMSettings
from pipecat.tests.utils import run_test
from pipecat.utils import deprecation
from serving import TIMEOUT, Hung, running, settings
from structlog.testing import capture_logs

from voice_context.client import Client
from voice_context.core.breaker import CircuitBreaker
from voice_context.core.turns import Turn
from voice_context.integrations.pipecat import (
    RESULT_CHARS,
    ContextLedger,
    VoiceContextProcessor,
    own_instructions,
    result_text,
)
from voice_context.store.memory import MemoryStore
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.testing.openai_server import CallTool, OpenAIServer, Reply
from voice_context.testing.pipecat_caller import Caller, says

NOVA = "You are Nova, a travel agent."
SYSTEM = {"role": "system", "content": NOVA}
"""The bot's prompt as the LLM gets it: put first by pipecat from the LLM service's
``system_instruction``, or, as pipecat deprecates since 1.9, the context's own first message."""
TALK: list[dict[str, Any]] = [
    {"role": "user", "content": "Let's book Lisbon for May 3rd, flying out of Porto."},
    {"role": "assistant", "content": "Sure. For how many people?"},
    {"role": "user", "content": [{"type": "text", "text": "Two of us, window seats please."}]},
]


CONTEXT_DEPRECATION = re.compile(r"`LLMContext\b.*` is deprecated")
"""What pipecat says when it finds an LLM context laid out in a way it deprecates."""


@contextmanager
def context_deprecations() -> Iterator[list[str]]:
    """What pipecat says, within the block, about an LLM context laid out as it deprecates (the
    list is filled when the block ends). Other warnings are handed on to pytest as they came."""
    heard: list[str] = []
    with warnings.catch_warnings(record=True) as caught:  # the filters stay as they are
        yield heard
    heard.extend(str(w.message) for w in caught if CONTEXT_DEPRECATION.match(str(w.message)))
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # each went through the filters already
        for w in caught:
            if not CONTEXT_DEPRECATION.match(str(w.message)):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


@pytest.fixture(autouse=True)
def deprecated_context_layouts_fail(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail a story in which pipecat finds a context laid out as it deprecates.

    pipecat warns under its own ``always`` filter, once per call site for the life of the
    process, so neither a ``filterwarnings`` mark nor the suite's ``error`` filter turns the
    warning into an error, and only the first story would hear it: each story starts with
    pipecat's record of warned sites empty, and fails on what it hears."""
    monkeypatch.setattr(deprecation, "_warned_sites", set())
    with context_deprecations() as heard:
        yield
    assert not heard, "pipecat warned about the context the LLM was given"


#: A backoff no story outlives: only a clock the story moves would end it.
LONG = 1000.0


def frame(messages: list[dict[str, Any]]) -> LLMContextFrame:
    return LLMContextFrame(context=LLMContext(messages=list(messages)))  # type: ignore[arg-type]


def as_instructions(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """voice-context's messages as the LLM gets them through pipecat: its system messages
    (summary, recall, notes, lines of the call) as developer messages."""
    return [{**m, "role": "developer"} if m["role"] == "system" else m for m in messages]


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
    last = sent[1]
    assert any(m["role"] == "system" for m in context["messages"]), "voice-context's screen notes"
    assert last == as_instructions(context["messages"]), "what voice-context keeps, notes as developer"
    assert not [m for m in [*sent[0], *last] if m["role"] == "system"], "no system message in the context"
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


class OpenAILLM(OpenAILLMService):
    """pipecat's OpenAI service, which closes its HTTP client when the pipeline is cleaned up
    (pipecat's own leaves it to the garbage collector)."""

    def create_client(self, *args: Any, **kwargs: Any) -> Any:
        self.http = super().create_client(*args, **kwargs)
        return self.http

    async def cleanup(self) -> None:
        await super().cleanup()
        await self.http.close()


async def call(
    memory: VoiceContextProcessor,
    model: OpenAIServer,
    context: LLMContext,
    *lines: Sequence[Frame],
    prompt: str | None = NOVA,
) -> None:
    """Run a call through a real pipecat pipeline with pipecat's runner until the caller hangs up;
    the bot's prompt is the LLM service's ``system_instruction``, as pipecat has it."""
    llm = OpenAILLM(
        api_key="test",
        base_url=model.base_url,
        settings=OpenAILLM.Settings(model="scripted", system_instruction=prompt),
    )
    aggregators = LLMContextAggregatorPair(context)
    pipeline = Pipeline([Caller(lines), aggregators.user(), memory.around(llm), aggregators.assistant()])
    with anyio.fail_after(TIMEOUT * 4):
        await run_test(pipeline, frames_to_send=[], send_end_frame=False)


async def stored(store: MemoryStore, session: str) -> list[Turn]:
    return await store.read_turns(session, 0, 1000)


def request_messages(model: OpenAIServer, n: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = model.completions[n].json["messages"]
    return messages


def system_messages(messages: Sequence[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "system"]


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
        cashier = "You are Nova, now taking the payment."
        task = {"role": "developer", "content": "Take the payment for the booking."}
        await call(
            memory,
            model,
            LLMContext(),
            says("Let's book Lisbon for May 3rd, flying out of Porto."),
            says("Two of us, window seats please."),
            # pipecat-flows moving to its next node with the RESET strategy: the node's role as
            # the LLM's system instruction, and a new context with the node's task in it
            [
                LLMUpdateSettingsFrame(delta=LLMSettings(system_instruction=cashier)),
                LLMMessagesUpdateFrame(messages=[task]),  # type: ignore[list-item]
                *says("Pay with the card ending 4242."),
            ],
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
    before_reset, after_reset = request_messages(model, 1), request_messages(model, 3)
    assert system_messages(before_reset) == [NOVA], "the LLM service's prompt, and no other system message"
    assert system_messages(after_reset) == [cashier]
    assert after_reset[:2] == [{"role": "system", "content": cashier}, task], "the pipeline's own, first"
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
    pipeline_context = LLMContext(messages=[*history], tools=[FIND_FLIGHT])  # type: ignore[list-item]
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
    assert follow_up[0] == SYSTEM, "the LLM service's prompt"
    remembered = follow_up[1:]
    assert {m["role"] for m in remembered} == {"developer", "user", "assistant", "tool"}, "no system message"
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
        await call(memory, model, LLMContext(), says("That's all, thanks."))
        turns = await stored(store, "call-7")
    assert [(t.role, t.text) for t in turns] == [
        ("user", "That's all, thanks."),
        ("assistant", "Goodbye, and safe travels."),
    ]


@pytest.mark.asyncio
async def test_a_prompt_left_in_the_pipelines_context_reaches_the_llm_once_and_before_the_memory() -> None:
    """A bot written before pipecat 1.9 keeps its prompt as the context's first message: it goes
    on first, as it is, and pipecat warns about it as it does without the memory."""
    store = MemoryStore()
    async with (
        running(settings(), summarizer=DeterministicSummarizer(), store=store) as server,
        OpenAIServer() as model,
    ):
        model.script(Reply("Sure. For how many people?"), Reply("Two window seats, noted."))
        memory = VoiceContextProcessor(server.url, session="call-7", budget_chars=4000, timeout=TIMEOUT)
        assert await memory.note("a seat map of a plane")
        with context_deprecations() as heard:
            await call(
                memory,
                model,
                LLMContext(messages=[SYSTEM]),  # type: ignore[list-item]
                says("Let's book Lisbon for May 3rd, flying out of Porto."),
                says("Two of us, window seats please."),
                prompt=None,
            )
        turns = await stored(store, "call-7")
    assert heard == [
        '`LLMContext(messages=[{"role": "system", ...}, ...])` is deprecated since 1.9.0 and will be'
        " removed in 2.0.0. Use `system_instruction` on the LLM service instead."
    ], "pipecat's word about the pipeline's own context, once"
    for n in (0, 1):
        sent = request_messages(model, n)
        assert sent[0] == SYSTEM, "the pipeline's prompt first, as it is"
        assert system_messages(sent) == [NOVA], "once, and no other system message"
        assert sent[1]["role"] == "developer" and "a seat map of a plane" in sent[1]["content"], (
            "then voice-context's context: the screen note (recalled, then as a note), then the turns"
        )
    assert [m["role"] for m in sent[-3:]] == ["user", "assistant", "user"]
    assert "Lisbon" in sent[-3]["content"] and "Two of us, window seats please." in sent[-1]["content"]
    assert NOVA not in [t.text for t in turns], "the prompt is not stored as a turn"


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


def test_the_pipelines_instructions_keep_their_order_and_only_a_leading_system_message_stays_one() -> None:
    task = {"role": "system", "content": "Now take the payment."}
    hint = {"role": "developer", "content": "The card on file ends 4242."}
    words = [{"role": "user", "content": "Yes."}, {"role": "assistant", "content": "Window or aisle?"}]
    assert own_instructions([SYSTEM, *words, task, hint]) == [
        SYSTEM,
        {"role": "developer", "content": "Now take the payment."},
        hint,
    ]
    assert own_instructions([*words, task, SYSTEM]) == [
        {"role": "developer", "content": "Now take the payment."},
        {"role": "developer", "content": NOVA},
    ], "a system message after the words would be the first message of the copy: a developer one"
    assert task["role"] == "system", "the pipeline's own messages are left as they were"
    assert own_instructions(words) == []


@pytest.mark.asyncio
async def test_a_hung_voice_context_costs_the_call_one_timeout_and_then_no_wait() -> None:
    """A sidecar that takes the connection and never answers: the first run waits ``timeout``
    for it, and that opens the circuit; every later run, the stores of the words and the last
    one at the end go on at once, with no new try (the breaker's clock stands still)."""
    breaker = CircuitBreaker(base=LONG, cap=LONG, jitter=0.0)
    async with Hung() as hung, OpenAIServer(default=Reply("Noted.")) as model:
        memory = VoiceContextProcessor(
            hung.url, session="call-7", timeout=0.3, breaker=breaker, clock=ManualClock()
        )
        with capture_logs() as logs:
            await call(memory, model, LLMContext(), *(says(f"Stop {k}, please.") for k in range(4)))
    waited = [
        e["error"].split("(")[0]
        for e in logs
        if e["event"] in ("voice_context_pipecat_fallback", "voice_context_pipecat_unsent")
    ]
    assert waited[0] == "TimeoutError", "the first run waits for the sidecar once"
    assert set(waited[1:]) == {"ConnectionLost"}, "the rest fail at once, not after a timeout"
    assert len(waited) >= 4 + 1, "each run fell back, and the last words were not stored"
    assert (memory.fallbacks, memory.replaced) == (4, 0)
    assert (hung.accepted, breaker.state) == (1, "open")
    assert len(model.completions) == 4, "every run reached the LLM with the pipeline's own context"
