"""The store contract, told once and run against every backend.

The same stories run on the in-process store, on SQLite files on disk, on a
real ``redis-server`` and on a real three-node Redis Cluster started for this
module (where a script that touched two slots would fail with CROSSSLOT). Stories that only a durable
store can tell (a retried write, a reopened store, hash tags) run on those.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
import pytest_asyncio
from helpers import read_twice
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from voice_context.core.landmarks import Landmark
from voice_context.core.recalled import IndexedDoc, Posting, RecallStats
from voice_context.core.tiers import TierSummary
from voice_context.core.turns import Note, Turn
from voice_context.errors import ConfigError, SessionNotStored, StoreError
from voice_context.recall.index import choose_terms, index_terms, indexed, note_passage, turn_passage
from voice_context.store import (
    Created,
    FoldCommit,
    MemoryStore,
    SessionRecord,
    Store,
    StoredSession,
    open_store,
)
from voice_context.store.base import ChooseTerms, PickPassages
from voice_context.store.common import TurnConflict
from voice_context.store.group import GroupCommit
from voice_context.store.redis import RedisStore
from voice_context.store.sqlite import SCHEMA_VERSION, SQLiteStore
from voice_context.testing.redis_server import RedisClusterServers, RedisServer

T0 = 1714572187.0
BACKENDS = ["memory", "sqlite", "redis", "redis-cluster"]
DURABLE = ["sqlite", "redis", "redis-cluster"]


@contextlib.contextmanager
def raw_file(path: Path) -> Iterator[sqlite3.Connection]:
    """A store's file opened by hand, as another program would: what it changes is committed
    at the end, and the connection closed (``with sqlite3.connect(...)`` alone only commits)."""
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        yield conn


def turn(i: int, speaker: str = "Alice") -> Turn:
    return Turn(speaker, "user", f"line {i} from {speaker}", T0 + i, id=f"t{i}")


def note(i: int) -> Note:
    return Note(f"screen {i}", T0 + i, speaker="Alice", source="game")


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(directory=tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    with RedisClusterServers(directory=tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster


class Backend:
    """Makes stores of one kind that all see the same data (one file, one prefix)."""

    def __init__(self, kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.path = tmp_path / "data" / "voice-context.db"
        self.prefix = f"t{uuid.uuid4().hex[:8]}"
        self.url = ""
        if kind == "redis":
            self.url = request.getfixturevalue("redis_server").url
        elif kind == "redis-cluster":
            self.url = request.getfixturevalue("redis_cluster").url
        self.opened: list[Store] = []
        self._memory = MemoryStore()

    def open(self) -> Store:
        store: Store
        if self.kind == "memory":
            store = self._memory
        elif self.kind == "sqlite":
            store = SQLiteStore(self.path)
        else:
            store = RedisStore(self.url, prefix=self.prefix)
        self.opened.append(store)
        return store

    async def aclose(self) -> None:
        for store in self.opened:
            await store.aclose()


@pytest_asyncio.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    made = Backend(request.param, tmp_path, request)
    yield made
    await made.aclose()


@pytest_asyncio.fixture(params=DURABLE)
async def durable(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    made = Backend(request.param, tmp_path, request)
    yield made
    await made.aclose()


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.open()


async def a_session_with_turns(store: Store, name: str, count: int, **record: object) -> None:
    await store.create(SessionRecord(name, **record))  # type: ignore[arg-type]
    for i in range(count):
        await store.append_turn(name, i, turn(i))


# -- sessions and turns ------------------------------------------------------


@pytest.mark.asyncio
async def test_a_store_has_never_seen_a_session_until_it_is_created(store: Store) -> None:
    assert await store.load("room-1") is None

    created = await store.create(SessionRecord("room-1", config={"recent_window": 4}, owner="bot-a"))
    record = await store.load("room-1")

    assert created == Created(made=True, owner="bot-a")

    assert record is not None
    assert (record.name, record.cursor, record.summary, record.total_turns) == ("room-1", 0, "", 0)
    assert record.config == {"recent_window": 4}
    assert record.owner == "bot-a"
    assert record.turns == () and record.live_notes == () and record.pending_notes == ()


@pytest.mark.asyncio
async def test_creating_a_session_twice_keeps_the_first(store: Store) -> None:
    await a_session_with_turns(store, "room-1", 3, config={"batch_size": 2}, owner=None)

    created = await store.create(SessionRecord("room-1", config={"batch_size": 9}, owner="someone-else"))

    assert created == Created(made=False, owner=None), "told who owns the name: nobody's token"
    record = await store.load("room-1")
    assert record is not None
    assert record.config == {"batch_size": 2} and record.owner is None
    assert record.total_turns == 3
    again = await store.create(SessionRecord("room-1", owner=None))
    assert again == Created(made=False, owner=None), "the same owner is told it did not make it either"


@pytest.mark.asyncio
async def test_of_two_owners_creating_one_name_at_once_one_makes_it_and_both_learn_whose_it_is(
    backend: Backend,
) -> None:
    stores = [backend.open(), backend.open()]  # two connections (one store object for memory)
    for store in stores:  # connected first: redis-py's cluster client cannot race its own setup
        assert await store.load("nobody") is None
    names = [f"room-{i}" for i in range(20)]
    found: dict[tuple[str, str], Created] = {}

    async def create(store: Store, name: str, owner: str) -> None:
        found[name, owner] = await store.create(SessionRecord(name, owner=owner))

    async with anyio.create_task_group() as tg:
        for name in names:
            tg.start_soon(create, stores[0], name, "bot-a")
            tg.start_soon(create, stores[1], name, "bot-b")
    for name in names:
        a, b = found[name, "bot-a"], found[name, "bot-b"]
        assert a.made != b.made, (name, a, b)
        winner = "bot-a" if a.made else "bot-b"
        assert a.owner == b.owner == winner, (name, a, b)
        record = await stores[1].load(name)
        assert record is not None and record.owner == winner


@pytest.mark.asyncio
async def test_turns_come_back_in_order_with_every_field(store: Store) -> None:
    odd = Turn("Zoë 🐉", "assistant", 'quotes " and \\ and\nnewlines\t\x01', 0.1 + 0.2, id=None)
    await store.create(SessionRecord("room-1"))
    for i in range(4):
        await store.append_turn("room-1", i, turn(i))
    await store.append_turn("room-1", 4, odd)

    record = await store.load("room-1")

    assert record is not None
    assert record.total_turns == 5
    assert record.turns == (turn(0), turn(1), turn(2), turn(3), odd)
    assert await store.read_turns("room-1", 0, 5) == list(record.turns)
    assert await store.read_turns("room-1", 1, 3) == [turn(1), turn(2)]
    assert await store.read_turns("room-1", 3, 3) == []
    assert await store.read_turns("room-1", 4, 99) == [odd]
    passages = await store.recall_passages("room-1", [4, 1])
    assert passages == {1: turn_passage(1, turn(1)), 4: turn_passage(4, odd)}


@pytest.mark.asyncio
async def test_an_index_out_of_order_is_rejected_and_changes_nothing(store: Store) -> None:
    await a_session_with_turns(store, "room-1", 2)

    with pytest.raises(ValueError):
        await store.append_turn("room-1", 3, turn(3))  # would leave a gap at 2
    with pytest.raises(ValueError):
        await store.append_turn("room-1", 0, turn(7, "Mallory"))  # index 0 is taken

    assert await store.read_turns("room-1", 0, 10) == [turn(0), turn(1)]
    await store.append_turn("room-1", 2, turn(2))
    assert await store.read_turns("room-1", 0, 10) == [turn(0), turn(1), turn(2)]


@pytest.mark.asyncio
async def test_a_session_it_does_not_know_is_an_unknown_session(store: Store) -> None:
    with pytest.raises(SessionNotStored):
        await store.append_turn("ghost", 0, turn(0))
    with pytest.raises(SessionNotStored):
        await store.save_notes("ghost", [note(1)], [])
    with pytest.raises(SessionNotStored):
        await store.commit_compaction(
            "ghost", FoldCommit(expected_cursor=0, new_cursor=0, summary="", pending_notes=())
        )
    with pytest.raises(SessionNotStored):
        await store.read_turns("ghost", 0, 1)
    with pytest.raises(SessionNotStored):
        await store.acquire_lease("ghost", "replica-a", 10)
    await store.release_lease("ghost", "replica-a")
    await store.delete("ghost")
    assert await store.load("ghost") is None


@pytest.mark.asyncio
async def test_notes_are_replaced_as_a_whole(store: Store) -> None:
    await store.create(SessionRecord("room-1"))

    await store.save_notes("room-1", [note(1), note(2)], [])
    await store.save_notes("room-1", [note(2), note(3)], [note(1)])

    record = await store.load("room-1")
    assert record is not None
    assert record.live_notes == (note(2), note(3))
    assert record.pending_notes == (note(1),)


@pytest.mark.asyncio
async def test_config_overrides_are_replaced_as_a_whole(store: Store) -> None:
    await store.create(SessionRecord("room-1", config={"recent_window": 20}, owner="bot-1"))

    await store.save_config("room-1", {"batch_size": 5, "live_note_entries": 2})

    record = await store.load("room-1")
    assert record is not None
    assert (record.config, record.owner) == ({"batch_size": 5, "live_note_entries": 2}, "bot-1")
    with pytest.raises(SessionNotStored):
        await store.save_config("ghost", {})


# -- compaction commits ---------------------------------------------------------


@pytest.mark.asyncio
async def test_a_commit_moves_cursor_summary_and_pending_notes_together(store: Store) -> None:
    await a_session_with_turns(store, "room-1", 8)
    await store.save_notes("room-1", [note(5)], [note(1), note(2)])

    landed = await store.commit_compaction(
        "room-1",
        FoldCommit(
            expected_cursor=0, new_cursor=5, summary="Alice spoke five times.", pending_notes=[note(2)]
        ),
    )

    assert landed
    record = await store.load("room-1")
    assert record is not None
    assert (record.cursor, record.summary) == (5, "Alice spoke five times.")
    assert record.pending_notes == (note(2),)
    assert record.live_notes == (note(5),)
    assert record.turns == (turn(5), turn(6), turn(7)), "a live session gets only the turns from the cursor"
    assert record.total_turns == 8
    assert await store.read_turns("room-1", 0, 8) == [turn(i) for i in range(8)], "the transcript stays"


@pytest.mark.asyncio
async def test_a_commit_from_a_cursor_that_moved_on_is_refused(store: Store) -> None:
    await a_session_with_turns(store, "room-1", 8)
    assert await store.commit_compaction(
        "room-1", FoldCommit(expected_cursor=0, new_cursor=4, summary="first four", pending_notes=())
    )

    late = await store.commit_compaction(
        "room-1",
        FoldCommit(
            expected_cursor=0, new_cursor=6, summary="an older view of the first six", pending_notes=()
        ),
    )

    assert not late
    record = await store.load("room-1")
    assert record is not None
    assert (record.cursor, record.summary) == (4, "first four")


@pytest.mark.asyncio
async def test_a_commit_with_a_superseded_fence_is_refused(store: Store) -> None:
    await a_session_with_turns(store, "room-1", 8)
    stalled = await store.acquire_lease("room-1", "replica-a", 30)
    assert stalled is not None
    await store.release_lease("room-1", "replica-a")  # or it expired while replica-a was stalled
    newer = await store.acquire_lease("room-1", "replica-b", 30)
    assert newer is not None and newer > stalled

    refused = await store.commit_compaction(
        "room-1",
        FoldCommit(expected_cursor=0, new_cursor=4, summary="stale words", pending_notes=(), fence=stalled),
    )
    landed = await store.commit_compaction(
        "room-1",
        FoldCommit(expected_cursor=0, new_cursor=4, summary="fresh words", pending_notes=(), fence=newer),
    )

    assert (refused, landed) == (False, True)
    record = await store.load("room-1")
    assert record is not None
    assert (record.cursor, record.summary) == (4, "fresh words")


# -- leases -------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_lease_is_exclusive_and_every_grant_has_a_larger_token(store: Store) -> None:
    await store.create(SessionRecord("room-1"))

    first = await store.acquire_lease("room-1", "replica-a", 30)
    assert first is not None
    assert await store.acquire_lease("room-1", "replica-b", 30) is None

    renewed = await store.acquire_lease("room-1", "replica-a", 30)
    assert renewed is not None and renewed > first

    await store.release_lease("room-1", "replica-b")  # not the holder: no effect
    assert await store.acquire_lease("room-1", "replica-b", 30) is None

    await store.release_lease("room-1", "replica-a")
    taken = await store.acquire_lease("room-1", "replica-b", 30)
    assert taken is not None and taken > renewed


@pytest.mark.asyncio
async def test_a_lease_nobody_releases_expires(store: Store) -> None:
    await store.create(SessionRecord("room-1"))
    crashed = await store.acquire_lease("room-1", "replica-a", 0.05)
    assert crashed is not None

    taken: int | None = None
    with anyio.fail_after(10):
        while taken is None:
            await anyio.sleep(0.02)
            taken = await store.acquire_lease("room-1", "replica-b", 30)

    assert taken > crashed
    assert await store.acquire_lease("room-1", "replica-a", 30) is None


@pytest.mark.asyncio
async def test_a_lease_is_renewed_by_its_holder_until_a_later_grant_supersedes_it(store: Store) -> None:
    await store.create(SessionRecord("room-1"))
    fence = await store.acquire_lease("room-1", "replica-a", 0.3)
    assert fence is not None
    for _ in range(4):  # renewed well within its ttl, it outlives it many times over
        await anyio.sleep(0.1)
        assert await store.renew_lease("room-1", "replica-a", fence, 0.3)
    assert await store.acquire_lease("room-1", "replica-b", 30) is None

    await anyio.sleep(0.5)  # lapsed, and nobody took it since: renewing takes it back
    assert await store.renew_lease("room-1", "replica-a", fence, 0.3)
    assert await store.acquire_lease("room-1", "replica-b", 30) is None

    await store.release_lease("room-1", "replica-a")
    newer = await store.acquire_lease("room-1", "replica-b", 30)
    assert newer is not None and newer > fence
    assert not await store.renew_lease("room-1", "replica-a", fence, 30), "superseded"
    assert await store.acquire_lease("room-1", "replica-a", 30) is None, "and it stays replica-b's"
    assert not await store.renew_lease("ghost", "replica-a", fence, 30)


@pytest.mark.asyncio
async def test_sessions_do_not_share_leases(store: Store) -> None:
    await store.create(SessionRecord("room-1"))
    await store.create(SessionRecord("room-2"))

    assert await store.acquire_lease("room-1", "replica-a", 30) is not None
    assert await store.acquire_lease("room-2", "replica-b", 30) is not None


# -- delete ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_deleted_session_is_forgotten_entirely(store: Store) -> None:
    await a_session_with_turns(store, "room-1", 3)
    await store.save_notes("room-1", [note(1)], [note(0)])
    await store.acquire_lease("room-1", "replica-a", 30)
    await a_session_with_turns(store, "room-2", 1)

    await store.delete("room-1")

    assert await store.load("room-1") is None
    with pytest.raises(SessionNotStored):
        await store.append_turn("room-1", 3, turn(3))
    await store.create(SessionRecord("room-1"))
    fresh = await store.load("room-1")
    assert fresh is not None and fresh.total_turns == 0 and fresh.live_notes == ()
    assert await store.acquire_lease("room-1", "replica-b", 30) is not None, "the old lease went too"
    other = await store.load("room-2")
    assert other is not None and other.total_turns == 1


@pytest.mark.asyncio
async def test_the_stored_sessions_of_an_owner_are_listed_by_name_and_listing_changes_nothing(
    store: Store,
) -> None:
    odd = "a room {with} 100% odd: name"
    await a_session_with_turns(store, "room-b", 3, owner="bot-a")
    await a_session_with_turns(store, "room-a", 2, owner="bot-b")
    await a_session_with_turns(store, odd, 1, owner="bot-a")
    await a_session_with_turns(store, "room-c", 4, owner=None)
    await a_session_with_turns(store, "room-d", 1, owner=None)
    assert await store.commit_compaction(
        "room-b", FoldCommit(expected_cursor=0, new_cursor=2, summary="Two turns.", pending_notes=[])
    )
    await store.delete("room-c")

    bot_a = await store.list_sessions("bot-a", 100)

    assert bot_a == [StoredSession(odd, "bot-a", 1, 0), StoredSession("room-b", "bot-a", 3, 2)]
    assert await store.list_sessions("bot-b", 100) == [StoredSession("room-a", "bot-b", 2, 0)]
    assert await store.list_sessions(None, 100) == [StoredSession("room-d", None, 1, 0)], "made without one"
    assert await store.list_sessions("bot-a", 1) == bot_a[:1]
    assert await store.list_sessions("nobody", 100) == []
    assert await store.list_sessions("bot-a", 100) == bot_a, "a listing changes nothing"
    record = await store.load("room-b")
    assert record is not None and record.owner == "bot-a" and record.cursor == 2


# -- the recall index ---------------------------------------------------------------


def doc(i: int, text: str | None = None) -> IndexedDoc:
    t = turn(i)
    return indexed(turn_passage(i, t if text is None else Turn(t.speaker, t.role, text, t.at)))


@pytest.mark.asyncio
async def test_the_recall_index_takes_each_stored_turn_once_and_in_order(store: Store) -> None:
    await a_session_with_turns(store, "room-1", 5)

    first = await store.index_turns("room-1", 0, [doc(i) for i in range(3)])
    again = await store.index_turns("room-1", 1, [doc(i) for i in range(1, 5)])
    gap = await store.index_turns("room-1", 7, [doc(7)])
    unstored = await store.index_turns("room-1", 5, [doc(5)])

    assert (first.turns, first.docs) == (3, 3)
    assert (again.turns, again.docs) == (5, 5), "turns 1 and 2 were indexed already"
    assert gap == again and unstored == again, "nothing past the next turn, nothing not stored"
    stats, df, postings = await store.recall_postings("room-1", ["line", "alic", "3", "absent"])
    assert stats == again and stats.length == sum(doc(i).length for i in range(5))
    assert df == {"line": 5, "alic": 5, "3": 1}
    assert sorted(key for key, _, _ in postings["line"]) == [0, 1, 2, 3, 4]
    assert [key for key, _, _ in postings["3"]] == [3]
    assert "absent" not in postings


@pytest.mark.asyncio
async def test_a_note_saved_with_its_doc_is_indexed_in_the_same_write_where_the_store_can(
    store: Store,
) -> None:
    await a_session_with_turns(store, "room-1", 2)
    await store.index_turns("room-1", 0, [doc(0), doc(1)])

    plain = await store.save_notes("room-1", [note(1)], [])  # no doc: not indexed
    first = await store.save_notes("room-1", [note(1), note(2)], [], indexed(note_passage(note(2))))
    if isinstance(store, RedisStore):  # it indexes in scripts of its own, as the manager then does
        assert first is None
        first = await store.index_note("room-1", indexed(note_passage(note(2))))
    second = await store.index_note("room-1", indexed(note_passage(note(3))))  # the next key
    with pytest.raises(SessionNotStored):
        await store.save_notes("ghost", [note(4)], [], indexed(note_passage(note(4))))

    stats, _, postings = await store.recall_postings("room-1", ["screen"])
    passages = await store.recall_passages("room-1", [-1, -2, -3])
    record = await store.load("room-1")
    assert plain is None
    assert first is not None and (first.notes, first.docs) == (1, 3)
    assert stats == second and (second.notes, second.docs, second.turns) == (2, 4, 2)
    assert sorted(key for key, _, _ in postings["screen"]) == [-2, -1]
    assert "screen 2" in passages[-1].text and "screen 3" in passages[-2].text and -3 not in passages
    assert record is not None and record.live_notes == (note(1), note(2))


@pytest.mark.asyncio
async def test_on_sqlite_a_note_and_its_postings_are_one_commit_all_or_nothing(tmp_path: Path) -> None:
    failing = [False]

    def commit(writes: Sequence[Sequence[object]]) -> None:
        if failing[0]:
            raise sqlite3.OperationalError("disk I/O error")

    store = SQLiteStore(tmp_path / "vc.db", before_commit=commit)
    await a_session_with_turns(store, "room-1", 1)
    groups, index_writes = store.group.groups, store.derived.groups
    stats = await store.save_notes("room-1", [note(1)], [], indexed(note_passage(note(1))))
    failing[0] = True
    with pytest.raises(StoreError):
        await store.save_notes("room-1", [note(1), note(2)], [], indexed(note_passage(note(2))))
    failing[0] = False
    after, _, postings = await store.recall_postings("room-1", ["screen", "2"])
    record = await store.load("room-1")
    await store.aclose()

    assert stats is not None and stats.notes == 1
    assert (store.group.groups, store.derived.groups) == (groups + 2, index_writes), (
        "no index write of its own"
    )
    assert after == stats and "2" not in postings, "the failed commit indexed nothing"
    assert record is not None and record.live_notes == (note(1),)


@pytest.mark.asyncio
async def test_notes_join_the_index_under_negative_keys_and_come_back_as_passages(store: Store) -> None:
    await a_session_with_turns(store, "room-1", 2)
    await store.index_turns("room-1", 0, [doc(0), doc(1)])

    first = await store.index_note("room-1", indexed(note_passage(note(7))))
    second = await store.index_note("room-1", indexed(note_passage(note(8))))
    _, _, postings = await store.recall_postings("room-1", ["screen"])
    passages = await store.recall_passages("room-1", [1, -1, -2, -3, 40])

    assert (first.notes, second.notes, second.docs) == (1, 2, 4)
    assert sorted(key for key, _, _ in postings["screen"]) == [-2, -1]
    assert passages[1] == turn_passage(1, turn(1))
    assert passages[-1].kind == "note" and "screen 7" in passages[-1].text and passages[-1].at == T0 + 7
    assert passages[-2].text.endswith("screen 8") or "screen 8" in passages[-2].text
    assert -3 not in passages and 40 not in passages


@pytest.mark.asyncio
async def test_only_the_postings_of_the_words_chosen_by_their_counts_are_read(store: Store) -> None:
    await a_session_with_turns(store, "room-1", 4)
    await store.index_turns("room-1", 0, [doc(i) for i in range(4)])

    def rarest(words: Sequence[str], df: Callable[[str], int], docs: int) -> list[str]:
        return [min(words, key=df)]

    stats, df, postings = await store.recall_postings("room-1", ["line", "2"], rarest)

    assert stats.docs == 4 and df == {"line": 4, "2": 1}
    assert list(postings) == ["2"], "the common word's postings were never read"


RECALL_WORDS = "locker code gym map raid healer coffee lisbon porto train ticket window seat".split()


@pytest.mark.asyncio
async def test_a_search_reads_in_one_go_what_the_postings_and_the_passages_read_in_two(store: Store) -> None:
    rng = random.Random(34)
    texts = [" ".join(rng.choices(RECALL_WORDS, k=rng.randint(1, 8))) for _ in range(40)]
    await a_session_with_turns(store, "room-1", 40)
    await store.index_turns("room-1", 0, [doc(i, text) for i, text in enumerate(texts)])
    for i in range(3):
        await store.index_note("room-1", indexed(note_passage(Note(f"{RECALL_WORDS[i]} on screen", T0 + i))))
    vocabulary = [*sorted({term for text in texts for term in index_terms(text)}), "absent"]

    def rarest(words: Sequence[str], df: Callable[[str], int], stats: RecallStats) -> list[str]:
        return sorted(words, key=lambda t: (df(t), t))[:2]

    def at_most(common: float) -> ChooseTerms:
        return lambda words, df, stats: choose_terms(words, df, stats.docs, common=common)

    def every(step: int) -> PickPassages[tuple[int, list[str]]]:
        """Every ``step``-th doc a word read holds, and the turn after each (some not stored)."""

        def pick(
            stats: RecallStats, df: dict[str, int], postings: dict[str, list[Posting]]
        ) -> tuple[tuple[int, list[str]], list[int]]:
            keys = sorted({key for held in postings.values() for key, _, _ in held})[::step]
            return (stats.docs, sorted(df)), [*keys, *(key + 1 for key in keys if key >= 0), 99, -9]

        return pick

    shown = 0
    for _ in range(200):
        terms = rng.sample(vocabulary, rng.randint(0, 6))
        choose = rng.choice([rarest, at_most(rng.choice([0.05, 0.3, 1.0]))])
        pick = every(rng.randint(1, 3))

        found = await store.recall_search("room-1", terms, choose, pick)

        assert found == await read_twice(store, "room-1", terms, choose, pick)
        shown += bool(found.passages)
    assert shown > 100  # most searches read passages (135 of the 200)


@pytest.mark.asyncio
async def test_vectors_are_kept_by_doc_key(store: Store) -> None:
    await a_session_with_turns(store, "room-1", 2)

    await store.save_vectors("room-1", {0: b"\x00\x01", -1: bytes(range(256))})
    await store.save_vectors("room-1", {0: b"\x02"})

    assert await store.load_vectors("room-1") == {0: b"\x02", -1: bytes(range(256))}


@pytest.mark.asyncio
async def test_a_deleted_session_takes_its_recall_index_with_it(store: Store) -> None:
    await a_session_with_turns(store, "room-1", 2)
    await store.index_turns("room-1", 0, [doc(0), doc(1)])
    await store.index_note("room-1", indexed(note_passage(note(1))))
    await store.save_vectors("room-1", {0: b"v"})

    await store.delete("room-1")
    await store.create(SessionRecord("room-1"))

    stats, df, postings = await store.recall_postings("room-1", ["line", "screen"])
    assert (stats.docs, stats.turns, stats.notes, df, postings) == (0, 0, 0, {}, {})
    assert await store.load_vectors("room-1") == {}


@pytest.mark.asyncio
async def test_the_recall_index_of_a_session_never_stored_is_an_unknown_session(store: Store) -> None:
    with pytest.raises(SessionNotStored):
        await store.index_turns("nobody", 0, [doc(0)])
    with pytest.raises(SessionNotStored):
        await store.recall_postings("nobody", ["line"])
    with pytest.raises(SessionNotStored):
        await store.recall_search("nobody", ["line"], lambda *read: ["line"], lambda *read: (None, [0]))


# -- durable stores only ------------------------------------------------------------


@pytest.mark.asyncio
async def test_everything_survives_opening_the_store_again(durable: Backend) -> None:
    first = durable.open()
    await a_session_with_turns(first, "room-1", 6, config={"recent_window": 2}, owner="bot-a")
    await first.save_notes("room-1", [note(3)], [note(1)])
    assert await first.commit_compaction(
        "room-1", FoldCommit(expected_cursor=0, new_cursor=2, summary="two turns in", pending_notes=())
    )
    await first.aclose()

    again = durable.open()
    record = await again.load("room-1")

    assert record is not None
    assert (record.cursor, record.summary, record.total_turns) == (2, "two turns in", 6)
    assert record.turns == tuple(turn(i) for i in range(2, 6))
    assert (record.live_notes, record.pending_notes) == ((note(3),), ())
    assert (record.config, record.owner, record.compactions) == ({"recent_window": 2}, "bot-a", 1)


@pytest.mark.asyncio
async def test_the_identical_turn_sent_again_is_a_retry_not_a_duplicate(durable: Backend) -> None:
    store = durable.open()
    await a_session_with_turns(store, "room-1", 3)

    await store.append_turn("room-1", 1, turn(1))  # its first answer was lost; the bot tried again

    assert await store.read_turns("room-1", 0, 10) == [turn(0), turn(1), turn(2)]
    with pytest.raises(TurnConflict) as conflict:
        await store.append_turn("room-1", 1, Turn("Alice", "user", "line 1 from Alice", T0 + 1, id="other"))
    assert not conflict.value.retryable
    assert isinstance(conflict.value, StoreError)


@pytest.mark.asyncio
async def test_a_commit_retried_after_it_landed_reports_success_once(durable: Backend) -> None:
    store = durable.open()
    await a_session_with_turns(store, "room-1", 6)
    token = await store.acquire_lease("room-1", "replica-a", 30)
    fold = FoldCommit(expected_cursor=0, new_cursor=3, summary="three", pending_notes=(note(1),), fence=token)

    assert await store.commit_compaction("room-1", fold)
    assert await store.commit_compaction("room-1", fold)

    record = await store.load("room-1")
    assert record is not None
    assert (record.cursor, record.summary, record.compactions) == (3, "three", 1)
    assert not await store.commit_compaction(
        "room-1",
        FoldCommit(expected_cursor=0, new_cursor=3, summary="different words", pending_notes=[note(1)]),
    )


@pytest.mark.asyncio
async def test_a_commit_past_the_stored_turns_is_refused(durable: Backend) -> None:
    store = durable.open()
    await a_session_with_turns(store, "room-1", 3)

    assert not await store.commit_compaction(
        "room-1", FoldCommit(expected_cursor=0, new_cursor=5, summary="turns it never saw", pending_notes=())
    )
    with pytest.raises(ValueError):
        await store.commit_compaction(
            "room-1", FoldCommit(expected_cursor=2, new_cursor=1, summary="", pending_notes=())
        )


# -- group commit ------------------------------------------------------------------------


def group_of(store: Store) -> GroupCommit[Any]:
    group = getattr(store, "group", None)
    assert isinstance(group, GroupCommit)
    return group


@pytest.mark.asyncio
async def test_appends_that_arrive_together_share_one_write_and_each_is_stored(durable: Backend) -> None:
    store = durable.open()
    names = [f"room-{k}" for k in range(40)]
    for name in names:
        await store.create(SessionRecord(name))
    group = group_of(store)
    before = group.groups

    async with anyio.create_task_group() as tg:
        for k, name in enumerate(names):
            tg.start_soon(store.append_turn, name, 0, turn(k))
            tg.start_soon(store.save_notes, name, [note(k)], [])

    assert group.groups - before <= 3, "80 writes from 40 sessions: the first alone, the rest together"
    assert group.largest >= 40
    for k, name in enumerate(names):
        record = await store.load(name)
        assert record is not None
        assert (record.turns, record.live_notes) == ((turn(k),), (note(k),))


@pytest.mark.asyncio
async def test_a_bad_turn_in_a_group_fails_alone(durable: Backend) -> None:
    store = durable.open()
    await a_session_with_turns(store, "room-1", 2)
    await store.create(SessionRecord("room-2"))
    outcomes: dict[str, BaseException | None] = {}

    async def attempt(label: str, name: str, index: int, t: Turn) -> None:
        try:
            await store.append_turn(name, index, t)
            outcomes[label] = None
        except StoreError as exc:
            outcomes[label] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(attempt, "first", "room-2", 0, turn(0))  # written alone, while the rest queue
        tg.start_soon(attempt, "gap", "room-1", 5, turn(5))
        tg.start_soon(attempt, "good", "room-1", 2, turn(2))
        tg.start_soon(attempt, "taken", "room-1", 0, turn(9, "Mallory"))
        tg.start_soon(attempt, "ghost", "ghost", 0, turn(0))
        tg.start_soon(attempt, "next", "room-2", 1, turn(1))

    assert isinstance(outcomes["gap"], TurnConflict)
    assert isinstance(outcomes["taken"], TurnConflict)
    assert isinstance(outcomes["ghost"], SessionNotStored)
    assert (outcomes["first"], outcomes["good"], outcomes["next"]) == (None, None, None)
    assert await store.read_turns("room-1", 0, 10) == [turn(0), turn(1), turn(2)]
    assert await store.read_turns("room-2", 0, 10) == [turn(0), turn(1)]


@pytest.mark.asyncio
async def test_turns_of_one_session_in_one_group_keep_their_order(durable: Backend) -> None:
    store = durable.open()
    await store.create(SessionRecord("room-1"))

    async with anyio.create_task_group() as tg:
        for i in range(12):
            tg.start_soon(store.append_turn, "room-1", i, turn(i))

    assert await store.read_turns("room-1", 0, 20) == [turn(i) for i in range(12)]


# -- SQLite specifics ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_sqlite_groups_the_recall_index_writes_of_many_sessions_and_a_stray_one_fails_alone(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "vc.db")
    names = [f"room-{k}" for k in range(30)]
    for k, name in enumerate(names):
        await store.create(SessionRecord(name))
        await store.append_turn(name, 0, turn(k))
    outcomes: dict[str, object] = {}

    async def index(name: str, k: int) -> None:
        try:
            outcomes[name] = await store.index_turns(name, 0, [indexed(turn_passage(0, turn(k)))])
        except StoreError as exc:
            outcomes[name] = exc

    before = store.derived.groups
    async with anyio.create_task_group() as tg:
        for k, name in enumerate([*names, "ghost"]):
            tg.start_soon(index, name, k)

    assert store.derived.groups - before <= 3, "31 index writes: the first alone, the rest together"
    assert isinstance(outcomes.pop("ghost"), SessionNotStored)
    assert all(getattr(stats, "turns", None) == 1 for stats in outcomes.values())
    _, _, postings = await store.recall_postings("room-7", index_terms(turn(7).text))
    assert {key for found in postings.values() for key, _, _ in found} == {0}
    await store.aclose()


@pytest.mark.asyncio
async def test_a_sqlite_group_of_hundreds_of_writes_is_a_few_statements_and_keeps_every_time_exact(
    tmp_path: Path,
) -> None:
    """CPython's ``sqlite3`` lets go of the interpreter's lock for every row a statement runs
    over, then waits to take it back, holding the file's write lock meanwhile (another
    process's writer waits on it). A group is a few statements whatever its size; its times
    are bound as parameters, never parsed from JSON, which rounds them."""
    release = threading.Event()
    held: list[int] = []

    def commit(writes: Sequence[Sequence[object]]) -> None:
        if not held:  # the first group holds the writer while the others queue behind it
            held.append(len(writes))
            release.wait(30)

    store = SQLiteStore(tmp_path / "vc.db", before_commit=commit)
    names = [f"room-{k}" for k in range(150)]
    for name in names:
        await store.create(SessionRecord(name))
    rng = random.Random(29)
    times = [0.1 + 0.2, *(rng.uniform(0, 2e9) for _ in names[1:])]
    turns = [Turn("Alice", "user", f"line {k}", at) for k, at in enumerate(times)]
    statements: list[str] = []
    assert store.db.writer is not None
    store.db.writer.set_trace_callback(statements.append)
    noted: dict[int, RecallStats | None] = {}

    async def save_note(k: int) -> None:
        noted[k] = await store.save_notes("room-7", [note(k)], [], indexed(note_passage(note(k))))

    async with anyio.create_task_group() as tg:
        tg.start_soon(store.append_turn, names[0], 0, turns[0])
        await anyio.wait_all_tasks_blocked()
        for name, made in zip(names[1:], turns[1:], strict=True):
            tg.start_soon(store.append_turn, name, 0, made)
        for k in (1, 2):
            tg.start_soon(save_note, k)
        await anyio.wait_all_tasks_blocked()
        release.set()
    read = [await store.read_turns(name, 0, 1) for name in names]
    _, _, postings = await store.recall_postings("room-7", ["screen"])
    record = await store.load("room-7")
    await store.aclose()

    assert (held, store.group.largest) == ([1], 151), "149 turns and two notes in one group"
    second = [i for i, sql in enumerate(statements) if sql == "BEGIN IMMEDIATE"][1]
    group = statements[second : statements.index("COMMIT", second) + 1]
    assert len(group) <= 20, group
    assert [found[0].at for found in read] == times and read[0] == [turns[0]]
    assert noted[1] is not None and noted[2] is not None
    assert (noted[1].notes, noted[2].notes) == (1, 2), "the notes of one session take their keys in turn"
    assert sorted(key for key, _, _ in postings["screen"]) == [-2, -1]
    assert record is not None and record.live_notes == (note(2),)


@pytest.mark.asyncio
async def test_a_sqlite_group_of_many_sessions_index_writes_is_a_few_statements(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "vc.db")
    names = [f"room-{k}" for k in range(100)]
    for name in names:
        await a_session_with_turns(store, name, 3)
    statements: list[str] = []
    assert store.db.writer is not None
    store.db.writer.set_trace_callback(statements.append)

    async with anyio.create_task_group() as tg:
        for name in names:
            tg.start_soon(store.index_turns, name, 0, [doc(i) for i in range(3)])
    stats, df, postings = await store.recall_postings("room-42", ["line", "2"])
    await store.aclose()

    groups = statements.count("BEGIN IMMEDIATE")
    assert groups <= 3 and len(statements) <= 16 * groups, statements
    assert (stats.docs, stats.turns, df) == (3, 3, {"line": 3, "2": 1})
    assert sorted(key for key, _, _ in postings["line"]) == [0, 1, 2]


@pytest.mark.asyncio
async def test_a_python_built_with_a_sqlite_older_than_3_33_is_told_so_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 31, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.31.1")
    store = SQLiteStore(tmp_path / "vc.db")

    with pytest.raises(StoreError, match=r"SQLite is 3\.31\.1; it needs 3\.33\.0 or newer") as caught:
        await store.create(SessionRecord("room-1"))
    await store.aclose()

    assert not caught.value.retryable
    assert not (tmp_path / "vc.db").exists()


def test_two_workers_opening_a_new_file_at_once_both_open_it(tmp_path: Path) -> None:
    """``serve --workers 2`` on a new file: both workers' first requests open it at once. The one
    that loses the race to switch the file to WAL is told "database is locked" at once (SQLite's
    busy handler is not asked); the store waits for the file as it does for a write. Each pair
    here is two connections in two threads, as two processes would race (without the wait, some
    ten pairs in 300 failed)."""
    from voice_context.store.sqlite_db import Connections

    failures: list[str] = []

    def open_and_read(db: Connections, start: threading.Barrier) -> None:
        start.wait()
        try:
            db.call("load", lambda conn: conn.execute("SELECT count(*) FROM sessions").fetchone())
        except StoreError as exc:
            failures.append(str(exc))
        finally:
            if db.writer is not None:
                db.writer.close()

    for pair in range(300):
        path = tmp_path / f"new-{pair}.db"
        start = threading.Barrier(2)
        workers = [
            threading.Thread(target=open_and_read, args=(Connections(path, 5.0), start)) for _ in range(2)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    assert failures == []


@pytest.mark.asyncio
async def test_the_sqlite_file_is_in_wal_mode_with_a_schema_version(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "vc.db")
    await store.create(SessionRecord("room-1"))
    await store.aclose()

    with raw_file(tmp_path / "vc.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        columns = {row[1] for row in conn.execute("PRAGMA table_info(turns)")}
    assert columns == {"session", "idx", "speaker", "role", "text", "at", "id", "tool"}


@pytest.mark.asyncio
async def test_a_file_from_before_the_recall_index_gains_it_and_keeps_its_sessions(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "vc.db")
    await a_session_with_turns(store, "room-1", 3)
    await store.aclose()
    with raw_file(tmp_path / "vc.db") as conn:  # what version 3 wrote
        for table in ("recall_terms", "recall_df", "recall_notes", "recall_vectors", "recall_state"):
            conn.execute(f"DROP TABLE {table}")
        conn.execute("UPDATE schema_version SET version = 3")

    upgraded = SQLiteStore(tmp_path / "vc.db")
    record = await upgraded.load("room-1")
    stats = await upgraded.index_turns("room-1", 0, [doc(i) for i in range(3)])
    await upgraded.aclose()

    assert record is not None and record.total_turns == 3
    assert stats.turns == 3


@pytest.mark.asyncio
async def test_a_file_from_a_newer_version_is_refused_not_rewritten(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "vc.db")
    await store.create(SessionRecord("room-1"))
    await store.aclose()
    with raw_file(tmp_path / "vc.db") as conn:
        conn.execute("UPDATE schema_version SET version = 99")

    newer = SQLiteStore(tmp_path / "vc.db")
    with pytest.raises(StoreError, match="schema version 99") as refused:
        await newer.load("room-1")
    assert not refused.value.retryable
    await newer.aclose()


@pytest.mark.asyncio
async def test_two_sqlite_stores_on_one_file_share_the_lease(tmp_path: Path) -> None:
    one, two = SQLiteStore(tmp_path / "vc.db"), SQLiteStore(tmp_path / "vc.db")
    await one.create(SessionRecord("room-1"))

    first = await one.acquire_lease("room-1", "replica-a", 30)
    assert first is not None
    assert await two.acquire_lease("room-1", "replica-b", 30) is None
    await one.release_lease("room-1", "replica-a")
    second = await two.acquire_lease("room-1", "replica-b", 30)
    assert second is not None and second > first
    await one.aclose()
    await two.aclose()


@pytest.mark.asyncio
async def test_a_closed_store_says_so(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "vc.db")
    await store.create(SessionRecord("room-1"))
    await store.aclose()

    with pytest.raises(StoreError, match="closed"):
        await store.load("room-1")
    assert "closed" in repr(store)


# -- Redis specifics ---------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["redis_server", "redis_cluster"])
async def test_every_key_of_a_session_carries_the_same_hash_tag(
    where: str, request: pytest.FixtureRequest
) -> None:
    store = RedisStore(request.getfixturevalue(where).url, prefix="tags")
    names = ["room-1", "a{b}c", "}{", "x:y", "50%", "Zoë", ""]
    for name in names:
        await a_session_with_turns(store, name, 2)
        await store.save_notes(name, [note(1)], [note(0)])
        assert await store.acquire_lease(name, "replica-a", 30) is not None

    keys = [key async for key in store.client.scan_iter(match="tags:*")]

    assert len(keys) == 4 * len(names), "meta, turns, notes and lease for every session"
    by_tag: dict[str, set[str]] = {}
    for key in keys:
        assert key.count("{") == 1 and key.count("}") == 1, key
        tag = key[key.index("{") + 1 : key.index("}")]
        assert tag, f"{key!r} has an empty hash tag, which Redis Cluster ignores"
        by_tag.setdefault(tag, set()).add(key.rsplit(":", 1)[1])
    assert len(by_tag) == len(names)
    assert all(kinds == {"meta", "turns", "notes", "lease"} for kinds in by_tag.values())
    for name in names:
        assert len({key_slot(k.encode()) for k in store.keys(name).all}) == 1
        record = await store.load(name)
        assert record is not None and record.total_turns == 2, name
    await store.aclose()


@pytest.mark.asyncio
async def test_two_prefixes_on_one_redis_do_not_see_each_other(redis_server: RedisServer) -> None:
    blue, green = RedisStore(redis_server.url, prefix="blue"), RedisStore(redis_server.url, prefix="green")
    await a_session_with_turns(blue, "room-1", 2)

    assert await green.load("room-1") is None
    await blue.aclose()
    await green.aclose()


def test_a_prefix_cannot_break_the_hash_tag() -> None:
    with pytest.raises(ValueError):
        RedisStore("redis://127.0.0.1:1/0", prefix="a{b")


# -- open_store --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_open_store_reads_every_kind_of_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    made: list[Store] = []

    made.append(open_store("memory"))
    assert isinstance(made[-1], MemoryStore)

    made.append(open_store("sqlite", data_dir=str(tmp_path / "fresh" / "dir")))
    assert isinstance(made[-1], SQLiteStore)
    assert made[-1].path == tmp_path / "fresh" / "dir" / "voice-context.db"
    assert (tmp_path / "fresh" / "dir").is_dir(), "the data directory is created"

    made.append(open_store(f"sqlite://{tmp_path}/abs.db"))
    assert isinstance(made[-1], SQLiteStore) and made[-1].path == tmp_path / "abs.db"

    made.append(open_store("sqlite://rel/here.db"))
    assert isinstance(made[-1], SQLiteStore) and made[-1].path == Path("rel/here.db")
    await made[-1].create(SessionRecord("room-1"))
    assert (tmp_path / "rel" / "here.db").exists()

    made.append(open_store("redis://127.0.0.1:6390/2"))
    assert isinstance(made[-1], RedisStore)
    assert "127.0.0.1:6390/2" in repr(made[-1]) and not made[-1].cluster

    made.append(open_store("redis+cluster://127.0.0.1:7000"))
    assert isinstance(made[-1], RedisStore)
    assert made[-1].cluster and "cluster 127.0.0.1:7000" in repr(made[-1])

    with pytest.raises(ConfigError):
        open_store("postgres://db/vc")
    (tmp_path / "a-file").write_text("not a directory")
    with pytest.raises(ConfigError):
        open_store("sqlite", data_dir=str(tmp_path / "a-file" / "data"))
    for store in made:
        await store.aclose()


def test_the_service_keeps_sessions_on_disk_by_default() -> None:
    from voice_context.config import StoreSettings

    assert StoreSettings().url == "sqlite"


# -- any sequence of operations, against a model of the contract ----------------------------------------


class Model:
    """What a durable store must answer, in a few lines of plain Python."""

    def __init__(self) -> None:
        self.turns: list[Turn] = []
        self.cursor, self.summary, self.compactions = 0, "", 0
        self.live: tuple[Note, ...] = ()
        self.pending: tuple[Note, ...] = ()
        self.fence, self.holder = 0, ""

    def append(self, index: int, t: Turn) -> str:
        if index == len(self.turns):
            self.turns.append(t)
            return "ok"
        if 0 <= index < len(self.turns) and self.turns[index] == t:
            return "ok"
        return "conflict"

    def commit(
        self, expected: int, new: int, summary: str, pending: tuple[Note, ...], fence: int | None
    ) -> bool:
        if fence is not None and fence != self.fence:
            return False
        if self.cursor != expected:
            return (self.cursor, self.summary, self.pending) == (new, summary, pending)
        if new > len(self.turns):
            return False
        self.cursor, self.summary, self.pending = new, summary, pending
        self.compactions += 1
        return True

    def acquire(self, holder: str) -> int | None:
        if self.holder not in ("", holder):
            return None
        self.holder, self.fence = holder, self.fence + 1
        return self.fence

    def release(self, holder: str) -> None:
        if self.holder == holder:
            self.holder = ""


OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.sampled_from([0, 0, 0, 1, -1, -2]), st.booleans()),
        st.tuples(
            st.just("commit"), st.integers(-1, 0), st.integers(0, 3), st.sampled_from(["none", "now", "old"])
        ),
        st.tuples(st.just("retry")),
        st.tuples(st.just("lease"), st.sampled_from(["a", "b"])),
        st.tuples(st.just("release"), st.sampled_from(["a", "b"])),
        st.tuples(st.just("notes"), st.integers(0, 2), st.integers(0, 2)),
    ),
    max_size=30,
)


async def replay(store: Store, operations: list[tuple[Any, ...]]) -> None:
    model = Model()
    await store.create(SessionRecord("room-1"))
    for step, op in enumerate(operations):
        kind = op[0]
        if kind == "append":
            index = len(model.turns) + op[1]
            same = op[2] and 0 <= index < len(model.turns)
            t = model.turns[index] if same else turn(step, ("Alice", "Bob")[step % 2])
            try:
                await store.append_turn("room-1", index, t)
                got = "ok"
            except TurnConflict:
                got = "conflict"
            assert got == model.append(index, t), (step, op)
        elif kind in ("commit", "retry"):
            if kind == "commit":
                expected = max(0, model.cursor + op[1])
                new, summary, pending = expected + op[2], f"summary {step}", model.pending[1:]
                fence = {"none": None, "now": model.fence, "old": model.fence - 1}[op[3]]
            else:  # the last commit, sent again
                expected, new, summary, pending, fence = 0, model.cursor, model.summary, model.pending, None
            fold = FoldCommit(
                expected_cursor=expected, new_cursor=new, summary=summary, pending_notes=pending, fence=fence
            )
            got_commit = await store.commit_compaction("room-1", fold)
            assert got_commit == model.commit(expected, new, summary, pending, fence), (step, op)
            if got_commit and kind == "commit":  # its answer was lost, so it is sent again
                again = await store.commit_compaction("room-1", fold)
                assert again == model.commit(expected, new, summary, pending, fence), (step, op)
        elif kind == "lease":
            assert await store.acquire_lease("room-1", op[1], 60) == model.acquire(op[1]), (step, op)
        elif kind == "release":
            await store.release_lease("room-1", op[1])
            model.release(op[1])
        else:
            model.live = tuple(note(step * 10 + i) for i in range(op[1]))
            model.pending = tuple(note(step * 10 + 5 + i) for i in range(op[2]))
            await store.save_notes("room-1", model.live, model.pending)
    record = await store.load("room-1")
    assert record is not None
    assert (record.cursor, record.summary, record.total_turns) == (
        model.cursor,
        model.summary,
        len(model.turns),
    )
    assert record.turns == tuple(model.turns[model.cursor :])
    assert (record.live_notes, record.pending_notes) == (model.live, model.pending)
    assert record.compactions == model.compactions
    assert await store.read_turns("room-1", 0, len(model.turns) + 5) == model.turns


@pytest.mark.parametrize("kind", DURABLE)
def test_any_sequence_of_operations_agrees_with_the_model(kind: str, request: pytest.FixtureRequest) -> None:
    fixture = {"redis": "redis_server", "redis-cluster": "redis_cluster"}.get(kind)
    url = request.getfixturevalue(fixture).url if fixture else ""

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(operations=OPERATIONS)
    def run(operations: list[tuple[Any, ...]]) -> None:
        async def main() -> None:
            with tempfile.TemporaryDirectory() as tmp:
                store: Store = (
                    SQLiteStore(Path(tmp) / "vc.db")
                    if kind == "sqlite"
                    else RedisStore(url, prefix=f"m{uuid.uuid4().hex[:8]}")
                )
                try:
                    await replay(store, operations)
                finally:
                    await store.aclose()

        anyio.run(main)

    run()


# -- landmarks ---------------------------------------------------------------------


def landmark(i: int, kind: str = "decision", source: str = "heuristic") -> Landmark:
    return Landmark(i, turn(i), kind, f"reason {i}", source, 1000.0 + i)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_landmarks_are_kept_replaced_and_unpinned(store: Store) -> None:
    await a_session_with_turns(store, "room-1", 5)
    assert await store.load_landmarks("room-1") == ()
    await store.save_landmark("room-1", landmark(3))
    await store.save_landmark("room-1", landmark(1, "spec", "manual"))
    await store.save_landmark("room-1", landmark(3, "code", "llm"))  # replaces the first
    assert await store.load_landmarks("room-1") == (landmark(1, "spec", "manual"), landmark(3, "code", "llm"))
    assert await store.delete_landmark("room-1", 1) is True
    assert await store.delete_landmark("room-1", 1) is False
    assert await store.load_landmarks("room-1") == (landmark(3, "code", "llm"),)
    assert await store.load_landmarks("never-seen") == ()
    with pytest.raises(SessionNotStored):
        await store.save_landmark("never-seen", landmark(0))
    await store.delete("room-1")
    await store.create(SessionRecord("room-1"))
    assert await store.load_landmarks("room-1") == (), "a deleted session's landmarks go with it"


@pytest.mark.asyncio
async def test_landmarks_survive_opening_the_store_again(durable: Backend) -> None:
    first = durable.open()
    await a_session_with_turns(first, "room-1", 3)
    await first.save_landmark("room-1", landmark(2))
    await first.aclose()
    again = durable.open()
    assert await again.load_landmarks("room-1") == (landmark(2),)


@pytest.mark.asyncio
async def test_a_version_1_file_gets_its_landmarks_and_tool_columns_and_keeps_its_sessions(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "vc.db")
    await a_session_with_turns(store, "room-1", 2)
    await store.aclose()
    with raw_file(tmp_path / "vc.db") as conn:  # the file as version 1 wrote it
        conn.execute("DROP TABLE landmarks")
        conn.execute("ALTER TABLE turns DROP COLUMN tool")
        conn.execute("UPDATE schema_version SET version = 1")

    upgraded = SQLiteStore(tmp_path / "vc.db")
    record = await upgraded.load("room-1")
    assert record is not None and record.total_turns == 2
    await upgraded.save_landmark("room-1", landmark(1))
    assert await upgraded.load_landmarks("room-1") == (landmark(1),)
    assert await upgraded.save_tier("room-1", TierSummary("session", T0, T0 + 1, 0, 2, "both lines", T0))
    assert [s.text for s in await upgraded.load_tiers("room-1")] == ["both lines"]
    await upgraded.aclose()
    with raw_file(tmp_path / "vc.db") as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


@pytest.mark.asyncio
async def test_tool_calls_and_results_come_back_with_their_ids_names_and_arguments(store: Store) -> None:
    await store.create(SessionRecord("room-1"))
    call = Turn("Nova", "assistant", "", 5.0, "t1", "call_1", "find_flight", '{"to": "LIS"}')
    result = Turn("find_flight", "tool", '{"flight": "TP 1234"}', 6.0, None, "call_1", "find_flight")
    for i, t in enumerate((turn(0), call, result)):
        await store.append_turn("room-1", i, t)
    await store.append_turn("room-1", 1, call)  # a retry of the same tool turn is no conflict
    assert await store.read_turns("room-1", 0, 3) == [turn(0), call, result]
    record = await store.load("room-1")
    assert record is not None and record.turns[1:] == (call, result)


# -- the tier cascade --------------------------------------------------------------


def rolled(tier: str, start: float, first: int, end: int, text: str = "") -> TierSummary:
    return TierSummary(tier, start, start + 3600, first, end, text or f"{tier} {first}..{end}", T0)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_one_summary_is_kept_per_tier_and_period_and_an_older_roll_never_lands_over_a_newer(
    store: Store,
) -> None:
    await a_session_with_turns(store, "room-1", 30)
    assert await store.load_tiers("room-1") == ()

    assert await store.save_tier("room-1", rolled("session", T0, 0, 10, "the first roll"))
    assert not await store.save_tier("room-1", rolled("session", T0, 0, 10, "the same roll, again"))
    assert await store.save_tier("room-1", rolled("session", T0, 0, 12, "after late turns"))
    assert not await store.save_tier("room-1", rolled("session", T0, 0, 11, "an older roll, late"))
    assert await store.save_tier("room-1", rolled("day", T0 - 100, 0, 12))
    assert await store.save_tier("room-1", rolled("session", T0 + 7200, 12, 30))

    kept = await store.load_tiers("room-1")
    assert [(s.tier, s.first_turn, s.end_turn, s.text) for s in kept] == [
        ("day", 0, 12, "day 0..12"),
        ("session", 0, 12, "after late turns"),
        ("session", 12, 30, "session 12..30"),
    ]
    assert await store.load_tiers("never-seen") == ()
    with pytest.raises(SessionNotStored):
        await store.save_tier("never-seen", rolled("session", T0, 0, 1))
    await store.delete("room-1")
    await store.create(SessionRecord("room-1"))
    assert await store.load_tiers("room-1") == (), "a deleted session's summaries go with it"


@pytest.mark.asyncio
async def test_two_replicas_racing_for_one_roll_keep_exactly_one(durable: Backend) -> None:
    first, second = durable.open(), durable.open()
    await a_session_with_turns(first, "room-1", 10)
    results: list[bool] = []

    async def save(store: Store, text: str) -> None:
        results.append(await store.save_tier("room-1", rolled("day", T0, 0, 10, text)))

    async with anyio.create_task_group() as tg:
        for k in range(6):
            tg.start_soon(save, first if k % 2 else second, f"replica {k % 2}")
    assert sorted(results) == [False] * 5 + [True]
    [kept] = await second.load_tiers("room-1")
    assert kept.text in ("replica 0", "replica 1")
    assert await first.load_tiers("room-1") == (kept,)
