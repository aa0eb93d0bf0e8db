"""A LiveKit agent with long memory: ``VoiceContextMemory`` stores every message the
``AgentSession`` commits, and the agent's ``llm_node`` hands the LLM voice-context's context (the
summary of what is old, what was recalled for this turn, the recent turns) instead of the whole
chat context.

The session runs in text mode (LiveKit's own ``session.run(user_input=...)``): no room, no LiveKit
server, no audio device. Offline, in one command: a voice-context server runs in this process, and
a stand-in for OpenAI on 127.0.0.1 answers a question by quoting its prompt, so the last reply shows
what the memory kept of a call too long for the budget:

    python examples/livekit_agent.py       # in a clone of the repository: scripts/example livekit_agent

Online: OpenAI's model answers, and the turns go to your own server (``scripts/serve``) when
``VOICE_CONTEXT_URL`` names it:

    OPENAI_API_KEY=sk-... VOICE_CONTEXT_URL=ws://127.0.0.1:8765/v1 python examples/livekit_agent.py

Needs ``pip install 'voice-context[livekit]' livekit-plugins-openai`` (``scripts/example`` sets up the
examples' extras).
"""

# --- quick start ---
from livekit.agents import Agent, AgentSession, ConversationItemAddedEvent
from livekit.plugins import openai

from voice_context.integrations.livekit import VoiceContextMemory


class Assistant(Agent):
    def __init__(self, memory: VoiceContextMemory) -> None:
        super().__init__(instructions="You are Nova, a travel agent.")
        self.memory = memory

    async def llm_node(self, chat_ctx, tools, model_settings):
        chat_ctx = await self.memory.update(chat_ctx)  # what the LLM sees: the remembered context
        return Agent.default.llm_node(self, chat_ctx, tools, model_settings)


def show(event: ConversationItemAddedEvent) -> None:
    if event.item.type == "message":  # not a handoff to the agent
        print(f"{'caller' if event.item.role == 'user' else 'bot'}: {event.item.text_content}")


async def call(url: str, caller: list[str]) -> None:
    memory = VoiceContextMemory(url, session="call-7", budget_chars=2000)
    async with openai.LLM(model="gpt-4.1-mini") as llm, AgentSession(llm=llm) as session:
        memory.attach(session)  # the session's words become turns
        session.on("conversation_item_added", show)
        await session.start(Assistant(memory))
        for line in caller:
            await session.run(user_input=line)  # in a room, the caller speaks instead
    await memory.aclose()


# --- end ---

CALLER = [
    "Hi, this is Ana. My booking code is QX7-ALPHA, keep it handy.",
    *(f"On day {day} we visit museum number {day} in the old town." for day in range(1, 31)),
    "What was my booking code again?",
]


def main() -> None:
    """The call, against the stand-ins or the services the environment names (see above)."""
    import anyio

    from voice_context.testing.offline import openai_stand_in, voice_context_url

    async def run() -> None:
        async with voice_context_url() as url, openai_stand_in():
            await call(url, CALLER)

    anyio.run(run)


if __name__ == "__main__":
    main()
