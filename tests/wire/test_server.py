"""The websocket service against a real server on 127.0.0.1, spoken to over raw websockets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from serving import TIMEOUT, GatedStore, as_turn, http_get, running, settings, turn_body, wait_until, wire
from structlog.testing import capture_logs
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from voice_context.core.budget import SUMMARY_FOOTER, SUMMARY_HEADER
from voice_context.core.session import Session, TurnAppended
from voice_context.core.turns import Turn
from voice_context.errors import StoreError, SummarizerError
from voice_context.server import TokenBucket, find_duplicate, owner_of, recording_name
from voice_context.store import open_store
from voice_context.store.memory import MemoryStore
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.summarizers.fakes import ScriptedSummarizer


class GatedSummarizer:
    """Summarizes deterministically, once the test opens the gate."""

    def __init__(self) -> None:
        self.inner = DeterministicSummarizer()
        self.gate = anyio.Event()
        self.finished = 0

    @property
    def model(self) -> str:
        return "gated"

    async def summarize(self, request: SummaryRequest) -> str:
        await self.gate.wait()
        self.finished += 1
        return await self.inner.summarize(request)


class BrokenStore(MemoryStore):
    """Fails turn appends for two sessions: one as a store outage, one as a bug."""

    async def append_turn(self, name: str, index: int, turn: Turn) -> None:
        if name == "outage":
            raise StoreError("disk unavailable", retryable=True)
        if name == "bug":
            raise RuntimeError("a bug in a backend")
        await super().append_turn(name, index, turn)


# -- the seed's timeline over the wire ---------------------------------------------------


@pytest.mark.asyncio
async def test_the_timeline_over_the_wire_compacts_turns_0_to_9_and_moves_the_cursor_to_10() -> None:
    async with running(summarizer=DeterministicSummarizer()) as server, wire(server) as bot:
        opened = await bot.open("room-1")
        assert opened == {
            "type": "session.opened",
            "id": 1,
            "session": "room-1",
            "resumed": False,
            "turns": 0,
            "cursor": 0,
            "summary_chars": 0,
            "in_flight": False,
        }
        for i in range(60):
            assert (await bot.append("room-1", i))["index"] == i
        quiet = await bot.request("context.get", session="room-1", format="messages")
        assert (quiet["cursor"], quiet["in_flight"], quiet["summary"]) == (0, False, "")
        assert len(quiet["messages"]) == 60

        assert (await bot.append("room-1", 60, text="Let's book the Lisbon trip for May 3rd."))["index"] == 60
        first = await bot.request("context.get", session="room-1", format="instructions", budget_chars=5200)
        assert first["cursor"] == 0, "the reply that starts a compaction never waits for it"
        assert first["in_flight"] is True
        assert "Alice: turn 0" in first["instructions"]
        assert first["chars"] == len(first["instructions"]) <= 5200

        pushed = await bot.push()
        assert pushed["type"] == "compaction.completed"
        assert (pushed["session"], pushed["old_cursor"], pushed["cursor"], pushed["covered_through"]) == (
            "room-1",
            0,
            10,
            9,
        )
        second = await bot.request("context.get", session="room-1", format="messages")
        assert (second["cursor"], second["covered_through"], second["in_flight"]) == (10, 9, False)
        assert second["summary"]
        assert second["messages"][0] == {
            "role": "system",
            "content": SUMMARY_HEADER + second["summary"] + SUMMARY_FOOTER,
        }
        verbatim = [m["content"] for m in second["messages"][1:]]
        assert verbatim[0] == "Alice: turn 10"
        assert verbatim[-1] == "Alice: Let's book the Lisbon trip for May 3rd."
        state = await bot.request("session.state", session="room-1")
        assert (state["turns"], state["cursor"], state["in_flight"], state["failures"]) == (61, 10, False, 0)
        assert state["summary_chars"] == len(second["summary"])
        assert (await bot.request("session.close", session="room-1"))["type"] == "session.closed"


@pytest.mark.asyncio
async def test_notes_and_a_failed_compaction_reach_the_bot() -> None:
    broken = ScriptedSummarizer([SummarizerError("model went away", kind="connection")])
    async with running(summarizer=broken) as server, wire(server) as bot:
        await bot.open("room-1", config={"recent_window": 4, "batch_size": 2})
        noted = await bot.request(
            "note.append", session="room-1", note={"text": "a flight search", "at": 1.0, "speaker": "Bob"}
        )
        assert (noted["type"], noted["live"], noted["pending"]) == ("note.appended", 1, 0)
        for i in range(7):
            await bot.append("room-1", i)
        ctx = await bot.request("context.get", session="room-1", format="instructions")
        assert "Bob's screen: a flight search" in ctx["instructions"]
        failed = await bot.push()
        assert failed["type"] == "compaction.failed"
        assert (failed["session"], failed["cursor"], failed["failures"]) == ("room-1", 0, 1)
        assert (failed["error"], failed["retryable"]) == ("connection", True)
        state = await bot.request("session.state", session="room-1")
        assert (state["cursor"], state["failures"]) == (0, 1)


# -- bad input: an error, and the connection carries on --------------------------------------


def bad_turn(session: str = "good", **changes: Any) -> dict[str, Any]:
    return {"type": "turn.append", "session": session, "turn": {**turn_body(0), **changes}}


BAD_INPUT: list[tuple[str, Any, str]] = [
    ("not JSON", "{oops", "bad_request"),
    ("an array", "[1, 2, 3]", "bad_request"),
    ("no type", {"id": "x", "session": "room-1"}, "bad_request"),
    ("an unknown type", {"type": "turn.delete", "id": "x", "session": "room-1"}, "unknown_type"),
    ("no session", {"type": "turn.append", "id": "x", "turn": turn_body(0)}, "bad_request"),
    ("a role not in the list", bad_turn(role="god"), "bad_request"),
    ("a time that is not a number", bad_turn(at="now"), "bad_request"),
    ("an empty text", bad_turn(text=""), "bad_request"),
    ("a negative budget", {"type": "context.get", "session": "good", "budget_chars": -5}, "bad_request"),
    ("facts that are not strings", {"type": "context.get", "session": "good", "facts": [1]}, "bad_request"),
    ("an unknown config key", {"type": "session.open", "session": "o", "config": {"x": 1}}, "bad_request"),
    (
        "a bad config value",
        {"type": "session.open", "session": "o", "config": {"batch_size": 0}},
        "bad_request",
    ),
    ("a session never opened", bad_turn("nowhere"), "unknown_session"),
    (
        "the state of a session never opened",
        {"type": "session.state", "session": "nowhere"},
        "unknown_session",
    ),
    ("a text over the limit", bad_turn(text="x" * 201), "too_large"),
]


@pytest.mark.asyncio
async def test_every_bad_input_gets_its_documented_error_while_another_session_keeps_working() -> None:
    async with running(settings(max_text_chars=200)) as server, wire(server) as bot:
        await bot.open("good")
        for index, (what, message, code) in enumerate(BAD_INPUT):
            if isinstance(message, dict):
                message = {**message, "id": f"bad-{index}"}
            await bot.send(message)
            error = await bot.reply()
            assert error["type"] == "error", what
            assert error["code"] == code, f"{what}: {error}"
            assert error["message"], what
            if (isinstance(message, dict) and code != "bad_request") or what.startswith("a role"):
                assert error["id"] == f"bad-{index}", what
            appended = await bot.append("good", index)
            assert appended["index"] == index, f"after {what} the good session goes on"
        state = await bot.request("session.state", session="good")
        assert state["turns"] == len(BAD_INPUT)


@pytest.mark.asyncio
async def test_store_failures_and_bugs_answer_internal_and_the_connection_carries_on() -> None:
    async with running(store=BrokenStore()) as server, wire(server) as bot:
        for name in ("outage", "bug", "good"):
            await bot.open(name)
        with capture_logs() as logs:
            outage = await bot.append("outage", 0)
            bug = await bot.append("bug", 0)
        assert (outage["code"], outage["retryable"], outage["session"]) == ("internal", True, "outage")
        assert "disk unavailable" in outage["message"]
        assert (bug["code"], bug["retryable"], bug["message"]) == ("internal", False, "internal error")
        assert any(e["event"] == "voice_context_request_failed" and e["type"] == "turn.append" for e in logs)
        assert (await bot.append("good", 0))["index"] == 0


@pytest.mark.asyncio
async def test_a_binary_frame_closes_the_connection_with_1003() -> None:
    async with running() as server, wire(server) as bot:
        await bot.open("room-1")
        await bot.send(b'{"type": "ping"}')
        assert await bot.closed_with() == 1003


@pytest.mark.asyncio
async def test_a_frame_over_the_size_limit_closes_the_connection_with_1009() -> None:
    async with running(settings(max_frame_bytes=1024)) as server, wire(server) as bot:
        assert (await bot.request("ping"))["type"] == "pong"
        await bot.send({"type": "turn.append", "session": "s", "turn": turn_body(0, text="y" * 2000)})
        assert await bot.closed_with() == 1009


# -- auth --------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_without_a_valid_token_the_handshake_is_refused_with_401() -> None:
    with capture_logs() as logs:
        await refuse_without_a_valid_token()
    assert logs, "refusals are logged"
    assert "alpha-token" not in repr(logs) and "wrong" not in repr(logs), "tokens are never logged"


async def refuse_without_a_valid_token() -> None:
    async with running(settings(auth_tokens=("alpha-token", "beta-token"))) as server:
        for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic alpha-token"}):
            with pytest.raises(InvalidStatus) as refused:
                await connect(server.url, additional_headers=headers, open_timeout=TIMEOUT)
            assert refused.value.response.status_code == 401
            assert orjson.loads(refused.value.response.body)["code"] == "unauthorized"
        health = await http_get(server.port, "/healthz")
        assert health.status == 200, "health needs no token"


@pytest.mark.asyncio
async def test_a_session_opened_under_one_token_is_unknown_under_another() -> None:
    async with (
        running(settings(auth_tokens=("alpha-token", "beta-token"))) as server,
        wire(server, token="alpha-token") as alpha,
        wire(server, token="beta-token") as beta,
    ):
        await alpha.open("room-1")
        await alpha.append("room-1", 0)
        stolen = await beta.open("room-1")
        assert (stolen["type"], stolen["code"]) == ("error", "unknown_session")
        write = await beta.append("room-1", 1)
        assert write["code"] == "unknown_session"
        read = await beta.request("context.get", session="room-1")
        assert read["code"] == "unknown_session"
        assert (await alpha.request("session.state", session="room-1"))["turns"] == 1


# -- limits ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_too_many_sessions_on_one_connection_is_rate_limited_until_one_closes() -> None:
    async with running(settings(max_sessions_per_connection=2)) as server, wire(server) as bot:
        await bot.open("a")
        await bot.open("b")
        assert (await bot.open("a"))["resumed"] is True, "opening again is not another session"
        refused = await bot.open("c")
        assert (refused["code"], refused["limit"]) == ("rate_limited", "sessions_per_connection")
        await bot.request("session.close", session="a")
        assert (await bot.open("c"))["type"] == "session.opened"


@pytest.mark.asyncio
async def test_turns_beyond_the_burst_are_rate_limited_per_session() -> None:
    slow_rate = settings(turns_per_second=0.001, turn_burst=3)
    async with running(slow_rate) as server, wire(server) as bot:
        await bot.open("busy")
        await bot.open("calm")
        for i in range(3):
            assert (await bot.append("busy", i))["index"] == i
        limited = await bot.append("busy", 3)
        assert (limited["code"], limited["limit"], limited["session"]) == (
            "rate_limited",
            "turns_per_second",
            "busy",
        )
        assert limited["retry_after"] > 0
        assert (await bot.append("calm", 0))["index"] == 0, "the limit is per session"


@pytest.mark.asyncio
async def test_a_retried_turn_with_the_same_id_is_not_appended_twice() -> None:
    async with running() as server, wire(server) as bot:
        await bot.open("room-1")
        first = await bot.append("room-1", 0, id="utt-1")
        again = await bot.append("room-1", 0, id="utt-1")
        assert (first["index"], again["index"], again["duplicate"]) == (0, 0, True)
        no_id = [await bot.append("room-1", 5), await bot.append("room-1", 5)]
        assert [r["index"] for r in no_id] == [1, 2], "without an id, a turn is never a duplicate"


# -- health and metrics over plain HTTP ------------------------------------------------------


@pytest.mark.asyncio
async def test_healthz_and_metrics_answer_on_the_same_port() -> None:
    async with running(summarizer=DeterministicSummarizer()) as server, wire(server) as bot:
        await bot.open("room-1")
        for i in range(61):
            await bot.append("room-1", i)
        await bot.request("context.get", session="room-1")
        await bot.push()
        await bot.request("turn.append", session="room-1", turn={"role": "user"})

        health = await http_get(server.port, "/healthz")
        assert health.status == 200
        assert health.headers["content-type"] == "application/json"
        assert health.json() == {
            "status": "ok",
            "sessions": 1,
            "connections": 1,
            "in_flight": 0,
            "worker": None,
        }

        metrics = await http_get(server.port, "/metrics")
        assert metrics.status == 200
        assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
        text = metrics.body.decode()
        for line in (
            "voice_context_sessions 1.0",
            "voice_context_connections 1.0",
            "voice_context_turns_appended_total 61.0",
            "voice_context_compactions_started_total 1.0",
            "voice_context_compactions_completed_total 1.0",
            "voice_context_compactions_failed_total 0.0",
            "voice_context_compactions_in_flight 0.0",
            "voice_context_indexing_lag 0.0",  # the context waited for the index to take all 61
            "voice_context_indexing_lag_max 0.0",
            'voice_context_errors_total{code="bad_request"} 1.0',
            "voice_context_context_latency_seconds_count 1.0",
        ):
            assert line in text.splitlines(), line
        assert (await http_get(server.port, "/nope")).status == 404


@pytest.mark.asyncio
async def test_two_servers_keep_their_own_metrics() -> None:
    async with running() as one, running() as two, wire(one) as bot:
        await bot.open("room-1")
        await bot.append("room-1", 0)
        assert (
            "voice_context_turns_appended_total 1.0" in (await http_get(one.port, "/metrics")).body.decode()
        )
        assert (
            "voice_context_turns_appended_total 0.0" in (await http_get(two.port, "/metrics")).body.decode()
        )


# -- recording -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_recording_writes_every_accepted_message_per_session(tmp_path: Path) -> None:
    record_dir = tmp_path / "rec"
    odd_name = "../Team Room/ü?"
    async with running(settings(record_dir=str(record_dir))) as server, wire(server) as bot:
        await bot.open("room-1", config={"recent_window": 20})
        await bot.append("room-1", 0, id="u0")
        await bot.append("room-1", 0, id="u0")  # a duplicate: not appended, not recorded
        await bot.request("turn.append", session="room-1", turn={**turn_body(1), "role": "god"})
        note = {"text": "slides", "at": 1714572190, "source": "screen"}
        pretty = orjson.dumps(
            {"type": "note.append", "session": "room-1", "mood": "calm", "note": note},
            option=orjson.OPT_INDENT_2,
        )
        await bot.send(pretty.decode())  # over several lines, with a field the server does not know
        assert (await bot.reply())["type"] == "note.appended"
        await bot.request("context.get", session="room-1", format="instructions", budget_chars=900)
        await bot.request("ping")
        await bot.open(odd_name)
        await bot.append(odd_name, 0)
        await bot.request("session.close", session="room-1")

    files = sorted(p.name for p in record_dir.iterdir())
    assert files == sorted([recording_name("room-1"), recording_name(odd_name)])
    lines = [orjson.loads(line) for line in (record_dir / "room-1.jsonl").read_text().splitlines()]
    assert [m["type"] for m in lines] == [
        "session.open",
        "turn.append",
        "note.append",
        "context.get",
        "session.close",
    ]
    assert lines[0] == {"type": "session.open", "id": 1, "session": "room-1", "config": {"recent_window": 20}}
    assert as_turn(lines[1]["turn"]) == as_turn(turn_body(0, id="u0"))
    assert lines[2] == {"type": "note.append", "session": "room-1", "mood": "calm", "note": note}, "as sent"
    assert lines[3]["budget_chars"] == 900
    [odd] = [orjson.loads(x) for x in (record_dir / recording_name(odd_name)).read_text().splitlines()][1:]
    assert odd["session"] == odd_name


def test_recording_names_stay_inside_the_directory_and_unique() -> None:
    names = ["room-1", "../../etc/passwd", ".hidden", "a/b", "A" * 200, "A" * 199 + "B", "ü"]
    files = [recording_name(n) for n in names]
    assert len(set(files)) == len(names)
    for file in files:
        assert "/" not in file and not file.startswith(".")
        assert file.endswith(".jsonl") and len(file.encode()) <= 200
    assert recording_name("room-1") == "room-1.jsonl"


# -- graceful shutdown -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_shutdown_finishes_the_request_in_progress_then_closes_with_1001() -> None:
    store = GatedStore()
    gated = GatedSummarizer()
    async with running(store=store, summarizer=gated) as server:
        manager = server.manager
        async with wire(server) as busy, wire(server) as idle:
            await idle.open("idle-room")
            await busy.open("room-1", config={"recent_window": 4, "batch_size": 2})
            store.gate.set()
            for i in range(7):
                await busy.append("room-1", i)
            await busy.request("context.get", session="room-1")  # a compaction is now in flight
            store.close_gate()
            await busy.send({"type": "turn.append", "id": "last", "session": "room-1", "turn": turn_body(7)})
            with anyio.fail_after(TIMEOUT):
                await store.entered.wait()

            async with anyio.create_task_group() as tg:
                tg.start_soon(server.shutdown)
                await wait_until(lambda: server.stopping)
                assert await idle.closed_with() == 1001
                store.gate.set()
                answer = await busy.reply()
                assert (answer["id"], answer["index"]) == ("last", 7)
                assert await busy.closed_with() == 1001
            with pytest.raises(OSError):
                await connect(server.url, open_timeout=TIMEOUT)
        assert (gated.finished, manager.in_flight) == (0, 1), "a compaction is still in flight"
        gated.gate.set()
    assert gated.finished == 1, "the compaction in flight landed before the server stopped"
    assert manager.counters["completed"] == 1


@pytest.mark.asyncio
async def test_a_request_stuck_past_the_shutdown_timeout_is_abandoned_and_the_server_still_stops() -> None:
    store = GatedStore()  # its gate never opens
    async with running(settings(shutdown_timeout=0.2), store=store) as server, wire(server) as bot:
        await bot.open("room-1")
        await bot.send({"type": "turn.append", "id": "stuck", "session": "room-1", "turn": turn_body(0)})
        with anyio.fail_after(TIMEOUT):
            await store.entered.wait()
        with capture_logs() as logs:
            await server.shutdown()
        assert await bot.closed_with() == 1001
        assert "voice_context_shutdown_forced" in [e["event"] for e in logs]
        assert server.connections == 0


def test_the_token_bucket_allows_a_burst_then_the_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, now=100.0)
    assert [bucket.take(100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(100.0) == pytest.approx(0.5)
    assert bucket.take(100.25) == pytest.approx(0.25)
    assert bucket.take(100.5) == 0.0
    assert bucket.take(1000.0) == 0.0
    assert [bucket.take(1000.0) for _ in range(3)][-1] > 0, "never more than the burst saved up"


def test_only_a_recent_turn_with_the_same_id_and_words_is_a_duplicate() -> None:
    session = Session("s")
    for i in range(5):
        session.receive(TurnAppended(Turn("Alice", "user", f"t{i}", float(i), f"id-{i}")))
    assert find_duplicate(session, Turn("Alice", "user", "t3", 3.0, "id-3")) == 3
    assert find_duplicate(session, Turn("Alice", "user", "changed", 3.0, "id-3")) is None
    assert find_duplicate(session, Turn("Alice", "user", "t3", 3.0)) is None
    assert find_duplicate(session, Turn("Alice", "user", "t0", 0.0, "id-0"), lookback=2) is None


def test_owners_are_digests_of_tokens() -> None:
    assert owner_of(None) is None
    owner = owner_of("secret-token")
    assert owner is not None and "secret-token" not in owner
    assert owner == owner_of("secret-token") != owner_of("other-token")


@pytest.mark.asyncio
async def test_a_turn_waiting_for_its_commit_holds_up_its_own_session_not_another() -> None:
    store = GatedStore()
    async with running(store=store) as server, wire(server) as bot:
        await bot.open("room-a")
        await bot.open("room-b")
        store.close_gate()
        await bot.send({"type": "turn.append", "id": "a0", "session": "room-a", "turn": turn_body(0)})
        await bot.send({"type": "context.get", "id": "a-ctx", "session": "room-a"})
        await bot.send({"type": "context.get", "id": "b-ctx", "session": "room-b"})
        with anyio.fail_after(TIMEOUT):
            await store.entered.wait()

        first = await bot.reply()
        assert first["id"] == "b-ctx", "room-b's context overtakes room-a's turn, still being stored"

        await bot.send({"type": "ping", "id": "barrier"})
        store.gate.set()
        replies = [await bot.reply() for _ in range(3)]
        assert [r["id"] for r in replies] == ["a0", "a-ctx", "barrier"], "a session's replies keep its order"
        assert replies[0]["index"] == 0
        assert replies[1]["messages"][-1]["content"].endswith("turn 0"), "the context sees the turn before it"


@pytest.mark.asyncio
async def test_a_backlog_appended_without_contexts_folds_in_the_background(tmp_path: Path) -> None:
    # an import, a burst, a bot that asks for context rarely: 400 turns and no context.get
    store = open_store("sqlite", data_dir=str(tmp_path))
    try:
        async with running(summarizer=DeterministicSummarizer(), store=store) as server, wire(server) as bot:
            await bot.open("import")
            for i in range(400):
                await bot.append("import", i, text=f"On day {i} we booked table {i} in Lisbon.")
            with anyio.fail_after(TIMEOUT * 4):
                await server.manager.settled()
            state = await bot.request("session.state", session="import")
            # folded until less than a backlog is left: the recent window and a few batches
            assert not state["in_flight"] and state["cursor"] > 400 - (50 + 4 * 10)
            assert state["turns"] == 400 and state["failures"] == 0
    finally:
        await store.aclose()
    store = open_store("sqlite", data_dir=str(tmp_path))
    try:
        async with running(summarizer=DeterministicSummarizer(), store=store) as server, wire(server) as bot:
            resumed = await bot.open("import")  # the folds were stored, not only held
            assert (resumed["turns"], resumed["cursor"]) == (400, state["cursor"])
            context = await bot.request("context.get", session="import", format="messages")
            assert "table 12" in context["summary"] and context["first_turn"] == state["cursor"]
    finally:
        await store.aclose()
