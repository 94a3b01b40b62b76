"""Start deadlines, jitter and catch-up windows through the real dispatcher (SPEC §5d: P1–P3).

A fake clock, real journals and a real Redis broker, as in ``test_dispatcher.py``.
"""

from __future__ import annotations

import base64
import json
import logging
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from scipy import stats

from celery_durable import CatchUp, Durable, Every, Once, ScheduledRun
from celery_durable.core.ids import run_id
from celery_durable.core.policies import jitter_offset
from celery_durable.core.schedule_aggregate import MISSED_UNSENT
from celery_durable.core.schedule_events import RunDecided, RunSent
from tests.dispatch import test_dispatcher as base
from tests.dispatch.test_dispatcher import Broker
from tests.support.clock import T0, FakeClock
from tests.support.tcpproxy import app_behind_proxy

UTC = timezone.utc
S = timedelta(seconds=1)


# The fixtures of the dispatcher's own tests: an app with the task "backup" on the test's
# Redis, a Durable on each journal with the fake clock, and a reader of the Redis queue.
durable = base.durable
broker = base.broker


def events_of(durable: Durable, sid: str, kind: type) -> list[Any]:
    return [e for e in durable._store.events(sid) if isinstance(e, kind)]


# P1 -------------------------------------------------------------------------------------------


def test_the_message_expires_at_due_plus_deadline(
    durable: Durable, clock: FakeClock, broker: Broker
) -> None:
    durable.schedules.create("b", "backup", "/srv", Every(60 * S), start_deadline=5)
    durable.schedules.create(
        "early", "backup", "/srv", Every(60 * S), start_deadline=timedelta(seconds=30), expires=2
    )
    d = durable.dispatcher()
    d.tick()
    clock.advance(seconds=60)
    d.tick()
    messages = {m["headers"]["durable_schedule"]: m for m in broker.take()}
    due = T0 + 60 * S
    plain = messages["b"]
    assert plain["headers"]["expires"] == (due + 5 * S).isoformat()
    assert plain["headers"]["durable_deadline"] == "2026-11-02T12:01:05.0000000Z"
    # Celery's expiry header, checked by the worker; no broker TTL that would drop it unseen.
    assert "expiration" not in plain["properties"]
    # The earlier wins: the schedule's own expires (2 s after sending) before the deadline.
    assert messages["early"]["headers"]["expires"] == (due + 2 * S).isoformat()


def test_a_run_unsent_at_its_deadline_is_missed_not_sent(
    journal_url: str, clock: FakeClock, broker: Broker, redis_url: str
) -> None:
    app, proxy = app_behind_proxy(redis_url, "outage")
    app.conf.broker_connection_timeout = 1
    durable = Durable(app, journal_url, clock=clock)
    try:
        durable.schedules.create("r", "backup", "/srv", Every(60 * S), start_deadline=8)
        durable.schedules.create("free", "backup", "/srv", Every(60 * S))
        d = durable.dispatcher()
        d.tick()
        proxy.cut()
        clock.advance(seconds=60)
        d.tick()  # decided, not sent: the broker is away
        clock.advance(seconds=5)
        d.tick()  # retried, still away; 3 s before the deadline
        proxy.restore()
        clock.advance(seconds=5)  # the broker is back, but after the deadline
        d.tick()
        [sent] = broker.ids()
        assert sent.startswith("free@")
        [run] = durable.schedules.runs("r")
        assert run.state == "missed"
        assert run.error == "start deadline passed before the run could be sent"
        assert run.missed_at == T0 + 70 * S
    finally:
        durable.close()
        proxy.cut()


@pytest.mark.parametrize("overlap", ["allow", "skip"])
def test_catch_up_after_downtime_records_runs_past_their_deadline_as_missed(
    durable: Durable, clock: FakeClock, broker: Broker, overlap: str
) -> None:
    """P1 (2026-12 wording): runs that catch-up decides in the tick that finds them already
    past due + deadline are recorded missed in that tick and never sent; a run still within
    its deadline is sent, and a missed one does not make it skip by overlap."""
    durable.schedules.create(
        "every-minute", "backup", "/srv", Every(60 * S), CatchUp.ALL,
        start_deadline=30, overlap=overlap,
    )  # fmt: skip
    d = durable.dispatcher()
    d.tick()
    clock.advance(seconds=4 * 60 + 10)  # beat down for due times +1..+4 min; +4 min is 10 s old
    d.tick()
    last = T0 + 4 * 60 * S
    assert broker.ids() == [run_id("every-minute", last)]
    runs = {run.due: run for run in durable.schedules.runs("every-minute")}
    assert sorted(runs) == [T0 + n * 60 * S for n in (1, 2, 3, 4)]
    for n in (1, 2, 3):
        run = runs[T0 + n * 60 * S]
        assert (run.state, run.error) == ("missed", MISSED_UNSENT)
    assert runs[last].state == "started"
    assert events_of(durable, "every-minute", RunSent) != []


@pytest.mark.parametrize("late", [4, 5])
def test_a_durable_run_carries_its_deadline_and_is_missed_when_delivered_after_it(
    app: Celery, journal_url: str, clock: FakeClock, broker: Broker, late: int
) -> None:
    durable = Durable(app, journal_url, clock=clock)
    bodies: list[Any] = []

    @durable.task(name="report")
    def report(run: ScheduledRun) -> str:
        bodies.append(run)
        return "done"

    try:
        durable.schedules.create("rep", "report", None, Every(60 * S), start_deadline=5)
        d = durable.dispatcher()
        d.tick()
        clock.advance(seconds=60)
        d.tick()
        [message] = broker.take()
        headers = message["headers"]
        assert headers["durable_deadline"] == "2026-11-02T12:01:05.0000000Z"
        # A started durable run must be able to go on after its deadline (a redelivery, a
        # wake-up after a sleep): no expiry on the message, the worker checks the deadline.
        assert headers["expires"] is None
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        custom = {k: headers[k] for k in ("durable_deadline", "durable_schedule", "durable_due")}
        clock.advance(seconds=late)
        result = report.apply(args, kwargs, task_id=headers["id"], headers=custom).get()
        [run] = durable.schedules.runs("rep")
        if late < 5:  # before the deadline: it runs
            assert (result, run.state, run.outcome) == ("done", "started", "finished")
            return
        # At the deadline, never started: it never starts.
        assert result is None and bodies == []
        assert (run.state, run.error) == (
            "missed",
            "start deadline passed before a worker began the durable run",
        )
        assert durable.runs.row(headers["id"])["status"] == "missed"
        assert durable.runs.stale(clock.now + timedelta(days=1)) == []  # never sent again (D8)
    finally:
        durable.close()


# P2 -------------------------------------------------------------------------------------------


def test_a_jittered_run_is_sent_at_its_offset_and_a_plain_one_exactly_at_due(
    durable: Durable, clock: FakeClock, broker: Broker
) -> None:
    durable.schedules.create("plain", "backup", "/srv", Every(60 * S))
    durable.schedules.create("jit", "backup", "/srv", Every(60 * S), jitter=30)
    d = durable.dispatcher()
    d.tick()
    due = T0 + 60 * S
    clock.set(due)
    d.tick()
    assert [m["headers"]["id"] for m in broker.take()] == ["plain@2026-11-02T12:01:00.0000000Z"]
    [decided] = events_of(durable, "jit", RunDecided)
    send_at = due + jitter_offset(decided.run_id, 30 * S)
    assert decided.send_at == send_at > due
    assert decided.run_id == "jit@2026-11-02T12:01:00.0000000Z"  # the nominal due time
    assert d.next_attention == send_at  # asleep until then, not polling for it
    clock.set(send_at - timedelta(milliseconds=1))
    d.tick()
    assert broker.ids() == []
    clock.set(send_at)
    d.tick()
    assert broker.ids() == [decided.run_id]
    assert [e.at for e in events_of(durable, "jit", RunSent)] == [send_at]
    assert [e.at for e in events_of(durable, "plain", RunSent)] == [due]


def send_times(durable: Durable, sids: list[str]) -> dict[str, tuple[datetime, datetime, Any]]:
    """run ID → (due, stored send_at, started at) of each schedule's one run."""
    found = {}
    for sid in sids:
        [decided] = events_of(durable, sid, RunDecided)
        started = events_of(durable, sid, RunSent)
        found[decided.run_id] = (decided.due, decided.send_at, started[0].at if started else None)
    return found


def test_a_thousand_runs_due_at_once_are_spread_uniformly_the_same_by_any_beat(
    app: Celery, sqlite_url: str, clock: FakeClock, broker: Broker
) -> None:
    jitter = 10 * S
    first = Durable(app, sqlite_url, clock=clock)
    second = Durable(app, sqlite_url, clock=clock)
    try:
        due = T0 + 60 * S
        sids = [f"s{n:04d}" for n in range(1000)]
        for sid in sids:
            first.schedules.create(sid, "backup", "/srv", Once(due), jitter=jitter)
        one = first.dispatcher(owner="one", lease_ttl=2)
        two = second.dispatcher(owner="two", lease_ttl=2)
        clock.set(due)
        # The first beat decides all 1000 at the due time and sends the first 5 s of them,
        # following its own sleeps; then it stops and the second takes over at once.
        wait = one.tick()
        while clock.now + timedelta(seconds=wait) < due + 5 * S:
            clock.advance(seconds=wait)
            wait = one.tick()
        one.close()
        handover = clock.now
        while clock.now < due + jitter + S:
            clock.advance(seconds=two.tick())
        runs = send_times(first, sids)
        assert len(broker.ids()) == 1000
        by_one = [r for r, (_, _, started) in runs.items() if started <= handover]
        assert 400 < len(by_one) < 600  # each beat sent about half
        for rid, (nominal, send_at, started) in runs.items():
            assert nominal == due and rid.endswith("@2026-11-02T12:01:00.0000000Z")
            # The offset is the run ID's: whichever beat decided, sent or would re-send it.
            assert send_at == due + jitter_offset(rid, jitter)
            assert started is not None
            assert timedelta(0) <= started - send_at <= timedelta(milliseconds=20), rid
        # Kolmogorov–Smirnov against U(0, 1) of the offsets and of the moments actually sent
        # (no seed: the offsets are fixed by the run IDs); 1.63/sqrt(n) is the 1 % level.
        offsets = [(send_at - due) / jitter for _, send_at, _ in runs.values()]
        sent = [(started - due) / jitter for _, _, started in runs.values()]
        for sample in (offsets, sent):
            assert stats.kstest(sample, "uniform").statistic < 1.63 / len(sample) ** 0.5
    finally:
        first.close()
        second.close()


# P3 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("catch_up", "window", "runs", "dropped"),
    [
        (CatchUp.LATEST, 3600, [30], 29),  # longer than the 30-minute downtime
        (CatchUp.LATEST, 600, [30], 29),
        (CatchUp.ALL, 3600, list(range(1, 31)), 0),
        (CatchUp.ALL, 600, list(range(20, 31)), 19),  # shorter: only its last 10 minutes
    ],
)
def test_a_catch_up_window_after_dispatcher_downtime(
    durable: Durable,
    clock: FakeClock,
    broker: Broker,
    catch_up: CatchUp,
    window: int,
    runs: list[int],
    dropped: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    durable.schedules.create("w", "backup", "/srv", Every(60 * S), catch_up, catch_up_window=window)
    view = durable.schedules.state("w")
    assert view is not None and view.catch_up_window == timedelta(seconds=window)
    clock.advance(minutes=30)
    with caplog.at_level(logging.WARNING, logger="celery_durable.dispatcher"):
        durable.dispatcher().tick()
    got = sorted(r.due for r in durable.schedules.runs("w"))
    assert got == [T0 + timedelta(minutes=m) for m in runs]
    assert len(broker.ids()) == len(runs)
    from celery_durable.core.schedule_events import RunsMissed

    counted = [e.count for e in events_of(durable, "w", RunsMissed)]
    assert counted == ([dropped] if dropped else [])
    logged = [r for r in caplog.records if "dropped missed due times" in r.getMessage()]
    assert bool(logged) == bool(dropped)
