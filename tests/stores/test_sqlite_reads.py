"""The SQLite store's reads on a reply's path (recall's postings and passages, the turns before
the cursor) run on a read-only connection of their own: a context is never queued behind a
group's commit. And what a context read before an await still holds after it: a fold that
lands meanwhile never leaves a hole in the verbatim run; a search's passages are of the
snapshot its postings were read from. They run on the event loop's own thread, with no hand-off
to wait for, and a read that finds the file busy waits for it in the reader's thread instead."""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread
import pytest
from helpers import TIMEOUT, turns, wait_until

from voice_context.core.turns import Turn
from voice_context.manager import CompactionEvent, SessionManager
from voice_context.recall.index import MAX_OLDER_TURNS, indexed, turn_passage
from voice_context.recall.stored import search_store
from voice_context.store import SessionRecord
from voice_context.store.sqlite import LOOP_READ_TURNS, SQLiteStore
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.summarizers.fakes import ScriptedSummarizer

pytestmark = pytest.mark.asyncio

T = TypeVar("T")


class HeldCommit:
    """A commit hook for the store: once ``hold`` is called, the next group waits between its
    last statement and its COMMIT, holding the writer, until ``release``."""

    def __init__(self) -> None:
        self.armed = False
        self.holding = threading.Event()
        self.released = threading.Event()

    def hold(self) -> None:
        self.armed = True

    def release(self) -> None:
        self.released.set()

    def __call__(self, writes: Sequence[Sequence[object]]) -> None:  # in the writer's thread
        if self.armed:
            self.armed = False
            self.holding.set()
            self.released.wait(TIMEOUT)


async def test_a_reply_s_reads_do_not_wait_for_a_commit_in_flight(tmp_path: Path) -> None:
    commit = HeldCommit()
    store = SQLiteStore(tmp_path / "sessions.db", before_commit=commit)
    async with SessionManager(DeterministicSummarizer(), store=store, recall_ahead="off") as manager:
        await manager.open("gym")
        said = Turn("Ana", "user", "My gym locker code is 4417.", 0.0)
        await manager.append_turn("gym", said)
        await store.index_turns("gym", 0, [indexed(turn_passage(0, said))])  # (held by the manager)

        commit.hold()  # the next group holds the writer until released
        committed = anyio.Event()

        async def append() -> None:
            await manager.append_turn("gym", Turn("Ben", "user", "Shall we go at six?", 1.0))
            committed.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(append)
            # the append is in its commit now
            assert await anyio.to_thread.run_sync(commit.holding.wait, TIMEOUT)

            with anyio.fail_after(TIMEOUT):
                stats, _, postings = await store.recall_postings("gym", ["locker"])
                passages = await store.recall_passages("gym", [0])
                read = await store.read_turns("gym", 0, 1)

            assert not committed.is_set()  # the write is still in flight: the reads went past it
            assert stats.turns == 1 and [key for key, _, _ in postings["locker"]] == [0]
            assert passages[0].text == read[0].text == "My gym locker code is 4417."
            commit.release()
        assert committed.is_set()
    await store.aclose()


class SecondFoldHeld(ScriptedSummarizer):
    """Folds as the scripted summarizer does by default; its second fold is held until
    ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = anyio.Event()

    async def summarize(self, request: SummaryRequest) -> str:
        if len(self.requests) == 1:
            await self.release.wait()
        return await super().summarize(request)


class WatchedReads(SQLiteStore):
    """The real SQLite store. Once ``watch`` is called, the next read of turns tells the test
    it has begun (``reading``), then waits for ``landed`` before it reads."""

    reading: anyio.Event | None = None
    landed: anyio.Event | None = None

    def watch(self, landed: anyio.Event) -> anyio.Event:
        self.reading, self.landed = anyio.Event(), landed
        return self.reading

    async def read_turns(self, name: str, start: int, end: int) -> list[Turn]:
        if self.reading is not None and self.landed is not None:
            self.reading.set()
            self.reading = None
            await self.landed.wait()
        return await super().read_turns(name, start, end)


def verbatim_indices(instructions: str) -> list[int]:
    """The transcript indices of the turns an instructions context shows, in order."""
    section = instructions[instructions.index("Recent conversation:") :]
    return [int(n) for n in re.findall(r"^\w+: turn (\d+)$", section, re.MULTILINE)]


async def test_a_fold_landing_while_a_context_reads_the_older_turns_leaves_no_hole(tmp_path: Path) -> None:
    store = WatchedReads(tmp_path / "sessions.db")
    summarizer = SecondFoldHeld()
    async with SessionManager(summarizer, store=store) as manager:
        await manager.open("room", {"recent_window": 4, "batch_size": 6, "recall": False})
        for said in turns(12):
            await manager.append_turn("room", said)
        await manager.context("room", "messages")  # the first fold: turns 0-5
        await wait_until(lambda: manager.state("room").cursor == 6)
        for said in turns(6, 12):
            await manager.append_turn("room", said)

        landed = anyio.Event()

        def on_compaction(event: CompactionEvent) -> None:
            if event.kind == "completed":
                landed.set()

        manager.add_listener(on_compaction)
        summarizer.release = store.watch(landed)  # the second fold lands as the next context reads
        await manager.context("room", "messages")  # starts the second fold: turns 6-11
        with anyio.fail_after(TIMEOUT):
            ctx = await manager.context("room", "instructions", budget_chars=4000)

        assert ctx.cursor == 12  # the second fold landed while the context awaited its read
        shown = verbatim_indices(ctx.instructions)
        assert shown == list(range(ctx.first_turn, 18))  # one run, ending at the newest turn
        assert ctx.turns_shown == len(shown)
    await store.aclose()


# -- a search reads one snapshot ---------------------------------------------------------------


class WriteAfterARead(SQLiteStore):
    """The real SQLite store. Given a write (``after_read``), it runs that write once the next
    read on the reader has ended, before the reader's caller is answered: where a write lands
    that comes between two reads of one caller."""

    after_read: Callable[[], Awaitable[None]] | None = None

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        read = self.db.run_read

        async def read_then_write(
            where: str, op: Callable[[sqlite3.Connection], T], on_loop: bool = True
        ) -> T:
            answer = await read(where, op, on_loop=on_loop)
            if self.after_read is not None:
                write, self.after_read = self.after_read, None
                await write()
            return answer

        self.db.run_read = read_then_write  # type: ignore[method-assign]


GYM = [
    Turn("Ana", "user", "My gym locker code is 4417, write that down.", 0.0),
    Turn("Bot", "assistant", "Noted: 4417.", 1.0),
    Turn("Ana", "user", "Thanks, see you tomorrow.", 2.0),
]
BEGUN_AGAIN = [
    Turn("Cy", "user", "Shall we meet at six by the station?", 10.0),
    Turn("Bot", "assistant", "Six works, see you there.", 11.0),
    Turn("Cy", "user", "Great.", 12.0),
]


async def test_a_search_shows_the_passages_of_the_postings_it_read(tmp_path: Path) -> None:
    store = WriteAfterARead(tmp_path / "sessions.db")
    await store.create(SessionRecord("gym"))
    for i, said in enumerate(GYM):
        await store.append_turn("gym", i, said)
    await store.index_turns("gym", 0, [indexed(turn_passage(i, said)) for i, said in enumerate(GYM)])

    async def begun_again() -> None:
        """The session forgotten, and another begun under its name, without an index yet."""
        await store.delete("gym")
        await store.create(SessionRecord("gym"))
        for i, said in enumerate(BEGUN_AGAIN):
            await store.append_turn("gym", i, said)

    store.after_read = begun_again  # lands as soon as the search has read from the store once
    stats, found = await search_store(store, "gym", "What was my locker code?", before=2, limit=4)

    assert store.after_read is None and await store.read_turns("gym", 0, 1) == BEGUN_AGAIN[:1]
    assert stats.turns == 3
    # the postings the search ranked were of the gym talk: so are the passages it shows
    assert [recalled.turn for recalled in found] == [0, 1]
    assert "Ana: My gym locker code is 4417" in found[0].line and "Bot: Noted: 4417." in found[1].line
    await store.aclose()


# -- where a reply's reads run -----------------------------------------------------------------


def where_it_ran(ran_on: list[int]) -> Callable[[sqlite3.Connection], int]:
    """A read of the store's turn count that notes the thread it ran on."""

    def op(conn: sqlite3.Connection) -> int:
        ran_on.append(threading.get_ident())
        return int(conn.execute("SELECT count(*) FROM turns").fetchone()[0])

    return op


async def test_a_reply_s_reads_run_on_the_event_loop_s_thread_unless_kept_on_a_thread_of_their_own(
    tmp_path: Path,
) -> None:
    on_loop = SQLiteStore(tmp_path / "loop.db")
    on_thread = SQLiteStore(tmp_path / "thread.db", reads="thread")
    loop_thread = threading.get_ident()
    for store in (on_loop, on_thread):
        await store.create(SessionRecord("gym"))
        for i, said in enumerate(GYM):
            await store.append_turn("gym", i, said)

    ran_on: list[int] = []
    assert await on_loop.db.run_read("count", where_it_ran(ran_on)) == 3
    assert await on_thread.db.run_read("count", where_it_ran(ran_on)) == 3
    assert await on_loop.read_turns("gym", 0, 3) == await on_thread.read_turns("gym", 0, 3) == GYM

    assert ran_on[0] == loop_thread, "no hand-off: the read ran where the reply is built"
    assert ran_on[1] != loop_thread, "kept on the reader's thread"
    assert on_loop.db.reader is None, "nothing went to the reader's thread"

    # a run of turns longer than a context reads (a tier's roll reads a day) goes to the thread;
    # the most a context reads of the turns before its cursor stays on the loop
    assert MAX_OLDER_TURNS <= LOOP_READ_TURNS
    assert await on_loop.read_turns("gym", 0, LOOP_READ_TURNS + 1) == GYM
    assert on_loop.db.reader is not None
    for store in (on_loop, on_thread):
        await store.aclose()


def needs_the_write_lock(ran_on: list[int]) -> Callable[[sqlite3.Connection], int]:
    """An operation that takes the file's write lock, as no read does: where the writer holds
    it, it finds the file busy, as a read does in the rare moments a WAL file is busy for
    readers. It changes nothing."""

    def op(conn: sqlite3.Connection) -> int:
        ran_on.append(threading.get_ident())
        conn.execute("PRAGMA query_only = OFF")
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                return int(conn.execute("SELECT count(*) FROM turns").fetchone()[0])
            finally:
                conn.execute("ROLLBACK")
        finally:
            conn.execute("PRAGMA query_only = ON")

    return op


async def test_a_read_that_finds_the_file_busy_waits_for_it_in_the_reader_s_thread_never_on_the_loop(
    tmp_path: Path,
) -> None:
    commit = HeldCommit()
    store = SQLiteStore(tmp_path / "sessions.db", before_commit=commit)
    await store.create(SessionRecord("gym"))
    await store.append_turn("gym", 0, GYM[0])
    loop_thread = threading.get_ident()
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.005)
            ticks += 1

    commit.hold()  # the next append holds the file's write lock until released
    ran_on: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(store.append_turn, "gym", 1, GYM[1])
        assert await anyio.to_thread.run_sync(commit.holding.wait, TIMEOUT)
        tg.start_soon(tick)

        async def release_later() -> None:
            await wait_until(lambda: len(ran_on) == 2)  # tried on the loop, then on the reader's thread
            await wait_until(lambda: ticks >= 10)  # the loop goes on meanwhile
            commit.release()

        tg.start_soon(release_later)
        with anyio.fail_after(TIMEOUT):
            counted = await store.db.run_read("count", needs_the_write_lock(ran_on))
        tg.cancel_scope.cancel()

    assert counted == 2, "it waited for the append's commit"
    assert ran_on[0] == loop_thread and ran_on[1] != loop_thread
    assert store.db.busy_reads == 1
    assert ticks >= 10, "the event loop went on while the read waited"
    await store.aclose()
