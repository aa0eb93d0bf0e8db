"""Gemini Live calls across their connections: google-genai's own Live client talks to a local
stand-in for the Live API (a real TLS websocket server on 127.0.0.1 that sends ``goAway`` before
it closes a connection, hands out resumption handles and honours them, or refuses them when
told), beside a real voice-context server. The call's time is a test clock: a thirty-minute call
takes a moment. Each story checks that no turn is lost and that every connection after the
first starts with the memory of what was said in the first minute."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

import anyio
import pytest
from google import genai
from google.genai import types
from serving import TIMEOUT, Proxy, running, settings, wait_until

from voice_context.client import Client
from voice_context.integrations.gemini_live import GeminiLive, Said, Transcript, parse_duration
from voice_context.store.memory import MemoryStore
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.testing.clock import ManualClock
from voice_context.testing.gemini_live_server import GeminiLiveServer

T0 = 1714572187.0
MODEL = "gemini-live-2.5-flash-preview"
PROMPT = "You are Nova, a travel agent."
FACT = "My booking code is QX7-ALPHA, keep it handy."


def utterance(k: int) -> str:
    """What the caller says in the call's ``k``-th half minute: the booking code first."""
    return FACT if k == 0 else f"On stop {k} we see museum number {k} in the old town."


def gemini(live_api: GeminiLiveServer) -> genai.Client:
    return genai.Client(api_key="local-key", http_options=live_api.http_options())


def calling(live_api: GeminiLiveServer, url: str, clock: ManualClock, **options: object) -> GeminiLive:
    """The bot's call, its requests to voice-context bounded by the tests' one timeout rather than the
    half second a live call gives them (a loaded machine is not a server that is down)."""
    options.setdefault("timeout", TIMEOUT)
    return GeminiLive(
        gemini(live_api),
        model=MODEL,
        url=url,
        session="call-7",
        base_instructions=PROMPT,
        clock=clock,
        **options,  # type: ignore[arg-type]
    )


async def speak(
    live: GeminiLive, messages: AsyncIterator[types.LiveServerMessage], text: str, *, typed: bool = False
) -> str:
    """The caller says ``text`` (as audio, or typed); returns the model's words as the bot hears
    them (its output transcription), once its turn is complete."""
    if typed:
        await live.send_realtime_input(text=text)
    else:
        await live.send_realtime_input(audio=types.Blob(data=text.encode(), mime_type="audio/pcm;rate=16000"))
    words: list[str] = []
    with anyio.fail_after(TIMEOUT):
        async for message in messages:
            content = message.server_content
            if content is None:
                continue
            if content.output_transcription is not None and content.output_transcription.text:
                words.append(content.output_transcription.text)
            if content.turn_complete:
                break
    return "".join(words).strip()


async def converse(
    live: GeminiLive,
    messages: AsyncIterator[types.LiveServerMessage],
    clock: ManualClock,
    halves: range,
    *,
    every: Callable[[int], None] | None = None,
) -> list[tuple[str, str]]:
    """The caller speaks every half minute of the call (at 15 s, 45 s, ...), each time waiting
    for the reply: the exchanges, as said and as heard."""
    exchanges = []
    for k in halves:
        clock.advance_to(T0 + 15 + 30 * k)
        if every is not None:
            every(k)
        exchanges.append((utterance(k), await speak(live, messages, utterance(k))))
    return exchanges


def as_turns(exchanges: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [turn for said, reply in exchanges for turn in (("user", said), ("assistant", reply))]


@pytest.mark.asyncio
async def test_a_thirty_minute_call_moves_to_a_resumed_connection_before_each_one_drops() -> None:
    clock, store = ManualClock(T0), MemoryStore()
    async with (
        running(settings(), summarizer=DeterministicSummarizer(), store=store) as server,
        GeminiLiveServer(lifetime=600, go_away_before=60, clock=clock) as live_api,
    ):
        async with calling(live_api, server.url, clock) as live, aclosing(live.receive()) as messages:
            exchanges = await converse(live, messages, clock, range(60))
        stored = await store.read_turns("call-7", 0, 1000)

    # connections of ten minutes, each warned a minute before its end: four connections, three
    # goAways, each answered by a connection that resumed the session
    assert (live.connections, live.go_aways, live.resumptions, live.refusals, live.handoffs) == (
        4,
        3,
        3,
        0,
        1,
    )
    one, *resumed = live_api.connections
    assert one.resumes is None and all(c.resumed for c in resumed)
    for old, new in zip(live_api.connections, resumed, strict=False):
        # the next connection was open before the old one's time was up, and the call closed the
        # old one itself: no connection dropped under it
        assert old.go_away_at is not None and old.go_away_at <= new.opened_at <= old.closed_at
        assert old.closed_at is not None and old.closed_at < old.opened_at + 600
        assert not old.closed_by_server
    # every word said is a turn in voice-context, once, in the order said
    assert [(r.heard, r.said) for r in live_api.replies] == exchanges
    assert [(t.role, t.text) for t in stored] == as_turns(exchanges) and len(stored) == 120
    assert (live.said, live.stored, live.unsent) == (120, 120, 0)
    # the first connection knew only the bot's prompt; every reply after a reconnection came from a
    # connection told the booking code said in the first minute, twenty-nine minutes before
    assert one.system_instruction == PROMPT
    later = [r for r in live_api.replies if r.connection > 1]
    assert {r.connection for r in later} == {2, 3, 4}
    assert all("QX7-ALPHA" in r.system_instruction and r.system_instruction.startswith(PROMPT) for r in later)
    # each connection asked for both transcriptions, resumption, and a sliding window
    for conn in live_api.connections:
        assert conn.setup["inputAudioTranscription"] == conn.setup["outputAudioTranscription"] == {}
        assert conn.setup["contextWindowCompression"] in ({"sliding_window": {}}, {"slidingWindow": {}})
        assert conn.setup["sessionResumption"] == ({"handle": conn.resumes} if conn.resumes else {})
        assert conn.api_key == "local-key"


@pytest.mark.asyncio
async def test_a_refused_resumption_starts_a_fresh_session_with_the_handoff() -> None:
    clock, store = ManualClock(T0), MemoryStore()
    async with (
        running(settings(), summarizer=DeterministicSummarizer(), store=store) as server,
        GeminiLiveServer(lifetime=600, go_away_before=60, clock=clock, refuse_resumption=True) as live_api,
    ):
        async with calling(live_api, server.url, clock) as live, aclosing(live.receive()) as messages:
            exchanges = await converse(live, messages, clock, range(24))
        stored = await store.read_turns("call-7", 0, 1000)

    one, refused_open, refused_closed, fresh = live_api.connections
    # tried while the old connection was open, then again once it was closed, then fresh
    assert refused_open.refused == refused_closed.refused == "invalid_handle"
    assert one.closed_at is not None and refused_open.opened_at <= one.closed_at <= refused_closed.opened_at
    assert fresh.resumes is None and fresh.session != one.session
    assert (live.connections, live.go_aways, live.resumptions, live.refusals, live.handoffs) == (
        2,
        1,
        0,
        2,
        2,
    )
    # the fresh session's model knows nothing, but its instructions (the handoff) hold the call
    assert "QX7-ALPHA" in fresh.system_instruction and fresh.system_instruction.startswith(PROMPT)
    answered_by = [r.connection for r in live_api.replies]
    assert answered_by == sorted(answered_by) and set(answered_by) == {one.number, fresh.number}
    assert [(t.role, t.text) for t in stored] == as_turns(exchanges)


@pytest.mark.asyncio
async def test_a_server_that_resumes_only_a_closed_connection_gets_the_old_one_closed_first() -> None:
    clock = ManualClock(T0)
    async with (
        running(settings(), summarizer=DeterministicSummarizer()) as server,
        GeminiLiveServer(lifetime=600, go_away_before=60, clock=clock, refuse_while_open=True) as live_api,
        calling(live_api, server.url, clock) as live,
        aclosing(live.receive()) as messages,
    ):
        exchanges = await converse(live, messages, clock, range(24))

    one, refused, resumed = live_api.connections
    assert refused.refused == "still_open" and resumed.resumed and resumed.session == one.session
    assert (live.connections, live.resumptions, live.refusals, live.handoffs) == (2, 1, 1, 1)
    assert not one.closed_by_server
    assert "QX7-ALPHA" in resumed.system_instruction
    assert [(r.heard, r.said) for r in live_api.replies] == exchanges
    assert live.stored == 48


@pytest.mark.asyncio
async def test_with_no_resumable_handle_yet_the_next_connection_is_a_fresh_session_with_the_handoff() -> None:
    clock, store = ManualClock(T0), MemoryStore()
    async with (
        running(settings(), summarizer=DeterministicSummarizer(), store=store) as server,
        GeminiLiveServer(lifetime=120, go_away_before=60, clock=clock) as live_api,
    ):
        async with Client(server.url) as client:  # the caller's call of yesterday
            room = await client.open("call-7")
            await room.append_turn("user", "user", FACT, at=T0 - 86400)
            await room.append_turn("assistant", "assistant", "Noted: QX7-ALPHA.", at=T0 - 86395)
        async with calling(live_api, server.url, clock) as live, aclosing(live.receive()) as messages:
            # nobody speaks: the goAway comes at a minute, and no handle was ever given
            clock.advance_to(T0 + 60)
            await wait_until(lambda: live.go_aways == 1)
            clock.advance_to(T0 + 120 - live.switch_margin)
            await wait_until(lambda: live.connections == 2)
            reply = await speak(live, messages, "Which seat did I pick?")
        stored = await store.read_turns("call-7", 0, 1000)

    one, two = live_api.connections
    assert one.go_away_at == T0 + 60 and two.resumes is None and two.session != one.session
    assert (live.resumptions, live.refusals, live.handoffs) == (0, 0, 2)
    assert "QX7-ALPHA" in one.system_instruction and "QX7-ALPHA" in two.system_instruction
    assert [r.connection for r in live_api.replies] == [2]
    assert [t.text for t in stored[2:]] == ["Which seat did I pick?", reply]


@pytest.mark.asyncio
async def test_a_connection_that_drops_without_warning_is_resumed_at_once() -> None:
    clock, store = ManualClock(T0), MemoryStore()
    async with (
        running(settings(), summarizer=DeterministicSummarizer(), store=store) as server,
        GeminiLiveServer(clock=clock) as live_api,
    ):
        async with calling(live_api, server.url, clock) as live, aclosing(live.receive()) as messages:
            before = await converse(live, messages, clock, range(3))
            await live_api.drop()
            after = [
                ("Two tickets, please.", await speak(live, messages, "Two tickets, please.", typed=True))
            ]
        stored = await store.read_turns("call-7", 0, 1000)

    one, two = live_api.connections
    assert one.closed_by_server and two.resumed and two.session == one.session
    assert (live.connections, live.go_aways, live.resumptions) == (2, 0, 1)
    assert "QX7-ALPHA" in two.system_instruction
    # what the bot typed went to the new connection, and is the user's turn
    assert [(r.connection, r.heard) for r in live_api.replies][-1] == (2, "Two tickets, please.")
    assert [(t.role, t.text) for t in stored] == as_turns(before + after)


@pytest.mark.asyncio
async def test_while_voice_context_is_down_the_call_goes_on_and_later_loses_no_turn() -> None:
    clock, store = ManualClock(T0), MemoryStore()
    async with (
        running(settings(), summarizer=DeterministicSummarizer(), store=store) as server,
        Proxy(server.port) as proxy,
        GeminiLiveServer(lifetime=600, go_away_before=60, clock=clock) as live_api,
    ):
        proxy.go_down()
        async with calling(live_api, proxy.url, clock) as live, aclosing(live.receive()) as messages:

            def back_at_eight_minutes(k: int) -> None:
                if k == 16:
                    proxy.come_back()

            exchanges = await converse(live, messages, clock, range(24), every=back_at_eight_minutes)
        stored = await store.read_turns("call-7", 0, 1000)

    one, two = live_api.connections
    # down: the call started with the bot's own prompt, and every exchange was answered
    assert one.system_instruction == PROMPT and proxy.refused > 0 and live.memory_skipped >= 1
    assert [(r.heard, r.said) for r in live_api.replies] == exchanges
    # back by the goAway: the next connection resumed with the memory, and every turn said while
    # it was down was stored once it was back, in order
    assert two.resumed and "QX7-ALPHA" in two.system_instruction
    assert [(t.role, t.text) for t in stored] == as_turns(exchanges)
    assert (live.said, live.stored) == (48, 48)


def test_a_connection_asks_for_what_the_call_needs_and_keeps_the_bots_own_settings() -> None:
    client = genai.Client(api_key="local-key")
    with pytest.raises(ValueError, match="base_instructions"):
        GeminiLive(
            client,
            model=MODEL,
            url="ws://127.0.0.1:9/v1",
            session="s",
            config=types.LiveConnectConfig(system_instruction="You are Nova."),
        )
    window = types.ContextWindowCompressionConfig(trigger_tokens=20000, sliding_window=types.SlidingWindow())
    config = types.LiveConnectConfig(
        response_modalities=[types.Modality.AUDIO],
        context_window_compression=window,
    )
    live = GeminiLive(client, model=MODEL, url="ws://127.0.0.1:9/v1", session="s", config=config)
    made = live._config("You are Nova.\nMemory.", "handle-1")
    assert made.system_instruction == "You are Nova.\nMemory."
    assert made.session_resumption == types.SessionResumptionConfig(handle="handle-1")
    assert (
        made.input_audio_transcription == made.output_audio_transcription == types.AudioTranscriptionConfig()
    )
    assert made.context_window_compression == window and made.response_modalities == [types.Modality.AUDIO]
    assert (
        config.system_instruction is None and config.session_resumption is None
    )  # the bot's stays as it was
    plain = GeminiLive(client, model=MODEL, url="ws://127.0.0.1:9/v1", session="s", compression=None)
    assert plain._config("", None).context_window_compression is None


def test_an_exchange_is_a_user_turn_then_a_model_turn_whatever_order_the_chunks_come_in() -> None:
    transcript = Transcript()
    assert transcript.idle
    transcript.heard(" Two tickets")
    transcript.said(" For when?")
    transcript.heard(" to Lisbon.")  # the tail of the user's words, after the model began
    assert not transcript.idle
    assert transcript.turn_complete() == [
        Said("user", "Two tickets to Lisbon."),
        Said("assistant", "For when?"),
    ]
    assert transcript.idle


def test_an_interruption_ends_the_models_turn_and_the_words_over_it_start_the_next() -> None:
    transcript = Transcript()
    transcript.heard("Book the hotel.")
    transcript.said("Which hotel would")
    transcript.heard(" The one by the river.")
    assert transcript.interrupted() == [
        Said("user", "Book the hotel."),
        Said("assistant", "Which hotel would"),
    ]
    transcript.heard(" With a view.")
    assert transcript.turn_complete() == []
    assert not transcript.idle  # the user's new words wait for the model's answer
    transcript.said("Done.")
    assert transcript.turn_complete() == [
        Said("user", "The one by the river. With a view."),
        Said("assistant", "Done."),
    ]


def test_typed_words_text_parts_and_a_closed_connection_are_turns_too() -> None:
    transcript = Transcript()
    transcript.heard("Hello")
    assert transcript.typed("Two tickets, please.") == [
        Said("user", "Hello"),
        Said("user", "Two tickets, please."),
    ]
    content = types.LiveServerContent(
        model_turn=types.Content(
            parts=[types.Part(text="thinking about it", thought=True), types.Part(text="Sure, two.")]
        )
    )
    assert transcript.take(content) == []
    assert transcript.take(types.LiveServerContent(turn_complete=True)) == [Said("assistant", "Sure, two.")]
    transcript.heard("And a taxi")
    assert transcript.flush() == [Said("user", "And a taxi")] and transcript.idle


def test_a_go_away_says_its_time_left_as_a_protobuf_duration() -> None:
    assert parse_duration("50s") == 50.0
    assert parse_duration("1.5s") == 1.5
    assert parse_duration("0.000001s") == pytest.approx(1e-6)
    assert parse_duration("-3s") == 0.0
    assert parse_duration("50") is None and parse_duration(None) is None and parse_duration(50) is None
    assert not math.isnan(parse_duration(".5s") or math.nan)
