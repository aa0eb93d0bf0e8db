"""An OpenAI Realtime bot with long memory: ``RealtimeMemory`` sits beside the realtime websocket,
stores every finalized transcript (the caller's and the model's) in voice-context, and answers each
of the caller's turns with ``response.create`` carrying the context voice-context gives for it (the
summary of what is old, what was recalled for this turn, the recent turns) as its instructions.

Offline, in one command: a voice-context server runs in this process, and a stand-in for the
Realtime service on 127.0.0.1 plays the call as server VAD orders it, its model answering a
question by quoting its instructions, so the last reply shows what the memory kept of a call too
long for the budget:

    python examples/openai_realtime.py       # in a clone of the repository: scripts/example openai_realtime

Online, the bot joins a WebRTC or SIP call over its sideband connection while the audio flows
between caller and model: the call's id comes from the ``Location`` header of ``POST
/v1/realtime/calls`` (or the ``realtime.call.incoming`` webhook). Speak on the call, and the turns
go to your own server (``scripts/serve``) when ``VOICE_CONTEXT_URL`` names it:

    OPENAI_API_KEY=sk-... REALTIME_CALL_ID=rtc_... VOICE_CONTEXT_URL=ws://127.0.0.1:8765/v1 \\
        python examples/openai_realtime.py

(``REALTIME_URL`` names another realtime service than ``wss://api.openai.com/v1/realtime``.)

Needs ``pip install voice-context``.
"""

# --- quick start ---
import json

from websockets.asyncio.client import connect

from voice_context.client import Client
from voice_context.integrations.openai_realtime import BOT_EVENTS, USER_EVENTS, RealtimeMemory


def show(event: dict) -> None:
    if event["type"] in USER_EVENTS:
        print(f"caller: {event['transcript']}")
    elif event["type"] in BOT_EVENTS:
        print(f"bot: {event[BOT_EVENTS[event['type']]]}")


async def call(url: str, realtime_url: str, headers: dict[str, str]) -> None:
    async with Client(url) as client, connect(realtime_url, additional_headers=headers) as ws:
        room = await client.open("call-7")

        async def send(event: dict) -> None:  # a client event to the realtime session
            await ws.send(json.dumps(event))

        async with RealtimeMemory(room, send, base_instructions="You are Nova.", limit_chars=2000) as memory:
            await memory.handoff()  # instructions, and turn detection that waits for memory
            async for message in ws:  # the server events of the realtime session, until it hangs up
                event = json.loads(message)
                show(event)
                await memory.on_event(event)  # transcripts in, response.create out


# --- end ---

CALLER = [
    "Hi, this is Ana. My booking code is QX7-ALPHA, keep it handy.",
    *(f"On day {day} we visit museum number {day} in the old town." for day in range(1, 31)),
    "What was my booking code again?",
]


def main() -> None:
    """The call, against the stand-ins or the services the environment names (see above)."""
    import os

    import anyio

    from voice_context.integrations.openai_realtime import sideband_url
    from voice_context.testing.answers import answer
    from voice_context.testing.offline import voice_context_url
    from voice_context.testing.realtime_server import StandInRealtime, User

    key, call_id = os.environ.get("OPENAI_API_KEY"), os.environ.get("REALTIME_CALL_ID")
    if key and not call_id:
        raise SystemExit("OPENAI_API_KEY is set: name the call to join in REALTIME_CALL_ID (rtc_...)")

    async def run() -> None:
        async with voice_context_url() as url:
            if key and call_id:
                service = os.environ.get("REALTIME_URL", "wss://api.openai.com/v1/realtime")
                realtime_url = sideband_url(service, call_id)
                await call(url, realtime_url, {"Authorization": f"Bearer {key}"})
                return
            async with StandInRealtime([[User(line, answer) for line in CALLER]]) as realtime:
                await call(url, f"{realtime.url}?model=gpt-realtime", {})

    anyio.run(run)


if __name__ == "__main__":
    main()
