"""Which worker of ``serve --workers`` takes the next connection: the rule, with literal numbers
and no loop, and the shared block of counts it reads."""

from __future__ import annotations

import os

import pytest

from voice_context.core.balance import BOUND, PAUSE, wait_before_accepting
from voice_context.server.listener import ABSENT, Loads


def test_the_least_loaded_worker_accepts_and_so_do_those_tied_with_it() -> None:
    assert wait_before_accepting(3, [5, 4]) == 0.0
    assert wait_before_accepting(4, [4, 7]) == 0.0, "tied: both try, the kernel gives it to one"


def test_a_worker_that_holds_more_than_a_sibling_looks_away_for_the_pause() -> None:
    assert wait_before_accepting(5, [4, 9]) == PAUSE
    assert wait_before_accepting(1, [0], declined_for=0.004) == PAUSE


def test_a_worker_alone_accepts_everything() -> None:
    assert wait_before_accepting(40, []) == 0.0


def test_a_worker_that_declined_for_the_bound_accepts_anyway_and_never_looks_away_past_it() -> None:
    # the sibling with fewer is stopped, or too busy to look: the connection waits no longer
    assert wait_before_accepting(9, [0], declined_for=BOUND) == 0.0
    assert wait_before_accepting(9, [0], declined_for=BOUND + 1.0) == 0.0
    assert wait_before_accepting(9, [0], declined_for=0.019) == pytest.approx(0.001)
    assert wait_before_accepting(9, [0], declined_for=0.0, pause=0.5, bound=0.1) == 0.1


def test_each_worker_sees_the_others_counts_in_the_shared_block_while_they_accept() -> None:
    supervisor, fd = Loads.create(3)
    try:
        assert supervisor.others() == [], "no worker accepts yet"
        first, second = Loads(fd, 0), Loads(fd, 2)
    finally:
        supervisor.close()
        os.close(fd)  # each worker keeps its own mapping
    first.accepting(True)
    assert second.others() == [0]
    first.add(1)
    first.add(1)
    second.accepting(True)
    second.add(1)
    assert (first.mine, first.others(), second.mine, second.others()) == (2, [1], 1, [2])
    first.accepting(False)  # shutting down: the others no longer leave connections to it
    first.add(-1)
    assert second.others() == []
    assert repr(second) == f"<Loads worker=2 [{ABSENT}, {ABSENT}, 1]>"
    first.close()
    second.close()


def test_a_worker_with_no_slot_in_the_block_is_refused() -> None:
    supervisor, fd = Loads.create(2)
    try:
        with pytest.raises(ValueError, match="worker 2 has no slot among 2"):
            Loads(fd, 2)
    finally:
        supervisor.close()
        os.close(fd)
