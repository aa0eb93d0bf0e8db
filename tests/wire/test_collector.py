"""The collector policy: what is frozen is alive, and what died frozen comes back."""

from __future__ import annotations

import gc
import itertools
import platform
import weakref
from collections.abc import Iterator, MutableMapping
from functools import partial
from typing import Any

import anyio
import pytest
from serving import TIMEOUT

from voice_context.server import collector
from voice_context.server.collector import (
    CollectorPolicy,
    Load,
    Step,
    keep_collector_off,
    perform,
    release_free_memory,
)


class Node:
    """One half of a reference cycle (as a closed connection's transport and its callbacks)."""

    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> tuple[Node, weakref.ref[Node]]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a, weakref.ref(a)


@pytest.fixture
def collector_by_hand() -> Iterator[None]:
    """Only the steps the test performs collect; nothing stays frozen after the test."""
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.enable()


def test_a_freeze_every_interval_and_no_thaw_while_nothing_was_let_go() -> None:
    policy = CollectorPolicy(100.0, freeze_seconds=10.0)
    busy = Load(connections=5, sessions=5, released=0)
    assert policy.step(105.0, busy) is Step.WAIT
    assert policy.step(110.0, busy) is Step.FREEZE
    assert policy.step(115.0, busy) is Step.WAIT
    assert policy.step(120.0, Load(connections=0, sessions=0, released=0)) is Step.FREEZE


def test_a_thaw_once_nothing_is_connected_after_something_was_let_go() -> None:
    policy = CollectorPolicy(100.0, freeze_seconds=10.0)
    assert policy.step(101.0, Load(connections=0, sessions=0, released=3)) is Step.THAW
    assert policy.step(102.0, Load(connections=0, sessions=0, released=3)) is Step.WAIT, "once"
    assert policy.step(111.0, Load(connections=0, sessions=0, released=3)) is Step.FREEZE


def test_with_clients_connected_a_thaw_waits_for_a_quarter_of_the_live_to_be_let_go() -> None:
    policy = CollectorPolicy(100.0, freeze_seconds=10.0, min_released=100, thaw_seconds=0.0)
    assert policy.step(101.0, Load(connections=1000, sessions=1000, released=499)) is Step.WAIT
    assert policy.step(102.0, Load(connections=1000, sessions=1000, released=500)) is Step.THAW
    assert policy.step(103.0, Load(connections=10, sessions=10, released=599)) is Step.WAIT
    assert policy.step(104.0, Load(connections=10, sessions=10, released=600)) is Step.THAW


def test_with_clients_connected_a_thaw_comes_at_most_once_every_ten_minutes() -> None:
    """Calls that each hold a session a few minutes let a quarter of 500 go every minute or so:
    the replies wait behind a thaw once per ten minutes, not at each quarter."""
    policy = CollectorPolicy(0.0, freeze_seconds=1.0, min_released=100)
    assert policy.thaw_seconds == 600.0
    churned = Load(connections=500, sessions=500, released=300)
    assert policy.step(75.0, churned) is Step.FREEZE, "a quarter let go, but the last thaw is recent"
    assert policy.step(599.0, Load(connections=500, sessions=500, released=3000)) is Step.FREEZE
    assert policy.step(600.0, Load(connections=500, sessions=500, released=3000)) is Step.THAW
    assert policy.step(700.0, Load(connections=500, sessions=500, released=3300)) is Step.FREEZE
    assert policy.step(701.0, Load(connections=0, sessions=0, released=3800)) is Step.THAW, "idle: at once"


def test_a_thaw_hands_the_allocators_free_memory_back_and_a_freeze_does_not(
    collector_by_hand: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C heap is trimmed when a thaw has let go of what died, not at every freeze (the
    pages given back would be faulted in again a second later)."""
    trims: list[int] = []
    monkeypatch.setattr(collector, "_MALLOC_TRIM", lambda pad: trims.append(pad) or 1)
    node, alive = cycle()
    perform(Step.FREEZE)
    del node
    perform(Step.FREEZE)
    assert trims == []
    perform(Step.THAW)
    assert alive() is None
    assert trims == [0]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim")
def test_the_c_library_that_trims_is_found() -> None:
    """On a glibc system (what the container and CI run) the trim is really there."""
    assert release_free_memory() is True


def test_garbage_at_the_moment_of_a_freeze_is_collected_not_frozen(collector_by_hand: None) -> None:
    node, alive = cycle()
    del node  # garbage that no collection has seen yet
    perform(Step.FREEZE)
    assert alive() is None
    perform(Step.FREEZE)  # and nothing else is lost to the next one
    assert alive() is None


def test_a_cycle_that_dies_frozen_comes_back_at_the_next_thaw(collector_by_hand: None) -> None:
    node, alive = cycle()
    perform(Step.FREEZE)  # alive then: frozen
    del node
    perform(Step.FREEZE)
    assert alive() is not None, "a collection never reaches what is frozen"
    perform(Step.THAW)
    assert alive() is None


@pytest.mark.asyncio
async def test_a_freeze_never_counts_what_is_frozen_one_by_one(
    collector_by_hand: None, monkeypatch: pytest.MonkeyPatch, logs: list[MutableMapping[str, Any]]
) -> None:
    """``gc.get_freeze_count()`` walks every frozen object (23 ms for two million, the event
    loop stopped meanwhile): the freezes that run beside the replies never ask it."""

    def walked() -> int:
        raise AssertionError("gc.get_freeze_count() walks every frozen object")

    monkeypatch.setattr(gc, "get_freeze_count", walked)
    checks, fourth_check = itertools.count(1), anyio.Event()

    def load() -> Load:  # read at each check, just before the step it decides is performed
        if next(checks) == 4:
            fourth_check.set()
        return Load(connections=1, sessions=1, released=0)

    ticks = itertools.count()  # a second between checks on the policy's clock: each check a freeze
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                partial(keep_collector_off, load, freeze_seconds=0.01, monotonic=lambda: float(next(ticks)))
            )
            await fourth_check.wait()  # and the loop performs that check's freeze before it waits again
            tg.cancel_scope.cancel()
    assert [e["step"] for e in logs if e["event"] == "voice_context_gc"] == ["freeze"] * 4
