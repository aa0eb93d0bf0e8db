"""LiveKit Agents with voice-context's memory: a real ``AgentSession`` run in text mode (LiveKit's
own testing API), its LLM the OpenAI plugin pointed at a real OpenAI-compatible server on
127.0.0.1 (scripted words), against a real voice-context server, and against one that is down."""

from __future__ import annotations

import datetime as dt
import importlib
import re
import time
from collections.abc import MutableMapping
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from helpers import ManualClock
from serving import Hung, running, settings

import voice_context.client
from voice_context.client import Client
from voice_context.core.breaker import CircuitBreaker
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.testing.openai_server import CallTool, OpenAIServer, Reply, ReplyWith


@pytest.fixture(scope="module")
def livekit() -> ModuleType:
    """The agent and the call (``livekit_agent.py``), with LiveKit, loaded by the first story run."""
    return importlib.import_module("livekit_agent")


#: A backoff no story outlives: only a clock the story moves would end it.
LONG = 1000.0


def sent_messages(model: OpenAIServer) -> list[dict[str, Any]]:
    return list(model.completions[-1].json["messages"])


def chars(messages: list[dict[str, Any]]) -> int:
    """A request's size as voice-context counts a context: contents, tool names and arguments."""
    size = sum(len(m.get("content") or "") for m in messages)
    calls = [c["function"] for m in messages for c in m.get("tool_calls", ())]
    return size + sum(len(c["name"]) + len(c["arguments"]) for c in calls)


def stop_reply(request: Any) -> str:
    """The bot's words for a stop: they name it, so that every turn can be told apart."""
    asked = str(request["messages"][-1]["content"])
    found = re.search(r"Stop (\d+)", asked)
    return f"Noted: stop {found.group(1)} is on the plan." if found else "Noted, it is on file."


@pytest.mark.asyncio
async def test_a_livekit_session_stores_its_turns_and_its_llm_gets_the_remembered_context(
    livekit: ModuleType,
) -> None:
    async with (
        running(settings(), summarizer=DeterministicSummarizer()) as server,
        OpenAIServer(default=Reply("Booked: two window seats to Lisbon.")) as model,
    ):
        async with Client(server.url) as client:  # what this caller said before, another day
            room = await client.open("call-7")
            for k in range(70):
                await room.append_turn(
                    "user", "user", f"Earlier call, line {k}: Alice's passport number ends 4417."
                )
            await room.context("messages")  # folds the oldest turns into the summary
        memory = livekit.VoiceContextMemory(server.url, session="call-7", budget_chars=6000, timeout=5)
        said = "Which passport number did I give you?", "And book two window seats to Lisbon."
        await livekit.call(model, memory, livekit.Assistant(memory), *said)
        first = model.completions[0].json["messages"]
        async with Client(server.url) as client:
            room = await client.open("call-7")
            state = await room.state()
    # the agent's own instructions first, then what voice-context remembers, then the session's turns
    assert first[0]["content"] == livekit.INSTRUCTIONS
    remembered = " ".join(str(m["content"]) for m in first if m["role"] == "system")
    assert "4417" in remembered
    # the question last: as voice-context stored it ("user: ..."), or as the session has it when
    # the session had not committed it yet when the LLM run began
    assert first[-1]["role"] == "user"
    assert first[-1]["content"].endswith("Which passport number did I give you?")
    # both runs' words stored: 70 before, then user, assistant, user, assistant
    assert state["turns"] == 74
    assert (memory.updates, memory.fallbacks) == (2, 0)


@pytest.mark.asyncio
async def test_when_voice_context_is_down_the_reply_uses_the_sessions_own_context(
    livekit: ModuleType,
) -> None:
    async with running(settings()) as server:
        url = server.url  # nobody listens here once this server stops
    memory = livekit.VoiceContextMemory(url, session="call-7", timeout=0.5)
    async with OpenAIServer(default=Reply("Sure.")) as model:
        await livekit.call(model, memory, livekit.Assistant(memory), "Hello?")
        sent = sent_messages(model)
    assert [m["role"] for m in sent] == ["system", "user"]
    assert memory.fallbacks == 1


@pytest.mark.asyncio
async def test_a_hung_voice_context_costs_the_call_one_timeout_and_then_no_wait(
    livekit: ModuleType, logs: list[MutableMapping[str, Any]]
) -> None:
    """A sidecar that takes the connection and never answers: the first reply waits ``timeout``
    for it, and that opens the circuit; the next replies go on at once, with no new try (the
    breaker's clock stands still)."""
    breaker = CircuitBreaker(base=LONG, cap=LONG, jitter=0.0)
    async with Hung() as hung, OpenAIServer(default=Reply("Sure.")) as model:
        memory = livekit.VoiceContextMemory(
            hung.url, session="call-7", timeout=0.3, breaker=breaker, clock=ManualClock()
        )
        await livekit.call(model, memory, livekit.Assistant(memory), "Hello?", "Lisbon, please.", "May 3rd.")
    waited = [e["error"].split("(")[0] for e in logs if e["event"] == "voice_context_livekit_fallback"]
    assert waited == ["TimeoutError", "ConnectionLost", "ConnectionLost"], "one wait, then none"
    assert (memory.fallbacks, memory.updates) == (3, 0)
    assert (hung.accepted, breaker.state) == (1, "open")
    assert len(model.completions) == 3, "every reply went on with the session's own context"


PASSPORT = "Please keep this on file: my passport number ends 4417."
QUESTION = "Which passport number did I give you?"


def stop(k: int) -> str:
    return f"Stop {k}: we walk from the harbour to the old market and eat at cafe {k}."


def said_on(day: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Date the turns the client stores as said on ``day`` (``"2 December 2026"``), from 09:00 on:
    a date's written length moves what a dated tail of the transcript holds, and with it where the
    protected window ends."""
    start = dt.datetime.strptime(f"{day} 09:00", "%d %B %Y %H:%M").replace(tzinfo=dt.UTC).timestamp()
    began = time.monotonic()
    clock = SimpleNamespace(time=lambda: start + time.monotonic() - began, monotonic=time.monotonic)
    monkeypatch.setattr(voice_context.client, "time", clock)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("truncate", "day"),
    [(None, "2 December 2026"), (10, "28 November 2026"), (None, "23 September 2027")],
    ids=["whole", "truncated", "a-long-date"],
)
async def test_a_long_call_gets_a_bounded_context_with_every_turn_in_the_summary_or_shown_once(
    truncate: int | None, day: str, livekit: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    said_on(day, monkeypatch)
    budget = 3000
    runs = 60
    async with (
        running(settings()) as server,  # its summarizer's words: a count of what it folded
        OpenAIServer(default=ReplyWith(stop_reply)) as model,
    ):
        memory = livekit.VoiceContextMemory(server.url, session="call-9", budget_chars=budget, timeout=5)
        agent = livekit.Assistant(memory, truncate=truncate)
        await livekit.call(model, memory, agent, PASSPORT, *map(stop, range(1, runs)), QUESTION)
    said = [PASSPORT, "Noted, it is on file."]  # the turns as stored: each run's user words, the reply
    for k in range(1, runs):
        said += [stop(k), f"Noted: stop {k} is on the plan."]
    said.append(QUESTION)
    requests = [r.json["messages"] for r in model.completions]
    assert len(requests) == runs + 1 == len(agent.contexts)
    for messages, context in zip(requests, agent.contexts, strict=True):
        # the agent's instructions, then at most the budget: voice-context's context and the
        # words the session had not committed yet
        assert messages[0] == {"role": "system", "content": livekit.INSTRUCTIONS}
        assert chars(messages[1:]) <= budget
        # no gap: the turns before the cursor are the summary's (shown when the budget has room
        # for it, and voice-context says when not), every turn from the cursor on is shown
        shown = " ".join(str(m.get("content")) for m in messages)
        newest = context["first_turn"] + context["turns_shown"]
        missing = [i for i in range(context["cursor"], newest) if said[i] not in shown]
        assert missing == [], f"turns {missing} are in neither the summary nor the context"
        if context["first_turn"] and "summary" not in context["dropped"]:
            assert any(str(m["content"]).startswith("Session conversation summary") for m in messages)
    last = requests[-1]
    assert agent.contexts[-1]["cursor"] > 20  # the call was long enough to fold
    assert last[-1]["content"].endswith(QUESTION)
    assert " ".join(str(m["content"]) for m in last).count("4417") == 1  # recalled, once


@pytest.mark.asyncio
async def test_a_tool_call_and_its_output_are_stored_as_tool_turns_and_sent_once(livekit: ModuleType) -> None:
    async with (
        running(settings()) as server,
        OpenAIServer(default=Reply("Sure.")) as model,
    ):
        model.script(CallTool("find_flight", {"destination": "Lisbon"}, "call_1"), Reply("TP 1234, 09:40."))
        memory = livekit.VoiceContextMemory(server.url, session="call-11", budget_chars=3000, timeout=5)
        await livekit.call(
            model,
            memory,
            livekit.Assistant(memory),
            "Find me a flight to Lisbon.",
            "Thanks. When does it leave?",
        )
        async with Client(server.url) as client:
            stored = (await (await client.open("call-11")).context("messages"))["messages"]
    asked, after_tool, later = (r.json["messages"] for r in model.completions)

    def tool_parts(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
        calls = [("call", c["function"]["name"]) for m in messages for c in m.get("tool_calls", ())]
        return calls + [("output", m["content"]) for m in messages if m["role"] == "tool"]

    # the run after the tool gets the call and its output once, from the session's own context;
    # the next run once, from voice-context
    assert tool_parts(asked) == []
    assert tool_parts(after_tool) == [("call", "find_flight"), ("output", livekit.FLIGHT)]
    assert tool_parts(later) == [("call", "find_flight"), ("output", livekit.FLIGHT)]
    # stored as tool turns, between the question and the answer
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert stored[1]["tool_calls"][0]["id"] == "call_1"
    assert stored[1]["tool_calls"][0]["function"] == {
        "name": "find_flight",
        "arguments": '{"destination": "Lisbon"}',
    }
    assert stored[2] == {"role": "tool", "tool_call_id": "call_1", "content": livekit.FLIGHT}


@pytest.mark.asyncio
async def test_a_long_tool_output_reaches_the_run_after_it_whole_and_is_stored_cut(
    logs: list[MutableMapping[str, Any]], livekit: ModuleType
) -> None:
    async with (
        running(settings()) as server,  # max_text_chars 8000
        OpenAIServer(default=Reply("Sure.")) as model,
    ):
        model.script(CallTool("timetable", {"destination": "Lisbon"}, "call_7"), Reply("Many flights."))
        memory = livekit.VoiceContextMemory(server.url, session="call-12", budget_chars=6000, timeout=5)
        await livekit.call(
            model, memory, livekit.Assistant(memory), "Which flights go to Lisbon?", "Book the first one."
        )
        async with Client(server.url) as client:
            state = await (await client.open("call-12")).state()
            stored = (await (await client.open("call-12")).context("messages"))["messages"]
    # the run that follows the tool gets the output whole, from the session's own context, once
    after_tool = model.completions[1].json["messages"]
    assert [m["content"] for m in after_tool if m["role"] == "tool"] == [livekit.TIMETABLE]
    assert memory.fallbacks == 0
    assert state["turns"] == 6  # the question, the call, its output, the answer, and the next run's two
    output = next(m for m in stored if m["role"] == "tool")
    assert output["content"].startswith("TP 1000 TP 1001")
    assert [e["chars"] for e in logs if e["event"] == "voice_context_livekit_turn_cut"] == [23999]
