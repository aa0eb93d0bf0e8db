"""The circuit breaker on its own: what a call may do while a server is down, with literal times."""

from __future__ import annotations

import math
import random

import pytest

from voice_context.core.breaker import CircuitBreaker


def test_a_failed_try_opens_the_circuit_and_calls_are_refused_until_the_backoff_has_passed() -> None:
    breaker = CircuitBreaker(base=1.0, cap=8.0, jitter=0.0)
    assert (breaker.state, breaker.wait(100.0)) == ("closed", 0.0)
    breaker.attempt(100.0)
    assert breaker.failed(100.0) is True, "this failure opened the circuit"
    assert breaker.state == "open"
    assert breaker.wait(100.0) == 1.0
    assert breaker.wait(100.5) == 0.5
    assert breaker.wait(101.0) == 0.0


def test_one_call_probes_at_a_time_and_the_others_are_refused_while_it_does() -> None:
    breaker = CircuitBreaker(base=1.0, cap=8.0, jitter=0.0)
    breaker.attempt(0.0)
    breaker.failed(0.0)
    breaker.attempt(1.0)  # the probe
    assert breaker.state == "probing"
    assert breaker.wait(1.5) == math.inf, "another call does not try beside the probe"
    assert breaker.failed(2.0) is False, "already open: not opened again (nor logged again)"
    assert breaker.wait(2.0) == 2.0, "the next backoff is twice as long"


def test_the_backoff_doubles_with_each_failure_in_a_row_up_to_the_cap() -> None:
    breaker = CircuitBreaker(base=0.5, cap=3.0, jitter=0.0)
    assert [breaker.backoff(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert breaker.backoff(10_000) == 3.0


def test_a_probe_that_reaches_the_server_closes_the_circuit_and_says_how_long_it_was_open() -> None:
    breaker = CircuitBreaker(base=1.0, cap=8.0, jitter=0.0)
    assert breaker.succeeded(5.0) is None, "it was closed"
    breaker.attempt(10.0)
    breaker.failed(10.0)
    breaker.attempt(11.0)
    breaker.failed(11.0)
    breaker.attempt(13.0)
    assert breaker.succeeded(13.5) == 3.5
    assert (breaker.state, breaker.failures, breaker.wait(13.5)) == ("closed", 0, 0.0)
    breaker.attempt(20.0)
    breaker.failed(20.0)
    assert breaker.wait(20.0) == 1.0, "a new outage starts from the base again"


def test_the_jitter_takes_a_random_share_of_up_to_jitter_off_each_backoff() -> None:
    breaker = CircuitBreaker(base=1.0, cap=4.0, jitter=0.5, rng=random.Random(7))
    waits = [breaker.backoff(3) for _ in range(200)]
    assert all(2.0 <= w <= 4.0 for w in waits)
    assert len(set(waits)) > 100, "bots of one server do not come back in step"


def test_a_backoff_that_is_not_positive_or_a_jitter_outside_0_1_is_refused() -> None:
    for bad in ({"base": 0.0}, {"base": 2.0, "cap": 1.0}, {"jitter": 1.0}, {"jitter": -0.1}):
        with pytest.raises(ValueError):
            CircuitBreaker(**bad)
    assert repr(CircuitBreaker()) == "<CircuitBreaker closed>"
