"""A bot with long memory on voice-context's client: each turn is stored in voice-context, and each
reply is written from the context it gives back (the summary of what is old, what was recalled for
this turn, the recent turns) rather than from the whole transcript.

Offline, in one command: a voice-context server runs in this process, and a stand-in for OpenAI on
127.0.0.1 answers a question by quoting its prompt, so the last reply shows what the memory kept of
a call too long for the budget:

    python examples/client_bot.py       # in a clone of the repository: scripts/example client_bot

Online: OpenAI's model answers, and the turns go to your own server (``scripts/serve``) when
``VOICE_CONTEXT_URL`` names it:

    OPENAI_API_KEY=sk-... VOICE_CONTEXT_URL=ws://127.0.0.1:8765/v1 python examples/client_bot.py

Needs ``pip install 'voice-context[openai]'`` (``scripts/example`` sets up the examples' extras).
"""

# --- quick start ---
from openai import AsyncOpenAI

from voice_context.client import Client

INSTRUCTIONS = "You are Nova, a travel agent."
BUDGET = 2000  # chars of context per reply: what is older comes summarized, or recalled


async def call(url: str, caller: list[str]) -> None:
    async with Client(url) as client, AsyncOpenAI() as llm:
        room = await client.open("call-7")
        for line in caller:
            print(f"caller: {line}")
            await room.append_turn("caller", "user", line)
            context = await room.context("messages", BUDGET, base_instructions=INSTRUCTIONS)
            reply = await llm.chat.completions.create(model="gpt-4.1-mini", messages=context["messages"])
            words = reply.choices[0].message.content or ""
            print(f"bot: {words}")
            await room.append_turn("Nova", "assistant", words)
        state = await room.state()
    print(f"voice-context: {state['turns']} turns stored, the first {state['cursor']} folded in the summary")


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
