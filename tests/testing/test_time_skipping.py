"""Time skipping in the test harness (``celery_durable.testing``): a week in no wall time.

A durable task sleeps seven days (the dispatcher wakes it, W4) and then retries a step with
1-hour back-offs (countdown re-sends, W3): it finishes on the test clock without any real
wait. Asserted through the clock (stored times, skipped waits), never with a stopwatch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery

from celery_durable import CatchUp, Daily, Retry, ScheduledRun, now, sleep
from celery_durable.testing import DurableHarness, TestClock
from tests.support.clock import T0

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def real_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every ``time.sleep`` call of the test (the library's own waits included)."""
    calls: list[float] = []
    real = time.sleep

    def recording(seconds: float) -> None:
        calls.append(seconds)
        real(seconds)

    monkeypatch.setattr(time, "sleep", recording)
    return calls


@pytest.fixture
def durable(celery_app: Celery, sqlite_url: str, real_sleeps: list[float]) -> Iterator[Any]:
    with DurableHarness(celery_app, sqlite_url, clock=TestClock(T0)) as harness:
        harness.start()
        yield harness


def test_a_week_long_sleep_and_hourly_retries_take_no_real_sleep(
    durable: DurableHarness, real_sleeps: list[float]
) -> None:
    failures = {"left": 2}

    @durable.step(name="call", retry=Retry(attempts=5, initial=3600.0, multiplier=1.0, cap=3600.0))
    def call() -> str:
        if failures["left"]:
            failures["left"] -= 1
            raise ConnectionError("remote is down")
        return "ok"

    @durable.step(name="quick", retry=Retry(attempts=3))  # 1 s back-off: waited in the worker
    def quick() -> str:
        if failures.setdefault("quick", 1):
            failures["quick"] = 0
            raise ConnectionError("blip")
        return "fine"

    @durable.task(name="t.week")
    def week() -> list[Any]:
        start = now()
        sleep(timedelta(days=7))
        woke = now()
        value = call()
        done = now()
        return [start.isoformat(), woke.isoformat(), done.isoformat(), value, quick()]

    week.apply_async(task_id="week-1")
    durable.advance(days=7, hours=3)

    start, woke, done, value, fine = durable.result("week-1")
    assert (value, fine) == ("ok", "fine")
    assert datetime.fromisoformat(woke) - datetime.fromisoformat(start) == timedelta(days=7)
    assert datetime.fromisoformat(done) - datetime.fromisoformat(woke) == timedelta(hours=2)
    assert [s.attempts for s in durable.steps_of("week-1") if s.name == "call"] == [
        2
    ]  # failed attempts
    assert durable.step_calls("week-1") == {"call": 3, "quick": 2, "now": 3}
    assert durable.now() == T0 + timedelta(days=7, hours=3)
    assert durable.clock.slept == pytest.approx(1.0)  # the in-worker wait, skipped
    assert not [s for s in real_sleeps if s >= 0.5], real_sleeps  # no real wait anywhere


def test_advance_runs_every_due_time_on_time_and_downtime_catches_up(
    durable: DurableHarness,
) -> None:
    seen: list[tuple[datetime, datetime]] = []

    @durable.task(name="t.nightly")
    def nightly(run: ScheduledRun) -> None:
        seen.append((run.due, durable.now()))

    durable.schedules.create(
        "nightly", nightly, None, Daily("02:00", "UTC"), catch_up=CatchUp.LATEST
    )
    durable.advance(days=2)
    assert [due for due, _ in seen] == [
        datetime(2026, 11, 3, 2, tzinfo=timezone.utc),
        datetime(2026, 11, 4, 2, tzinfo=timezone.utc),
    ]
    assert all(due == at for due, at in seen), "each run was decided at its due time"
    durable.downtime(days=3)  # 5th, 6th, 7th 02:00 pass with nothing running
    assert [due.day for due, _ in seen] == [3, 4, 7]
    assert seen[-1][1] == T0 + timedelta(days=5)


def test_a_plain_task_with_a_three_day_countdown_runs_when_the_clock_gets_there(
    durable: DurableHarness, celery_app: Celery
) -> None:
    ran: list[datetime] = []

    @celery_app.task(name="t.later")
    def later() -> None:
        ran.append(durable.now())

    later.apply_async(countdown=3 * 86400)
    durable.advance(days=2, hours=23)
    assert ran == []
    durable.advance(hours=2)
    assert len(ran) == 1 and ran[0] - T0 == pytest.approx(
        timedelta(days=3), abs=timedelta(seconds=1)
    )


def test_a_run_that_has_not_ended_is_reported_at_once(durable: DurableHarness) -> None:
    @durable.task(name="t.long")
    def long() -> str:
        sleep(timedelta(days=2))
        return "done"

    long.apply_async(task_id="long-1")
    durable.advance(days=1)
    with pytest.raises(TimeoutError, match="'long-1' has not ended at 2026-11-03T12:00:00"):
        durable.result("long-1")
    durable.advance(days=1)
    assert durable.result("long-1") == "done"


def test_advance_refuses_to_go_back_or_to_guess(durable: DurableHarness) -> None:
    with pytest.raises(ValueError, match="cannot go back"):
        durable.advance(until=T0 - timedelta(seconds=1))
    with pytest.raises(TypeError, match="give one of"):
        durable.advance(timedelta(hours=1), hours=1)
    with pytest.raises(ValueError, match="aware"):
        durable.advance(until=datetime(2027, 1, 1))
