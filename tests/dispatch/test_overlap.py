"""Overlap policies (D7): a real in-process worker on Redis, a fake dispatcher clock."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta, timezone

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_durable import CatchUp, Durable, Every, Overlap
from tests.support.clock import FakeClock
from tests.support.processes import wait_for

UTC = timezone.utc


release = threading.Event()
started: list[str] = []


@pytest.fixture
def setup(redis_url: str, journal_url: str, clock: FakeClock) -> Iterator[tuple[Durable, Celery]]:
    app = Celery("overlap_tests", broker=redis_url, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = True

    @app.task(name="slow", bind=True, shared=False)
    def slow(self, *_: object) -> None:
        started.append(self.request.id)
        release.wait(20)

    durable = Durable(app, journal_url, clock=clock)
    started.clear()
    release.clear()
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=20):
        try:
            yield durable, app
        finally:
            # Before the worker stops: a slow run still waiting would hold its shutdown for
            # the whole 20 s timeout, which then fails the test and leaves the worker thread
            # behind (the next start_worker waited for ever in CI).
            release.set()
    durable.close()


def runs_by_state(durable: Durable, sid: str) -> dict[str, str]:
    return {r.run_id.split("@")[1][11:19]: r.state for r in durable.schedules.runs(sid)}


def test_skip_records_the_due_time_while_a_run_goes(
    setup: tuple[Durable, Celery], clock: FakeClock
) -> None:
    durable, _ = setup
    durable.schedules.create(
        "o", "slow", None, Every(timedelta(seconds=10)), CatchUp.ALL, overlap=Overlap.SKIP
    )
    d = durable.dispatcher()
    clock.now += timedelta(seconds=10)
    d.tick()
    wait_for(lambda: len(started) == 1, timeout=15)
    clock.now += timedelta(seconds=10)
    d.tick()
    assert runs_by_state(durable, "o") == {"12:00:10": "started", "12:00:20": "skipped"}
    release.set()
    wait_for(
        lambda: durable.schedules.state("o") is not None and not durable._store.load("o").running,
        timeout=15,
    )
    clock.now += timedelta(seconds=10)
    d.tick()
    wait_for(lambda: len(started) == 2, timeout=15)
    assert runs_by_state(durable, "o") == {
        "12:00:10": "started",
        "12:00:20": "skipped",
        "12:00:30": "started",
    }
    assert [r.outcome for r in durable.schedules.runs("o") if r.state == "started"][
        -1
    ] == "finished"


def test_buffer_one_waits_for_the_running_one(
    setup: tuple[Durable, Celery], clock: FakeClock
) -> None:
    durable, _ = setup
    durable.schedules.create(
        "b", "slow", None, Every(timedelta(seconds=10)), CatchUp.ALL, overlap="buffer_one"
    )
    d = durable.dispatcher()
    clock.now += timedelta(seconds=10)
    d.tick()
    wait_for(lambda: len(started) == 1, timeout=15)
    clock.now += timedelta(seconds=10)
    d.tick()
    clock.now += timedelta(seconds=10)
    d.tick()
    assert runs_by_state(durable, "b") == {
        "12:00:10": "started",
        "12:00:20": "decided",
        "12:00:30": "skipped",
    }
    assert len(started) == 1
    release.set()
    wait_for(lambda: not durable._store.load("b").running, timeout=15)
    clock.now += timedelta(seconds=1)
    d.tick()
    wait_for(lambda: len(started) == 2, timeout=15)
    assert started[1].endswith("12:00:20.0000000Z")
    assert runs_by_state(durable, "b")["12:00:20"] == "started"


def test_allow_runs_alongside(setup: tuple[Durable, Celery], clock: FakeClock) -> None:
    durable, _ = setup
    durable.schedules.create("a", "slow", None, Every(timedelta(seconds=10)), CatchUp.ALL)
    d = durable.dispatcher()
    for _ in range(2):
        clock.now += timedelta(seconds=10)
        d.tick()
    assert set(runs_by_state(durable, "a").values()) == {"started"}
    assert durable._store.load("a").running == ()
