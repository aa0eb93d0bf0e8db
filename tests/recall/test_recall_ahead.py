"""Recall runs ahead of the reply: the search for a user turn starts when the turn is stored,
so the context the bot asks for before answering finds its passages ready, and they are the
passages the context's own search would find.

Every test runs on a real SQLite store; the store only counts the searches it serves (and, in
one story, holds the indexing of the question back)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import wait_until

from voice_context.config import AheadMode
from voice_context.core.recalled import IndexedDoc, RecallStats
from voice_context.core.turns import Turn
from voice_context.manager import SessionManager
from voice_context.store.sqlite import SQLiteStore
from voice_context.summarizers.deterministic import DeterministicSummarizer

pytestmark = pytest.mark.asyncio


class CountingStore(SQLiteStore):
    """The real SQLite store, counting the recall searches it serves (one read each)."""

    searches = 0

    async def recall_search(self, name: str, terms: Sequence[str], choose: Any, pick: Any) -> Any:
        self.searches += 1
        return await super().recall_search(name, terms, choose, pick)


def history() -> list[Turn]:
    """A locker code said early, then enough chatter that it leaves the verbatim window."""
    said = [Turn("Ana", "user", "My gym locker code is 4417, write that down.", 0.0)]
    said += [
        Turn("Ana" if k % 2 else "Bot", "user" if k % 2 else "assistant", f"We talk about plan {k}.", 1.0 + k)
        for k in range(40)
    ]
    return said


QUESTION = Turn("Ana", "user", "What was my gym locker code again?", 100.0)


async def told(manager: SessionManager, turns: Sequence[Turn]) -> None:
    """The session so far; the bot has just replied (it asked for a context first)."""
    await manager.open("gym", {"recent_window": 6, "batch_size": 4})
    for turn in turns:
        await manager.append_turn("gym", turn)
    await manager.wait_indexed("gym")
    for _ in range(8):  # and the folds it started have landed: the summary stands still
        await manager.context("gym", "messages")
        await manager.settled()


async def asked(manager: SessionManager, store: CountingStore) -> int:
    """The user asks; returns the searches the store has served once the search ahead ran."""
    searches = store.searches + 1
    await manager.append_turn("gym", QUESTION)
    await wait_until(lambda: store.searches == searches)
    return searches


async def test_the_search_for_a_user_turn_runs_before_the_context_is_asked(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "sessions.db")
    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        await told(manager, history())
        searches = store.searches
        await manager.append_turn("gym", QUESTION)
        await wait_until(lambda: store.searches == searches + 1)  # nobody asked for a context yet

        ctx = await manager.context("gym", "instructions", budget_chars=1500)

        assert ctx.query == QUESTION.text
        assert "locker code is 4417" in ctx.instructions
        assert store.searches == searches + 1  # the context used what was found ahead
    await store.aclose()


async def test_in_a_group_only_the_first_user_turn_after_a_reply_is_searched_ahead(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "sessions.db")
    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        await told(manager, history())
        searches = store.searches
        for k, who in enumerate(("Ben", "Cy", "Ana")):
            await manager.append_turn(
                "gym", Turn(who, "user", f"{who} has a question about plan {k}.", 90.0 + k)
            )
        await manager.append_turn("gym", QUESTION)
        await wait_until(lambda: store.searches == searches + 1)  # Ben's turn, the first after the reply

        ctx = await manager.context("gym", "instructions", budget_chars=1500)

        assert "locker code is 4417" in ctx.instructions
        assert store.searches == searches + 2  # the question itself is searched on the reply path
        await manager.append_turn("gym", Turn("Ana", "user", "And my locker number?", 110.0))
        await wait_until(lambda: store.searches == searches + 3)  # a context re-arms recall ahead
    await store.aclose()


async def test_searching_ahead_for_every_user_turn_has_a_group_s_newest_ready(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "sessions.db")
    async with SessionManager(DeterministicSummarizer(), store=store, recall_ahead="every") as manager:
        await told(manager, history())
        searches = store.searches
        group = [
            Turn(who, "user", f"{who} has a question about plan {k}.", 90.0 + k)
            for k, who in enumerate("BCD")
        ]
        for k, turn in enumerate([*group, QUESTION], start=1):
            await manager.append_turn("gym", turn)
            searched = searches + k
            await wait_until(lambda: store.searches == searched)  # noqa: B023 - awaited here, each, as it is stored

        ctx = await manager.context("gym", "instructions", budget_chars=1500)

        assert "locker code is 4417" in ctx.instructions
        assert store.searches == searches + 4  # none on the reply path
    await store.aclose()


async def test_a_turn_stored_after_the_search_ahead_makes_the_context_search_again(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "sessions.db")
    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        await told(manager, history())
        searches = await asked(manager, store)
        await manager.append_turn("gym", Turn("Bot", "assistant", "Let me check that for you.", 101.0))

        ctx = await manager.context("gym", "instructions", budget_chars=1500)

        assert "locker code is 4417" in ctx.instructions
        # a bot turn starts no search, but the index holds one doc more than the search ahead
        # read: its word counts, so its ranking, may differ
        assert store.searches == searches + 1
    await store.aclose()


async def test_a_context_for_another_query_searches_for_itself(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "sessions.db")
    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        await told(manager, history())
        searches = await asked(manager, store)

        ctx = await manager.context("gym", "instructions", budget_chars=1500, query="the locker code")

        assert ctx.query == "the locker code"
        assert "locker code is 4417" in ctx.instructions
        assert store.searches == searches + 1
    await store.aclose()


async def test_a_summary_replaced_since_the_search_makes_the_context_search_again(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "sessions.db")
    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        await told(manager, history())
        for k in range(10):  # the bot talks on: a fold is due at the next context
            await manager.append_turn("gym", Turn("Bot", "assistant", f"Looking in record {k}.", 90.0 + k))
        searches = await asked(manager, store)
        before = manager.session("gym").summary
        await manager.context("gym", "messages")  # uses the search ahead; a fold starts in the background
        assert store.searches == searches
        await manager.settled()
        assert manager.session("gym").summary != before
        searches = store.searches

        ctx = await manager.context("gym", "instructions", budget_chars=1500)

        assert store.searches == searches + 1  # the summary's lines it searched are gone
        assert "locker code is 4417" in ctx.instructions
    await store.aclose()


async def test_with_recall_ahead_off_the_context_searches_on_the_reply_path(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "sessions.db")
    async with SessionManager(DeterministicSummarizer(), store=store, recall_ahead="off") as manager:
        await told(manager, history())
        searches = store.searches
        await manager.append_turn("gym", QUESTION)
        await manager.wait_indexed("gym")
        assert store.searches == searches

        ctx = await manager.context("gym", "instructions", budget_chars=1500)

        assert "locker code is 4417" in ctx.instructions
        assert store.searches == searches + 1
    await store.aclose()


# -- what the search ahead finds is what the context's own search would ------------------------


class HeldIndex(CountingStore):
    """The real SQLite store, whose index writes wait while ``held`` and while a search reads
    the index: a search begun before the index takes a turn reads the index without it."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.held: anyio.Event | None = None
        self.reading = 0
        self.read = anyio.Event()

    async def recall_search(self, name: str, terms: Sequence[str], choose: Any, pick: Any) -> Any:
        self.reading += 1
        try:
            return await super().recall_search(name, terms, choose, pick)
        finally:
            self.reading -= 1
            self.read.set()

    async def append_turn(
        self, name: str, index: int, turn: Turn, doc: IndexedDoc | None = None
    ) -> RecallStats | None:
        """Stores the turn without its doc: the turn is indexed by a write of its own, as a
        store that indexes apart from its appends does (Redis)."""
        return await super().append_turn(name, index, turn)

    async def index_turns(self, name: str, start: int, docs: Sequence[IndexedDoc]) -> RecallStats:
        if self.held is not None:
            await self.held.wait()
        while self.reading:
            self.read = anyio.Event()
            await self.read.wait()
        return await super().index_turns(name, start, docs)


def locker_talk() -> list[Turn]:
    """The locker code said early, the locker room once since, then chatter: 2 of the 41 turns
    say "locker" (under 5%: a word a context without a query searches by); with the question
    stored, 3 of 42 do (over 5%: too common to search by)."""
    said = history()
    said[20] = Turn("Ana", "user", "The locker room floor was wet again today.", 20.0)
    return said


async def recalled_at_the_end(path: Path, ahead: AheadMode) -> tuple[list[str], int]:
    """One session told the same way: the user asks, and the question's indexing is held until
    everything else has had its turn (a search ahead that runs then reads the index without
    it); then the bot asks for its context, once the index holds every turn. Returns what the
    context recalled, and how many searches it made on its reply path."""
    store = HeldIndex(path)
    async with SessionManager(DeterministicSummarizer(), store=store, recall_ahead=ahead) as manager:
        await told(manager, locker_talk())
        store.held = anyio.Event()
        await manager.append_turn("gym", QUESTION)
        await anyio.wait_all_tasks_blocked()
        store.held.set()
        await manager.wait_indexed("gym")

        searches = store.searches
        ctx = await manager.context("gym", "messages")  # no budget: every passage recalled is shown
    await store.aclose()
    return [passage.line for passage in ctx.recalled], store.searches - searches


async def test_what_the_search_ahead_finds_is_what_the_context_would_find_itself(tmp_path: Path) -> None:
    on_the_reply_path = [await recalled_at_the_end(tmp_path / f"off-{k}.db", "off") for k in range(2)]
    ahead = [await recalled_at_the_end(tmp_path / f"first-{k}.db", "first") for k in range(3)]

    off, searched = on_the_reply_path[0]
    assert any("locker code is 4417" in line for line in off)
    assert not any("locker room" in line for line in off)  # "locker" is too common to search by now
    assert searched == 1
    assert on_the_reply_path == [(off, 1)] * 2
    assert ahead == [(off, 0)] * 3  # the same passages, found off the reply path
