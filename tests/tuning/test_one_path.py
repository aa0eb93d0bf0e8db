"""One reply path: a recording replayed offline gets the contexts a served session gives.

The offline replay is the session manager on the memory store, on a logical clock. Here the
project's recordings are replayed both offline and against a real server (on 127.0.0.1, through
the bot client, on the same kind of store), the server's clock and summarizer on the same
logical time, with the same requests: under a char budget and under a token budget alone, in
both formats, with an emergency overflow in the middle. Every context is the same, byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT
from serving import running, settings

from voice_context.codec import ErrorReply, Ping, Pong, SessionOpen, SessionOpened, TurnAppend, TurnStored
from voice_context.config import ServerSettings, Settings
from voice_context.core.turns import Turn
from voice_context.manager import SessionManager
from voice_context.server.local import LocalConnection, local_handlers
from voice_context.store.memory import MemoryStore
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.tuning.replay import LogicalTime, ReplayResult, replay_file, replay_live

FIXTURES = ROOT / "fixtures"

#: (recording, format, budget): every recording, both formats, and a char and a token budget
#: in each format
CASES = [
    ("raid-night", "messages", {"budget_tokens": 600}),
    ("raid-night", "instructions", {"budget_chars": 2500}),
    ("offsite-planning", "messages", {"budget_chars": 2500}),
    ("offsite-planning", "instructions", {"budget_tokens": 600}),
]
OVERFLOW_LIMIT = 700
"""The tokens the bot's model takes, in the overflow in the middle of each recording."""


def asked_as(recording: Path, format: str, budget: dict[str, int], out: Path) -> Path:
    """The recording with every request asked in ``format`` under ``budget`` alone, and its
    middle request a ``context.overflow`` at ``OVERFLOW_LIMIT`` tokens instead."""
    messages = [json.loads(line) for line in recording.read_text().splitlines() if line.strip()]
    requests = [m for m in messages if m["type"] == "context.get"]
    middle = requests[len(requests) // 2]
    for message in requests:
        message.pop("budget_chars", None)
        message.update(format=format, **budget)
    middle.update(type="context.overflow", limit_tokens=OVERFLOW_LIMIT)
    middle.pop("budget_tokens", None)
    path = out / recording.name
    path.write_text("".join(json.dumps(m) + "\n" for m in messages))
    return path


async def served(path: Path) -> ReplayResult:
    """The recording sent to a real server whose manager runs on logical time."""
    logical = LogicalTime(DeterministicSummarizer())
    async with running(settings(), summarizer=logical.summarizer, store=MemoryStore()) as server:
        server.manager.clock = logical.clock
        logical.manager = server.manager
        return await replay_live(path, server.url, logical=logical)


def shown(result: ReplayResult) -> list[tuple[Any, ...]]:
    return [
        (c["request_id"], c["response"]["first_turn"], c["response"]["turns_shown"]) for c in result.contexts
    ]


def reply(record: dict[str, Any]) -> dict[str, Any]:
    """A context reply without what only names the request on the wire."""
    return {k: v for k, v in record["response"].items() if k != "id"}


@pytest.mark.asyncio
@pytest.mark.parametrize(("name", "format", "budget"), CASES)
async def test_a_recording_gets_the_same_contexts_offline_as_from_a_served_session(
    tmp_path: Path, name: str, format: str, budget: dict[str, int]
) -> None:
    path = asked_as(FIXTURES / f"{name}.jsonl", format, budget, tmp_path)

    offline = await replay_file(path, Settings())
    online = await served(path)

    assert len(offline.contexts) == 18 and offline.skipped == online.skipped == []
    assert shown(offline) == shown(online)
    assert [reply(c) for c in offline.contexts] == [reply(c) for c in online.contexts]
    # the overflow folded at once on both sides, and so did the batch rule before and after it
    [emergency] = [c for c in offline.compactions if c.get("emergency")]
    [overflowed] = [c["response"] for c in online.contexts if "emergency" in c["response"]]
    assert overflowed["emergency"]["folded"] == emergency["end"] - emergency["start"] > 0
    assert overflowed["tokens"] <= OVERFLOW_LIMIT
    assert offline.contexts[-1]["state"]["compactions"] == online.contexts[-1]["state"]["compactions"] > 2


@pytest.mark.asyncio
async def test_a_connection_in_the_process_is_answered_by_the_servers_own_handlers() -> None:
    """What the offline replay sends its recordings through: the server's table, its refusals
    included, each reply read back by the codec; only the operator's overrides skip the client's
    checks."""
    async with SessionManager(DeterministicSummarizer()) as manager:
        conn = LocalConnection(local_handlers(manager, ServerSettings(), overrides={"retry_base_seconds": 1}))
        said = Turn("Alice", "user", "Book Lisbon for May 3rd.", 1_714_572_187.0, "t0")
        refused, sent = await conn.request(TurnAppend("room-1", said, 1))
        assert isinstance(refused, ErrorReply) and (refused.code, sent["code"]) == ("unknown_session",) * 2
        asked, _ = await conn.request(SessionOpen("room-1", {"retry_base_seconds": 1}))
        assert isinstance(asked, ErrorReply) and asked.code == "bad_request", "a client may not set it"
        opened, _ = await conn.request(SessionOpen("room-1", {"recent_window": 30}, "o"))
        assert opened == SessionOpened("room-1", False, 0, 0, 0, False, "o")
        assert manager.session("room-1").config.retry_base_seconds == 1, "the operator's, on top"
        assert await conn.request(TurnAppend("room-1", said, 2)) == (
            TurnStored("room-1", 0, 2),
            {"type": "turn.appended", "id": 2, "session": "room-1", "index": 0},
        )
        stored, _ = await conn.request(TurnAppend("room-1", said, 3))
        assert stored == TurnStored("room-1", 0, 3, duplicate=True)
        assert (await conn.request(Ping(4)))[0] == Pong(4)
        await conn.close()
        assert (conn.sessions, manager.names()) == (set(), [])
