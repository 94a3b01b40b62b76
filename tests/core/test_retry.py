"""Retry policies (W3): the frozen value and the pure decision, with Hypothesis."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_durable.core.retry import GiveUp, Retry, RetryAt, decide_retry, type_name

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_constructors_and_defaults() -> None:
    assert Retry.none().attempts == 1
    policy = Retry.times(4)
    assert (policy.attempts, policy.initial, policy.multiplier, policy.cap) == (4, 1.0, 2.0, 60.0)
    forever = Retry.forever(timedelta(minutes=5))
    assert forever.attempts is None and forever.deadline == 300.0
    assert [Retry.times(10).delay(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.attempts = 3  # type: ignore[misc]
    assert Retry.times(3) == Retry.times(3)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempts": 0},
        {"attempts": None},
        {"multiplier": 0.5},
        {"initial": -1},
        {"timeout": 0},
        {"retry_on": (int,)},
    ],
)
def test_invalid_policies_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises((ValueError, TypeError)):
        Retry(**kwargs)  # type: ignore[arg-type]


def test_not_retryable_and_retry_on() -> None:
    policy = Retry.times(5, retry_on=(OSError,), dont_retry_on=(PermissionError,))
    assert decide_retry(
        policy, PermissionError("x"), attempt=1, first_started=T0, now=T0
    ) == GiveUp("not_retryable", "PermissionError is not retryable")
    assert isinstance(
        decide_retry(policy, ValueError(), attempt=1, first_started=T0, now=T0), GiveUp
    )
    assert decide_retry(policy, OSError(), attempt=1, first_started=T0, now=T0) == RetryAt(
        T0 + timedelta(seconds=1), 2
    )


def test_attempt_limit_and_timeout_kind() -> None:
    policy = Retry.times(2)
    assert isinstance(decide_retry(policy, OSError(), attempt=1, first_started=T0, now=T0), RetryAt)
    assert decide_retry(
        policy, OSError(), attempt=2, first_started=T0, now=T0, kind="timeout"
    ) == GiveUp("timeout", "gave up after 2 attempt(s)")


def test_deadline_counts_from_the_first_start_not_from_now() -> None:
    policy = Retry.forever(10, initial=2, multiplier=1)
    late = T0 + timedelta(seconds=9)
    assert isinstance(
        decide_retry(policy, OSError(), attempt=3, first_started=T0, now=late), GiveUp
    )
    early = T0 + timedelta(seconds=7)
    assert isinstance(
        decide_retry(policy, OSError(), attempt=3, first_started=T0, now=early), RetryAt
    )


def test_type_names() -> None:
    assert type_name(ValueError) == "ValueError"
    assert type_name(GiveUp) == "celery_durable.core.retry.GiveUp"


@given(
    initial=st.floats(0, 100),
    multiplier=st.floats(1, 10),
    cap=st.floats(0, 1000),
    attempt=st.integers(1, 2000),
)
def test_delay_is_capped_and_never_decreases(
    initial: float, multiplier: float, cap: float, attempt: int
) -> None:
    policy = Retry(attempts=None, deadline=1, initial=initial, multiplier=multiplier, cap=cap)
    assert 0 <= policy.delay(attempt) <= cap
    assert policy.delay(attempt) <= policy.delay(attempt + 1)


@given(
    attempts=st.integers(1, 20),
    deadline=st.none() | st.floats(0, 3600),
    attempt=st.integers(1, 30),
    elapsed=st.floats(0, 7200),
)
def test_decision_respects_limits(
    attempts: int, deadline: float | None, attempt: int, elapsed: float
) -> None:
    policy = Retry(attempts=attempts, deadline=deadline)
    now = T0 + timedelta(seconds=elapsed)
    decision = decide_retry(policy, OSError(), attempt=attempt, first_started=T0, now=now)
    if isinstance(decision, RetryAt):
        assert attempt < attempts
        assert decision.attempt == attempt + 1
        assert decision.at >= now
        if deadline is not None:
            assert decision.at <= T0 + timedelta(seconds=deadline)
    else:
        assert attempt >= attempts or deadline is not None
