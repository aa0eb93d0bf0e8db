"""LiveKit's side of the LiveKit stories (``test_livekit.py``): the agent of LiveKit's docs with
the memory in its ``llm_node``, and a call through LiveKit's OpenAI plugin.

Apart from the stories so that only a worker that runs one of them loads LiveKit (2 s of
imports): the stories' ``livekit`` fixture imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from livekit.agents import Agent, AgentSession, ModelSettings, function_tool, llm
from livekit.plugins import openai as lk_openai

from voice_context.integrations.livekit import VoiceContextMemory
from voice_context.testing.openai_server import OpenAIServer

__all__ = ["FLIGHT", "INSTRUCTIONS", "TIMETABLE", "Assistant", "VoiceContextMemory", "call"]

INSTRUCTIONS = "You are Nova, a travel agent."
FLIGHT = '{"flight": "TP 1234", "departs": "09:40"}'
TIMETABLE = " ".join(f"TP {1000 + k}" for k in range(3000))  # 23,999 chars


class Assistant(Agent):
    """The agent of LiveKit's docs with the memory in its ``llm_node``. With ``truncate`` it
    first bounds the chat context itself, as a user without voice-context would; ``contexts``
    keeps voice-context's reply for each LLM run."""

    def __init__(self, memory: VoiceContextMemory, *, truncate: int | None = None) -> None:
        super().__init__(instructions=INSTRUCTIONS)
        self.memory = memory
        self.truncate = truncate
        self.contexts: list[Mapping[str, Any]] = []

    async def llm_node(
        self, chat_ctx: llm.ChatContext, tools: list[llm.Tool], model_settings: ModelSettings
    ) -> Any:
        if self.truncate is not None:
            chat_ctx.truncate(max_items=self.truncate)
        chat_ctx = await self.memory.update(chat_ctx)
        if self.memory.last_context is not None:
            self.contexts.append(self.memory.last_context)
        return Agent.default.llm_node(self, chat_ctx, tools, model_settings)

    @function_tool
    async def find_flight(self, destination: str) -> str:
        """Find the next flight to a city."""
        return FLIGHT

    @function_tool
    async def timetable(self, destination: str) -> str:
        """Every flight to a city this year."""
        return TIMETABLE


async def call(model: OpenAIServer, memory: VoiceContextMemory, agent: Agent, *said: str) -> None:
    """A call: an agent session, its LLM served by ``model``, answers each of ``said`` in turn;
    then the memory stores what is left and closes."""
    async with (
        lk_openai.LLM(model="scripted", base_url=model.base_url, api_key="test") as lk_llm,
        AgentSession(llm=lk_llm) as session,
    ):
        memory.attach(session)
        await session.start(agent)
        for words in said:
            await session.run(user_input=words)
    await memory.aclose()
