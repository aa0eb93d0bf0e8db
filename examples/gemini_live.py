"""A Gemini Live bot with long memory across the Live API's connections: ``GeminiLive`` holds the call
on google-genai's own Live client, stores every finalized transcript (the caller's and the model's) in
voice-context, and opens each new connection (on ``goAway``, before the old one drops) resuming the
session with the memory voice-context gives (the summary of what is old, the recent turns) in its
system instruction.

Offline, in one command: a voice-context server runs in this process, and a stand-in for the Live API
on 127.0.0.1 ends each connection after a second and a half (its ``goAway`` a second before), so the
call spans several connections; its model answers a question by quoting its system instruction, so the
last reply shows what the memory kept of a call too long for the budget:

    python examples/gemini_live.py       # in a clone of the repository: scripts/example gemini_live

Online: with ``GEMINI_API_KEY`` (or ``GOOGLE_API_KEY``) set, the caller's lines go to Gemini as text
(``GEMINI_LIVE_MODEL`` names another model), and its replies come back as speech and as their
transcription; the turns go to your own server (``scripts/serve``) when ``VOICE_CONTEXT_URL`` names
it:

    GEMINI_API_KEY=... VOICE_CONTEXT_URL=ws://127.0.0.1:8765/v1 python examples/gemini_live.py

Needs ``pip install 'voice-context[gemini]'`` (``scripts/example`` sets up the examples' extras).
"""

# --- quick start ---
import os
from contextlib import aclosing

import anyio
from google import genai

from voice_context.integrations.gemini_live import GeminiLive

MODEL = os.environ.get("GEMINI_LIVE_MODEL", "gemini-live-2.5-flash-preview")


async def call(client: genai.Client, url: str, caller: list[str], pause: float = 0.0) -> None:
    live = GeminiLive(
        client, model=MODEL, url=url, session="call-7", base_instructions="You are Nova.", budget_chars=2000
    )
    async with live, aclosing(live.receive()) as messages:  # every connection's messages, in order
        for line in caller:
            print(f"caller: {line}")
            await live.send_realtime_input(text=line)  # in a voice call, the caller's audio instead
            words = []
            async for message in messages:
                content = message.server_content
                if content and content.output_transcription:  # the model's words, as it speaks them
                    words.append(content.output_transcription.text or "")
                if content and content.turn_complete:
                    break
            print(f"bot: {''.join(words).strip()}")
            await anyio.sleep(pause)  # the caller's pace
    print(f"gemini live: {live.connections} connections, {live.go_aways} goAways, {live.resumptions} resumed")
    print(f"voice-context: {live.stored} of the {live.said} turns said stored")


# --- end ---

CALLER = [
    "Hi, this is Ana. My booking code is QX7-ALPHA, keep it handy.",
    *(f"On day {day} we visit museum number {day} in the old town." for day in range(1, 31)),
    "What was my booking code again?",
]


def main() -> None:
    """The call, against the stand-ins or the services the environment names (see above)."""
    from voice_context.testing.answers import answer
    from voice_context.testing.gemini_live_server import GeminiLiveServer, Prompt
    from voice_context.testing.offline import voice_context_url

    def quote(prompt: Prompt) -> str:  # the stand-in's model knows what its connection was told
        return answer(prompt.system_instruction, prompt.heard)

    async def run() -> None:
        async with voice_context_url() as url:
            if os.environ.get("GEMINI_API_KEY") or os.environ.get("GOOGLE_API_KEY"):
                await call(genai.Client(), url, CALLER)
                return
            async with GeminiLiveServer(model=quote, lifetime=1.5, go_away_before=1.0) as live_api:
                client = genai.Client(api_key="stand-in", http_options=live_api.http_options())
                await call(client, url, CALLER, pause=0.05)
                answered = live_api.replies[-1].connection
            print(f"the Live API stand-in: the question answered on connection {answered}")

    anyio.run(run)


if __name__ == "__main__":
    main()
