"""Group commit on its own: who writes, who waits, and what a cancellation or a failure does.

``write_many`` here records its groups and holds each one until the test lets
it finish, as a store's commit would take its time; the stores' own group
commit is told in ``test_store_contract.py`` and ``test_restart.py``.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from helpers import TIMEOUT
from structlog.testing import capture_logs

from voice_context.core.turns import Turn
from voice_context.errors import StoreError
from voice_context.store import sqlite_groups, sqlite_rows
from voice_context.store.base import SessionRecord
from voice_context.store.group import GroupCommit, Pending
from voice_context.store.sqlite import SQLiteStore

#: A deadline short enough for a test to outlast.
DEADLINE = 0.05


class Disk:
    """Writes groups of strings; each group waits for ``release`` before it is durable."""

    def __init__(self, *, hold: bool = True) -> None:
        self.hold = hold
        self.groups: list[list[str]] = []
        self.durable: list[str] = []
        self.release = anyio.Event()
        self.fail_with: Exception | None = None
        self.reject: set[str] = set()

    async def write_many(self, batch: list[Pending[str]]) -> None:
        self.groups.append([item.op for item in batch])
        if self.hold:
            await self.release.wait()
            self.release = anyio.Event()
        else:
            await anyio.lowlevel.checkpoint()
        if self.fail_with is not None:
            raise self.fail_with
        for item in batch:
            if item.op in self.reject:
                item.error = StoreError(f"{item.op} is refused", retryable=False)
            else:
                self.durable.append(item.op)


async def settle() -> None:
    for _ in range(10):
        await anyio.lowlevel.checkpoint()


@pytest.mark.asyncio
async def test_writes_that_arrive_during_a_write_go_out_together_and_return_once_durable() -> None:
    disk = Disk()
    group = GroupCommit(disk.write_many)
    acked: list[str] = []

    async def write(op: str) -> None:
        await group.submit(op)
        acked.append(op)

    async with anyio.create_task_group() as tg:
        tg.start_soon(write, "a")
        await settle()
        for op in "bcd":
            tg.start_soon(write, op)
        await settle()
        assert disk.groups == [["a"]] and acked == [], "nothing is acknowledged before its group is durable"
        disk.release.set()
        await settle()
        assert acked == ["a"] and disk.groups == [["a"], ["b", "c", "d"]]
        disk.release.set()

    assert acked == ["a", "b", "c", "d"] == disk.durable
    assert (group.groups, group.writes, group.largest) == (2, 4, 3)


@pytest.mark.asyncio
async def test_a_group_weighed_by_its_writes_stops_at_its_weight_and_always_takes_one() -> None:
    disk = Disk()
    group = GroupCommit(disk.write_many, weight=len, max_weight=6)
    queued = ["aaaa", "bb", "c", "dddddddddd", "ee", "ff", "gg", "hh"]

    async with anyio.create_task_group() as tg:
        tg.start_soon(group.submit, "first")
        await settle()
        for op in queued:
            tg.start_soon(group.submit, op)
        await settle()
        while len(disk.durable) < 1 + len(queued):
            disk.release.set()
            await settle()

    assert disk.groups == [["first"], ["aaaa", "bb"], ["c"], ["dddddddddd"], ["ee", "ff", "gg"], ["hh"]]
    assert disk.durable == ["first", *queued]
    with pytest.raises(ValueError, match="max_weight"):
        GroupCommit(disk.write_many, weight=len)


@pytest.mark.asyncio
async def test_a_write_that_fails_fails_alone_and_a_failed_group_fails_every_write_in_it() -> None:
    disk = Disk(hold=False)
    disk.reject = {"bad"}
    group = GroupCommit(disk.write_many)
    outcomes: dict[str, str] = {}

    async def write(op: str) -> None:
        try:
            await group.submit(op)
            outcomes[op] = "ok"
        except StoreError as exc:
            outcomes[op] = str(exc)

    async with anyio.create_task_group() as tg:
        for op in ("good", "bad", "fine"):
            tg.start_soon(write, op)
    assert outcomes == {"good": "ok", "bad": "bad is refused", "fine": "ok"}

    disk.fail_with = StoreError("disk full")
    async with anyio.create_task_group() as tg:
        for op in ("x", "y"):
            tg.start_soon(write, op)
    assert (outcomes["x"], outcomes["y"]) == ("disk full", "disk full")
    assert disk.durable == ["good", "fine"]


@pytest.mark.asyncio
async def test_a_write_cancelled_while_it_waits_in_the_queue_is_never_written() -> None:
    disk = Disk()
    group = GroupCommit(disk.write_many)

    async with anyio.create_task_group() as tg:
        tg.start_soon(group.submit, "first")
        await settle()
        with anyio.move_on_after(0.01):
            await group.submit("given up")
        tg.start_soon(group.submit, "later")
        await settle()
        disk.release.set()
        await settle()
        disk.release.set()

    assert disk.groups == [["first"], ["later"]]
    assert disk.durable == ["first", "later"]


@pytest.mark.asyncio
async def test_a_writer_cancelled_mid_write_finishes_its_group_and_the_others_go_on() -> None:
    disk = Disk()
    group = GroupCommit(disk.write_many)
    acked: list[str] = []

    async def write(op: str) -> None:
        await group.submit(op)
        acked.append(op)

    writer = anyio.CancelScope()

    async def cancellable(op: str) -> None:
        with writer:
            await write(op)

    async with anyio.create_task_group() as tg:
        tg.start_soon(cancellable, "writer")
        await settle()
        tg.start_soon(write, "waiting")
        await settle()
        writer.cancel()  # the group in flight is shielded: written whole
        await settle()
        assert disk.groups == [["writer"]] and disk.durable == []
        disk.release.set()
        await settle()
        disk.release.set()

    assert disk.groups == [["writer"], ["waiting"]]
    assert disk.durable == ["writer", "waiting"]
    assert acked == ["writer", "waiting"], "a durable write is reported as one, even to a cancelled caller"


@pytest.mark.asyncio
async def test_a_lower_priority_writer_waits_until_no_write_is_queued_or_in_flight() -> None:
    disk = Disk()
    group = GroupCommit(disk.write_many)
    idle_at: list[list[str]] = []

    async def index_writer() -> None:  # what the recall index does before it takes the worker
        await group.idle()
        idle_at.append(list(disk.durable))

    await group.idle()  # nothing written, nothing queued: at once

    async with anyio.create_task_group() as tg:
        tg.start_soon(group.submit, "a")
        await settle()
        tg.start_soon(group.submit, "b")
        tg.start_soon(index_writer)
        await settle()
        assert idle_at == [], "a group is being written and another waits"
        disk.release.set()
        await settle()
        assert idle_at == [], "the queued group goes first"
        disk.release.set()
        await settle()
    assert idle_at == [["a", "b"]]


@pytest.mark.asyncio
async def test_a_group_the_disk_never_finishes_is_given_up_at_its_deadline_never_acknowledged() -> None:
    disk = Disk()  # the first group is never released: a disk that hangs
    group = GroupCommit(disk.write_many, deadline=DEADLINE)
    outcomes: dict[str, BaseException | None] = {}

    async def write(op: str) -> None:
        try:
            await group.submit(op)
            outcomes[op] = None
        except StoreError as exc:
            outcomes[op] = exc

    with capture_logs() as logs, anyio.fail_after(TIMEOUT):  # the shield used to hold forever
        async with anyio.create_task_group() as shutting_down:
            shutting_down.start_soon(write, "hung")
            await settle()
            shutting_down.cancel_scope.cancel()  # a shutdown does not wait past the deadline either
        disk.hold = False
        await write("next")  # the writer is free again

    assert disk.groups == [["hung"], ["next"]] and disk.durable == ["next"]
    hung = outcomes["hung"]
    assert isinstance(hung, StoreError) and hung.retryable, "never acknowledged: the bot may send it again"
    assert outcomes["next"] is None
    assert [(e["event"], e["writes"]) for e in logs if e["log_level"] == "warning"] == [
        ("voice_context_store_group_abandoned", 1)
    ]


class SlowCommit:
    """Holds the next group in the writer's thread, between its last statement and its COMMIT."""

    def __init__(self) -> None:
        self.holding = threading.Event()
        self.released = threading.Event()

    def __call__(self, writes: Sequence[Sequence[object]]) -> None:
        self.holding.set()
        self.released.wait(TIMEOUT)


@pytest.mark.asyncio
async def test_a_sqlite_group_already_committing_when_its_deadline_passes_is_committed_and_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_groups, "CLOSE_TIMEOUT", 0.0)  # the deadline is the busy timeout alone
    commit = SlowCommit()
    store = SQLiteStore(tmp_path / "sessions.db", busy_timeout=DEADLINE, before_commit=commit)
    assert store.group.deadline == DEADLINE
    await store.create(SessionRecord("gym"))
    acknowledged = anyio.Event()

    async def append() -> None:
        await store.append_turn("gym", 0, Turn("Ana", "user", "My locker code is 4417.", 0.0))
        acknowledged.set()

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(append)
            assert await anyio.to_thread.run_sync(commit.holding.wait, TIMEOUT)
            await anyio.sleep(4 * DEADLINE)  # the group outlasts its deadline inside SQLite
            assert not acknowledged.is_set()
            commit.released.set()
    await store.aclose()

    reopened = SQLiteStore(tmp_path / "sessions.db")
    try:
        assert [t.text for t in await reopened.read_turns("gym", 0, 1)] == ["My locker code is 4417."]
    finally:
        await reopened.aclose()


@pytest.mark.asyncio
async def test_a_writer_waiting_for_another_process_s_write_tries_again_within_a_millisecond(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes on one file (``serve --workers 2``) both write all the time, each holding
    the file's write lock a few ms at a time. SQLite's own busy handler would sleep 1, 2, 5, 10,
    ... up to 100 ms between tries, and keep sleeping past the other's commits; the store's
    writer tries again after 0.1, 0.2, 0.4, 0.8 ms and then every millisecond."""
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.create(SessionRecord("gym"))
    other = sqlite3.connect(tmp_path / "sessions.db", isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # the other process, in the middle of its write
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 8:
            other.execute("COMMIT")  # the other process's write ends
        sqlite_rows.time.sleep(seconds)

    monkeypatch.setattr(sqlite_rows, "_sleep", pause)
    try:
        with anyio.fail_after(TIMEOUT):
            await store.append_turn("gym", 0, Turn("Ana", "user", "My locker code is 4417.", 0.0))
        assert pauses == pytest.approx([0.0001, 0.0002, 0.0004, 0.0008, 0.001, 0.001, 0.001, 0.001])
        assert [t.text for t in await store.read_turns("gym", 0, 1)] == ["My locker code is 4417."]
    finally:
        other.close()
        await store.aclose()
