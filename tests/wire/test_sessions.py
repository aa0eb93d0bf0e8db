"""A session's life over the wire: opened, resumed with limits given again, closed, deleted,
and the races between them. Over real connections to a real server."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from serving import T0, TIMEOUT, running, settings, wire

from voice_context.core.config import SessionConfig
from voice_context.core.turns import Note, Turn
from voice_context.manager import SessionManager
from voice_context.server import owner_of, recording_name
from voice_context.store.base import SessionRecord
from voice_context.store.memory import MemoryStore
from voice_context.summarizers.fakes import ScriptedSummarizer, SlowSummarizer

SMALL = {"recent_window": 2, "batch_size": 1}


# -- stored notes over lowered limits; overrides given on a resume --------------------


def notes(count: int, what: str) -> list[Note]:
    return [Note(f"{what} {i}", T0 + i) for i in range(count)]


@pytest.mark.asyncio
async def test_a_session_holding_more_pending_notes_than_allowed_opens_and_the_store_is_trimmed() -> None:
    store = MemoryStore()
    await store.create(SessionRecord("room-1"))
    await store.save_notes("room-1", notes(12, "live"), notes(100, "pending"))  # limits since lowered
    async with running(store=store) as server, wire(server) as bot:
        opened = await bot.open("room-1")
        assert (opened["type"], opened["resumed"]) == ("session.opened", True), opened
        state = await bot.request("session.state", session="room-1")
        assert (state["live_notes"], state["pending_notes"]) == (8, 64)
        record = await store.load("room-1")
        assert record is not None
        assert [n.text for n in record.live_notes] == [f"live {i}" for i in range(4, 12)]
        # the oldest go first: 100 pending and 4 evicted live notes, the newest 64 of them kept
        kept = [f"pending {i}" for i in range(40, 100)] + [f"live {i}" for i in range(4)]
        assert [n.text for n in record.pending_notes] == kept


@pytest.mark.asyncio
async def test_limits_given_again_on_a_resume_are_stored_and_applied_to_the_stored_notes() -> None:
    store = MemoryStore()
    async with running(store=store) as server:
        async with wire(server) as bot:
            await bot.open("room-1")
            for i in range(6):
                note = {"text": f"screen {i}", "at": T0 + i}
                assert (await bot.request("note.append", session="room-1", note=note))["live"] == i + 1
        async with wire(server) as bot:
            await bot.open("room-1", config={"live_note_entries": 2, "max_pending_notes": 3})
            state = await bot.request("session.state", session="room-1")
            assert (state["live_notes"], state["pending_notes"]) == (2, 3)
        record = await store.load("room-1")
        assert record is not None
        assert record.config == {"live_note_entries": 2, "max_pending_notes": 3}
        assert (len(record.live_notes), len(record.pending_notes)) == (2, 3)
        async with wire(server) as bot:
            await bot.open("room-1")  # no config: the stored one holds
            noted = await bot.request("note.append", session="room-1", note={"text": "new", "at": T0 + 9})
            assert (noted["live"], noted["pending"]) == (2, 3)


# -- open/close races ----------------------------------------------------------------


class GatedLoadStore(MemoryStore):
    """Holds the next ``load`` of a session until the test opens the gate (a slow store read)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.entered = anyio.Event()
        self.gate = anyio.Event()

    async def load(self, name: str) -> SessionRecord | None:
        if self.armed:
            self.armed = False
            self.entered.set()
            await self.gate.wait()
        return await super().load(name)


@pytest.mark.asyncio
async def test_an_open_racing_a_close_of_the_same_session_leaves_it_fully_usable() -> None:
    store = GatedLoadStore()
    async with running(store=store) as server, wire(server) as old, wire(server) as new:
        await old.open("room-1", config=SMALL)
        store.armed = True  # the reconnected bot's open reads the store slowly...
        await new.send({"type": "session.open", "id": "resume", "session": "room-1"})
        with anyio.fail_after(TIMEOUT):
            await store.entered.wait()
        assert (await old.request("session.close", session="room-1"))["type"] == "session.closed"
        store.gate.set()  # ...and finishes after the old connection let the session go
        opened = await new.reply()
        assert (opened["id"], opened["type"], opened["resumed"]) == ("resume", "session.opened", True)
        for i in range(4):
            assert (await new.append("room-1", i))["index"] == i, "limits and listener are in place"
        await new.request("context.get", session="room-1")
        assert (await new.push())["type"] == "compaction.completed"


@pytest.mark.asyncio
async def test_two_tokens_opening_the_same_new_name_at_once_exactly_one_gets_it() -> None:
    store = GatedLoadStore()
    tokens = ("alpha-token", "beta-token")
    async with (
        running(settings(auth_tokens=tokens), store=store) as server,
        wire(server, token="alpha-token") as alpha,
        wire(server, token="beta-token") as beta,
    ):
        store.armed = True
        await alpha.send({"type": "session.open", "id": "a", "session": "room-1"})
        with anyio.fail_after(TIMEOUT):
            await store.entered.wait()
        await beta.send({"type": "session.open", "id": "b", "session": "room-1"})
        # a connection's frames are read in order, and another session's request is answered
        # beside them: once it is, beta's open is under way too, waiting behind alpha's
        elsewhere = await beta.request("session.state", session="room-2")
        assert elsewhere["code"] == "unknown_session"
        store.gate.set()
        answers = {(await alpha.reply())["type"], (await beta.reply())["type"]}
        assert answers == {"session.opened", "error"}
        state = await alpha.request("session.state", session="room-1")
        assert state["type"] == "session.state", "alpha opened it first"
        refused = await beta.request("session.state", session="room-1")
        assert refused["code"] == "unknown_session", "beta holds nothing, and gets none of alpha's events"
        record = await store.load("room-1")
        assert record is not None and record.owner == owner_of("alpha-token")


@pytest.mark.asyncio
async def test_a_close_right_after_a_context_request_cancels_the_compaction_it_started() -> None:
    """A context starts a fold; the session closes before the fold's answer is in: the fold is
    cancelled whether or not its summarizer call had begun, and nothing is committed."""
    summarizer = SlowSummarizer(ScriptedSummarizer(), delay=TIMEOUT)
    store = MemoryStore()
    config = SessionConfig(**SMALL)
    async with SessionManager(summarizer, config=config, store=store) as manager:
        await manager.open("room-1")
        for i in range(4):
            await manager.append_turn("room-1", Turn("Alice", "user", f"turn {i}", T0 + i))
        await manager.context("room-1")  # starts a compaction
        assert manager.in_flight == 1
        await manager.close("room-1")
        with anyio.fail_after(TIMEOUT / 2):
            await manager.settled()
    assert summarizer.finished == 0, "the compaction was cancelled before its answer came"
    record = await store.load("room-1")
    assert record is not None and record.cursor == 0


# -- a session can be deleted -------------------------------------------------------


@pytest.mark.asyncio
async def test_a_deleted_session_is_gone_from_every_connection_the_store_and_the_recordings(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    record_dir = tmp_path / "rec"
    async with (
        running(settings(record_dir=str(record_dir)), store=store) as server,
        wire(server) as bot,
        wire(server) as watcher,
    ):
        await bot.open("room-1", config=SMALL)
        await watcher.open("room-1")
        for i in range(4):
            await bot.append("room-1", i)
        assert (record_dir / recording_name("room-1")).exists()

        deleted = await bot.request("session.delete", session="room-1")
        assert deleted == {"type": "session.deleted", "id": bot.ids, "session": "room-1"}
        assert await store.load("room-1") is None
        assert not (record_dir / recording_name("room-1")).exists()
        for holder in (bot, watcher):
            assert (await holder.request("session.state", session="room-1"))["code"] == "unknown_session"
        reopened = await bot.open("room-1")
        assert (reopened["resumed"], reopened["turns"]) == (False, 0)


@pytest.mark.asyncio
async def test_only_a_session_open_here_for_this_token_can_be_deleted() -> None:
    async with (
        running(settings(auth_tokens=("alpha-token", "beta-token"))) as server,
        wire(server, token="alpha-token") as alpha,
        wire(server, token="beta-token") as beta,
    ):
        await alpha.open("room-1")
        refused = await beta.request("session.delete", session="room-1")
        assert refused["code"] == "unknown_session"
        assert (await alpha.request("session.state", session="room-1"))["type"] == "session.state"
