"""The SQLite store's reads on a reply's path (recall's postings and passages, the turns before
the cursor) run on a read-only connection of their own: a context is never queued behind a
group's commit."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from helpers import TIMEOUT

from voice_context.core.turns import Turn
from voice_context.manager import SessionManager
from voice_context.store.sqlite import SQLiteStore
from voice_context.summarizers.deterministic import DeterministicSummarizer

pytestmark = pytest.mark.asyncio


async def test_a_reply_s_reads_do_not_wait_for_a_commit_in_flight(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    async with SessionManager(DeterministicSummarizer(), store=store, recall_ahead="off") as manager:
        await manager.open("gym")
        await manager.append_turn("gym", Turn("Ana", "user", "My gym locker code is 4417.", 0.0))
        await manager.wait_indexed("gym")

        store.pause_before_commit = 2.0  # the next group holds the writer this long
        committed = anyio.Event()

        async def append() -> None:
            await manager.append_turn("gym", Turn("Ben", "user", "Shall we go at six?", 1.0))
            committed.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(append)
            await anyio.sleep(0.2)  # the append is in its commit now

            with anyio.fail_after(TIMEOUT):
                stats, _, postings = await store.recall_postings("gym", ["locker"])
                passages = await store.recall_passages("gym", [0])
                said = await store.read_turns("gym", 0, 1)

            assert not committed.is_set()  # the write is still in flight: the reads went past it
            assert stats.turns == 1 and [key for key, _, _ in postings["locker"]] == [0]
            assert passages[0].text == said[0].text == "My gym locker code is 4417."
            store.pause_before_commit = 0
        assert committed.is_set()
    await store.aclose()
