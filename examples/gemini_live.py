"""A Gemini Live call whose long memory lives in voice-context, across the Live API's connections.

Offline, in one command (no key, no network): a voice-context server and a local stand-in for the
Live API start in this process, the stand-in ends each connection after 3 seconds (a ``goAway``
2 seconds before), and a scripted caller talks through a few connections::

    pip install 'voice-context[gemini]'
    python examples/gemini_live.py

Online: with ``GEMINI_API_KEY`` (or ``GOOGLE_API_KEY``) set, the same caller types to Gemini itself
(its replies come back as speech, and as their transcription), remembered by the voice-context
server at ``--voice-context``, or by one started here::

    GEMINI_API_KEY=... python examples/gemini_live.py [--model MODEL] [--voice-context ws://127.0.0.1:8765/v1]
"""

from __future__ import annotations

import argparse
import os
import re
from contextlib import AsyncExitStack, aclosing

import anyio
from google import genai

from voice_context.commands.serve import configure_logging
from voice_context.config import Settings
from voice_context.integrations.gemini_live import GeminiLive
from voice_context.server import Server
from voice_context.store.memory import MemoryStore
from voice_context.testing.gemini_live_server import GeminiLiveServer, Prompt

CALLER = [
    "Hi, I'd like to book a trip to Lisbon. My booking code is QX7-ALPHA.",
    "Two of us, flying out of Porto on May 3rd.",
    "An aisle seat for me, and a window seat for Marta.",
    "No checked bags, just a backpack each.",
    "Vegetarian meals, please.",
    "What was my booking code again?",
]


def offline_model(prompt: Prompt) -> str:
    """The stand-in's model: it answers from what its connection was told (the memory)."""
    if "booking code" in prompt.heard and prompt.heard.endswith("?"):
        code = re.search(r"QX7-\w+", prompt.system_instruction)
        return f"Your booking code is {code.group()}." if code else "I don't know your booking code."
    return "Noted."


async def call(client: genai.Client, model: str, url: str, pause: float) -> GeminiLive:
    """The caller's lines, one exchange at a time; returns the call, for its figures."""
    async with (
        GeminiLive(client, model=model, url=url, session="call-7", base_instructions="You are Nova.") as live,
        aclosing(live.receive()) as messages,
    ):
        for line in CALLER:
            print(f"caller: {line}")
            await live.send_realtime_input(text=line)
            reply: list[str] = []
            async for message in messages:
                content = message.server_content
                if content is not None and content.output_transcription is not None:
                    reply.append(content.output_transcription.text or "")
                if content is not None and content.turn_complete:
                    break
            print(f"nova:   {''.join(reply).strip()}   (connection {live.connections})")
            await anyio.sleep(pause)
    return live


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default=os.environ.get("GEMINI_LIVE_MODEL", "gemini-live-2.5-flash-preview")
    )
    parser.add_argument(
        "--voice-context", default=None, help="a voice-context server (default: one started here)"
    )
    args = parser.parse_args(argv)
    configure_logging(level="warning")
    online = bool(os.environ.get("GEMINI_API_KEY") or os.environ.get("GOOGLE_API_KEY"))
    async with AsyncExitStack() as stack:
        url = args.voice_context
        if url is None:
            settings = Settings().with_values("server", {"port": 0})
            url = (await stack.enter_async_context(Server(settings, store=MemoryStore()))).url
        if online:
            client, pause = genai.Client(), 1.0
        else:
            live_api = GeminiLiveServer(model=offline_model, lifetime=3.0, go_away_before=2.0)
            await stack.enter_async_context(live_api)
            client, pause = genai.Client(api_key="offline", http_options=live_api.http_options()), 0.6
        live = await call(client, args.model, url, pause)
    print(
        f"{live.connections} connections, {live.go_aways} goAways, {live.resumptions} resumed, "
        f"{live.handoffs} fresh with the handoff; {live.stored} of {live.said} turns stored"
    )


if __name__ == "__main__":
    anyio.run(main)
