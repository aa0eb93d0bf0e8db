"""LiveKit Agents with voice-context's memory: a real ``AgentSession`` run in text mode (LiveKit's
own testing API), its LLM the OpenAI plugin pointed at a real OpenAI-compatible server on
127.0.0.1 (scripted words), against a real voice-context server, and against one that is down."""

from __future__ import annotations

from typing import Any

import pytest
from livekit.agents import Agent, AgentSession, ModelSettings, llm
from livekit.plugins import openai as lk_openai
from serving import running, settings

from voice_context.client import Client
from voice_context.integrations.livekit import VoiceContextMemory
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.testing.openai_server import OpenAIServer, Reply


def assistant(memory: VoiceContextMemory) -> Agent:
    class Assistant(Agent):
        async def llm_node(
            self, chat_ctx: llm.ChatContext, tools: list[llm.Tool], model_settings: ModelSettings
        ) -> Any:
            chat_ctx = await memory.update(chat_ctx)
            return Agent.default.llm_node(self, chat_ctx, tools, model_settings)

    return Assistant(instructions="You are Nova, a travel agent.")


def sent_messages(model: OpenAIServer) -> list[dict[str, Any]]:
    return list(model.completions[-1].json["messages"])


@pytest.mark.asyncio
async def test_a_livekit_session_stores_its_turns_and_its_llm_gets_the_remembered_context() -> None:
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
        memory = VoiceContextMemory(server.url, session="call-7", budget_chars=6000, timeout=5)
        async with (
            lk_openai.LLM(model="scripted", base_url=model.base_url, api_key="test") as lk_llm,
            AgentSession(llm=lk_llm) as session,
        ):
            memory.attach(session)
            await session.start(assistant(memory))
            await session.run(user_input="Which passport number did I give you?")
            first = sent_messages(model)
            await session.run(user_input="And book two window seats to Lisbon.")
        await memory.aclose()
        async with Client(server.url) as client:
            room = await client.open("call-7")
            state = await room.state()
    # the agent's own instructions first, then what voice-context remembers, then the session's turns
    assert first[0]["content"] == "You are Nova, a travel agent."
    remembered = " ".join(str(m["content"]) for m in first if m["role"] == "system")
    assert "4417" in remembered
    assert first[-1] == {"role": "user", "content": "Which passport number did I give you?"}
    # both runs' words stored: 70 before, then user, assistant, user, assistant
    assert state["turns"] == 74
    assert (memory.updates, memory.fallbacks) == (2, 0)


@pytest.mark.asyncio
async def test_when_voice_context_is_down_the_reply_uses_the_sessions_own_context() -> None:
    async with running(settings()) as server:
        url = server.url  # nobody listens here once this server stops
    memory = VoiceContextMemory(url, session="call-7", timeout=0.5)
    async with (
        OpenAIServer(default=Reply("Sure.")) as model,
        lk_openai.LLM(model="scripted", base_url=model.base_url, api_key="test") as lk_llm,
        AgentSession(llm=lk_llm) as session,
    ):
        memory.attach(session)
        await session.start(assistant(memory))
        await session.run(user_input="Hello?")
        sent = sent_messages(model)
    await memory.aclose()
    assert [m["role"] for m in sent] == ["system", "user"]
    assert memory.fallbacks == 1
