"""The batch rule on its own: counters in, a batch or a skip reason out."""

from __future__ import annotations

import pytest

from voice_context.core.config import SessionConfig
from voice_context.core.window import (
    BACKLOG_BATCHES,
    MAX_FOLD_BATCHES,
    Batch,
    Skip,
    SkipReason,
    choose_batch,
    recent_start,
)

DEFAULT = SessionConfig()


@pytest.mark.parametrize(
    ("total", "cursor", "window", "expected"),
    [
        (0, 0, 50, 0),
        (30, 0, 50, 0),
        (61, 0, 50, 11),
        (64, 10, 50, 14),
        (71, 10, 50, 21),
        (55, 20, 50, 20),  # never before the cursor
        (20, 20, 50, 20),
    ],
)
def test_recent_start(total: int, cursor: int, window: int, expected: int) -> None:
    assert recent_start(total, cursor, window) == expected


def test_seed_timeline_at_cursor_zero() -> None:
    assert choose_batch(total_turns=60, cursor=0, config=DEFAULT) == Skip(SkipReason.BELOW_THRESHOLD, 10)
    assert choose_batch(total_turns=61, cursor=0, config=DEFAULT) == Batch(0, 10, 11)


def test_seed_timeline_at_cursor_ten() -> None:
    for total in range(10, 71):
        decision = choose_batch(total_turns=total, cursor=10, config=DEFAULT)
        assert decision == Skip(SkipReason.BELOW_THRESHOLD, max(10, total - 50)), total
    batch = choose_batch(total_turns=71, cursor=10, config=DEFAULT)
    assert batch == Batch(10, 20, 21)
    assert isinstance(batch, Batch)
    assert batch.size == 10


def test_elastic_window_after_a_landing() -> None:
    # 3 turns arrived while 0..9 was in flight: 64 turns, cursor 10 once it lands
    assert choose_batch(total_turns=64, cursor=10, config=DEFAULT) == Skip(SkipReason.BELOW_THRESHOLD, 14)


@pytest.mark.parametrize(("recent", "batch"), [(1, 1), (3, 2), (5, 4), (50, 10), (6, 1)])
def test_batch_never_reaches_into_the_recent_window(recent: int, batch: int) -> None:
    config = SessionConfig(recent_window=recent, batch_size=batch)
    for cursor in range(0, 20):
        for total in range(cursor, cursor + recent + batch + 15):
            decision = choose_batch(total_turns=total, cursor=cursor, config=config)
            fires = total - cursor > recent + batch
            assert isinstance(decision, Batch) is fires
            if isinstance(decision, Batch):
                assert decision.start == cursor
                backlog = (decision.recent_start - cursor) // batch
                if backlog < BACKLOG_BATCHES:
                    assert decision.size == batch
                else:  # a large backlog folds several whole batches at once
                    assert decision.size == batch * min(backlog, MAX_FOLD_BATCHES)
                assert decision.end <= decision.recent_start == recent_start(total, cursor, recent)


def test_in_flight_wins_over_the_count() -> None:
    assert choose_batch(total_turns=80, cursor=0, config=DEFAULT, in_flight=True) == Skip(
        SkipReason.ALREADY_IN_FLIGHT, 30
    )


def test_ending_wins_over_everything() -> None:
    decision = choose_batch(
        total_turns=80, cursor=0, config=DEFAULT, in_flight=True, ending=True, now=0.0, retry_at=5.0
    )
    assert decision == Skip(SkipReason.SESSION_ENDING, 30)


def test_backing_off_until_retry_at() -> None:
    decision = choose_batch(total_turns=61, cursor=0, config=DEFAULT, now=9.0, retry_at=10.0)
    assert decision == Skip(SkipReason.BACKING_OFF, 11, retry_at=10.0)
    assert choose_batch(total_turns=61, cursor=0, config=DEFAULT, now=10.0, retry_at=10.0) == Batch(0, 10, 11)
    # below the threshold the count is the reason, whatever the backoff says
    below = choose_batch(total_turns=60, cursor=0, config=DEFAULT, now=9.0, retry_at=10.0)
    assert below == Skip(SkipReason.BELOW_THRESHOLD, 10)
    assert below.retry_at is None


def test_no_eligible_batch_only_with_a_minimum_age() -> None:
    config = SessionConfig(min_age_seconds=30.0)
    times = [float(i) for i in range(61)]  # turn i spoken at t=i; the batch's newest is t=9
    young = choose_batch(total_turns=61, cursor=0, config=config, now=38.9, turn_times=times)
    assert young == Skip(SkipReason.NO_ELIGIBLE_BATCH, 11)
    assert choose_batch(total_turns=61, cursor=0, config=config, now=39.0, turn_times=times) == Batch(
        0, 10, 11
    )
    # the default (0) is the pure count rule: age never matters
    assert choose_batch(total_turns=61, cursor=0, config=DEFAULT, now=0.0, turn_times=times) == Batch(
        0, 10, 11
    )


def test_minimum_age_reads_times_from_the_cursor() -> None:
    config = SessionConfig(min_age_seconds=30.0)
    times = [100.0 + i for i in range(61)]  # turns 10..70, turn 10+j at t=100+j
    assert choose_batch(total_turns=71, cursor=10, config=config, now=138.9, turn_times=times) == Skip(
        SkipReason.NO_ELIGIBLE_BATCH, 21
    )
    assert choose_batch(total_turns=71, cursor=10, config=config, now=139.0, turn_times=times) == Batch(
        10, 20, 21
    )


@pytest.mark.parametrize(("total", "cursor"), [(5, -1), (5, 6)])
def test_cursor_outside_the_transcript_is_rejected(total: int, cursor: int) -> None:
    with pytest.raises(ValueError, match="cursor"):
        choose_batch(total_turns=total, cursor=cursor, config=DEFAULT)


def test_skip_reasons_are_the_logged_strings() -> None:
    assert {reason.value for reason in SkipReason} == {
        "below_threshold",
        "already_in_flight",
        "no_eligible_batch",
        "session_ending",
        "backing_off",
    }
