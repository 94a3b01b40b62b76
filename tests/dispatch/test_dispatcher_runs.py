"""The dispatcher's side of durable runs: stale runs (D8) and long sleeps (W4), real worker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta, timezone

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_durable import Durable, Every, Finished, ScheduledRun, sleep
from tests.support.clock import T0, FakeClock
from tests.support.processes import wait_for

UTC = timezone.utc


@pytest.fixture
def durable(redis_url: str, journal_url: str, clock: FakeClock) -> Iterator[Durable]:
    app = Celery("runs_tests", broker=redis_url, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = True
    d = Durable(app, journal_url, clock=clock)

    @d.task(name="job", shared=False)
    def job(run: ScheduledRun) -> str:
        return f"did {run.input}"

    @d.task(name="sleeper", shared=False)
    def sleeper(run: ScheduledRun) -> str:
        sleep(timedelta(hours=1))
        return "woke"

    yield d
    d.close()


def queued_ids(client: redis.Redis) -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange("celery", 0, -1)]


def test_d8_a_sent_run_no_worker_claims_is_sent_again_after_the_lease(
    durable: Durable, clock: FakeClock, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    durable.schedules.create("lost", "job", "x", Every(timedelta(seconds=10)))
    d = durable.dispatcher()
    clock.now += timedelta(seconds=10)
    d.tick()
    run = "lost@2026-11-02T12:00:10.0000000Z"
    assert queued_ids(client) == [run]
    client.delete("celery")  # the broker lost it (a filesystem/SQL transport after a crash)
    assert durable.runs.row(run)["status"] == "queued"
    clock.now += timedelta(seconds=200)
    d.tick()
    assert run not in queued_ids(client)  # the lease (300 s) has not passed yet
    clock.now += timedelta(seconds=101)
    d.tick()
    assert queued_ids(client).count(run) == 1
    d.tick()
    assert queued_ids(client).count(run) == 1  # not again at every tick
    message = json.loads(client.lrange("celery", 0, -1)[-1])
    assert message["headers"]["durable_schedule"] == "lost"


def test_w4_long_sleep_is_woken_by_the_dispatcher(durable: Durable, clock: FakeClock) -> None:
    durable.schedules.create("nap", "sleeper", None, Every(timedelta(days=1)))
    d = durable.dispatcher()
    clock.now += timedelta(days=1)
    with start_worker(durable.app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        d.tick()
        run = "nap@2026-11-03T12:00:00.0000000Z"
        wait_for(lambda: (durable.runs.row(run) or {}).get("status") == "suspended", timeout=15)
        clock.now += timedelta(minutes=30)
        d.tick()
        assert durable.runs.row(run)["status"] == "suspended"
        clock.now += timedelta(minutes=31)
        d.tick()
        assert durable.outcome(run, timeout=15) == Finished("woke")
    [view] = durable.schedules.runs("nap")
    assert (view.state, view.outcome) == ("started", "finished")  # V2: a durable run's outcome


def test_worker_claim_racing_the_dispatchers_record_of_the_send(pg_url: str) -> None:
    """A fast worker claims a run while the dispatcher's row for it is not committed yet."""
    import threading
    import time

    from celery_durable.message import Resend
    from celery_durable.store.journal.sql import SqlJournal
    from celery_durable.store.runs import RunStore
    from celery_durable.store.sql_store import SqlStore

    journal = SqlJournal(pg_url)
    store = SqlStore(journal)
    now = T0
    run = "s@2026-12-02T00:00:00.0000000Z"
    sent = Resend(run_id=run, task="t", args=[], kwargs={}, options={}, headers={})
    errors: list[Exception] = []

    def dispatcher() -> None:
        with store.unit_of_work() as unit:
            unit.record_sent([sent], now=now, lease=300)
            time.sleep(1.0)  # inserted, not committed yet

    def worker() -> None:
        time.sleep(0.3)
        try:
            with store.unit_of_work() as unit:
                unit.save_run(run, {"task": "t", "status": "running", "owner": "w"}, now=now)
        except Exception as exc:  # the test reports it below
            errors.append(exc)

    threads = [threading.Thread(target=dispatcher), threading.Thread(target=worker)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    row = RunStore(journal).row(run)
    assert row is not None and (row["status"], row["owner"]) == ("running", "w")
    journal.close()
