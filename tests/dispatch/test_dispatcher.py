"""The dispatcher core with a fake clock and a real Redis broker (SPEC §4, §5).

What the dispatcher decides does not depend on the store: those tests (``durable``) run on a
memory store. What does (a restart reading the index, another process's writes, the lease, a
burst's writer thread, a failed round, a stream behind its index) runs on every store
(``any_durable``: memory, SQLite, PostgreSQL, MariaDB) or on every SQL database.
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from celery import Celery

from celery_durable import (
    CatchUp,
    Daily,
    Durable,
    Every,
    InvalidSchedule,
    Once,
    ScheduleConflict,
    Weekly,
)
from celery_durable.core.schedule_aggregate import DecideDue
from celery_durable.store.memory import MemoryStore
from tests.support.clock import T0, FakeClock
from tests.support.tcpproxy import TcpProxy, app_behind_proxy

UTC = timezone.utc
S = timedelta(seconds=1)


class Broker:
    """Reads what the dispatcher put on the Redis queue."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)

    def take(self, queue: str = "celery") -> list[dict]:
        """Pop every message of a queue, oldest first (also from kombu's priority sub-lists)."""
        subqueues = self.client.keys(queue + "\x06\x16*")
        names = [queue.encode(), *sorted(k for k in subqueues if self.client.type(k) == b"list")]
        messages = []
        for name in names:
            while (raw := self.client.rpop(name)) is not None:
                messages.append(json.loads(raw))
        return messages

    def ids(self, queue: str = "celery") -> list[str]:
        return [m["headers"]["id"] for m in self.take(queue)]


@pytest.fixture
def durable(app: Celery, clock: FakeClock) -> Iterator[Durable]:
    """A Durable on a memory store: the dispatcher's decisions need no database."""
    d = Durable(app, store=MemoryStore(), clock=clock)
    yield d
    d.close()


@pytest.fixture
def any_durable(make_durable: Callable[[], Durable]) -> Durable:
    """A Durable on each store (see ``make_durable``)."""
    return make_durable()


@pytest.fixture
def sql_durable(app: Celery, journal_url: str, clock: FakeClock) -> Iterator[Durable]:
    """A Durable on each SQL database."""
    d = Durable(app, journal_url, clock=clock)
    yield d
    d.close()


@pytest.fixture
def broker(redis_url: str) -> Broker:
    return Broker(redis_url)


def test_every_schedule_enqueues_consecutive_run_ids(
    any_durable: Durable, clock: FakeClock, broker: Broker
) -> None:
    any_durable.schedules.create("ping", "backup", "/srv", Every(timedelta(seconds=1)))
    dispatcher = any_durable.dispatcher()
    assert dispatcher.tick() <= 1.0
    ids = []
    for _ in range(3):
        clock.advance(seconds=1)
        dispatcher.tick()
        ids += broker.ids()
    assert ids == [
        "ping@2026-11-02T12:00:01.0000000Z",
        "ping@2026-11-02T12:00:02.0000000Z",
        "ping@2026-11-02T12:00:03.0000000Z",
    ]
    runs = any_durable.schedules.runs("ping")
    assert [r.run_id for r in runs] == list(reversed(ids))
    assert {r.state for r in runs} == {"started"}


def test_plain_task_message_is_what_stock_beat_sends(
    durable: Durable, clock: FakeClock, broker: Broker
) -> None:
    durable.schedules.create(
        "inv",
        "invoice",
        None,
        Every(timedelta(seconds=5)),
        args=["Ada"],
        kwargs={"amount": 3},
        queue="billing",
        priority=4,
    )
    dispatcher = durable.dispatcher()
    dispatcher.tick()
    clock.advance(seconds=5)
    dispatcher.tick()
    [message] = broker.take("billing")
    headers = message["headers"]
    assert headers["task"] == "invoice"
    assert headers["id"] == "inv@2026-11-02T12:00:05.0000000Z"
    assert headers["durable_schedule"] == "inv"
    assert headers["durable_due"] == "2026-11-02T12:00:05.0000000Z"
    import base64

    body = json.loads(base64.b64decode(message["body"]))
    assert body[0] == ["Ada"] and body[1] == {"amount": 3}
    assert message["properties"]["priority"] == 4


def test_input_is_the_single_argument_without_args_option(
    durable: Durable, clock: FakeClock, broker: Broker
) -> None:
    durable.schedules.create("b", "backup", "/srv", Every(timedelta(seconds=5)))
    d = durable.dispatcher()
    d.tick()
    clock.advance(seconds=5)
    d.tick()
    import base64

    [message] = broker.take()
    assert json.loads(base64.b64decode(message["body"]))[0] == ["/srv"]


def test_c1_latest_three_nights_off_one_backup(
    durable: Durable, clock: FakeClock, broker: Broker
) -> None:
    durable.schedules.create("nightly", "backup", "/srv", Daily("02:00", "Europe/Oslo"))
    clock.set(datetime(2026, 11, 5, 9, tzinfo=UTC))
    durable.dispatcher().tick()
    assert broker.ids() == ["nightly@2026-11-05T01:00:00.0000000Z"]


def test_c2_all_two_mondays_off_two_invoices_oldest_first(
    durable: Durable, clock: FakeClock, broker: Broker
) -> None:
    durable.schedules.create(
        "inv", "invoice", "Ada", Weekly(["mon"], "08:00", "Europe/Oslo"), CatchUp.ALL
    )
    clock.set(datetime(2026, 11, 17, 12, tzinfo=UTC))
    durable.dispatcher().tick()
    assert broker.ids() == ["inv@2026-11-09T07:00:00.0000000Z", "inv@2026-11-16T07:00:00.0000000Z"]


def test_c2_all_keeps_the_1000_most_recent(
    any_durable: Durable, clock: FakeClock, broker: Broker
) -> None:
    any_durable.schedules.create("fast", "backup", "/srv", Every(timedelta(seconds=1)), CatchUp.ALL)
    clock.advance(seconds=1234)
    any_durable.dispatcher().tick()
    ids = broker.ids()
    assert len(ids) == 1000
    assert ids[0] == "fast@2026-11-02T12:03:55.0000000Z"
    assert ids[-1] == "fast@2026-11-02T12:20:34.0000000Z"


def test_c3_none_only_on_time(durable: Durable, clock: FakeClock, broker: Broker) -> None:
    durable.schedules.create("n", "backup", "/srv", Every(timedelta(seconds=45)), CatchUp.NONE)
    clock.advance(seconds=600)
    durable.dispatcher().tick()
    # 585 s (15 s late) is on time; 540 s (60 s late) too; 495 s is missed.
    assert broker.ids() == ["n@2026-11-02T12:09:00.0000000Z", "n@2026-11-02T12:09:45.0000000Z"]


def test_a2_change_drops_due_times_before_it(
    durable: Durable, clock: FakeClock, broker: Broker
) -> None:
    durable.schedules.create("c", "backup", "a", Every(timedelta(seconds=10)), CatchUp.ALL)
    clock.advance(seconds=35)
    durable.schedules.change("c", "backup", "b", Every(timedelta(seconds=10)), CatchUp.ALL)
    d = durable.dispatcher()
    d.tick()
    assert broker.ids() == []
    clock.advance(seconds=10)
    d.tick()
    assert broker.ids() == ["c@2026-11-02T12:00:45.0000000Z"]


def test_a3_pause_and_resume(durable: Durable, clock: FakeClock, broker: Broker) -> None:
    durable.schedules.create("p", "backup", "/srv", Every(timedelta(seconds=10)), CatchUp.ALL)
    d = durable.dispatcher()
    durable.schedules.pause("p")
    clock.advance(seconds=50)
    d.tick()
    assert broker.ids() == []
    durable.schedules.resume("p")
    d.tick()
    assert broker.ids() == []
    clock.advance(seconds=10)
    d.tick()
    assert broker.ids() == ["p@2026-11-02T12:01:00.0000000Z"]


def test_a4_deleted_runs_nothing_more(durable: Durable, clock: FakeClock, broker: Broker) -> None:
    durable.schedules.create("d", "backup", "/srv", Every(timedelta(seconds=10)))
    d = durable.dispatcher()
    clock.advance(seconds=10)
    d.tick()
    assert len(broker.ids()) == 1
    durable.schedules.delete("d")
    clock.advance(seconds=60)
    d.tick()
    assert broker.ids() == []


def test_r5_once_in_the_past_runs_at_next_tick(
    durable: Durable, clock: FakeClock, broker: Broker
) -> None:
    durable.schedules.create("o", "backup", "/srv", Once(T0 - timedelta(days=2)), CatchUp.NONE)
    d = durable.dispatcher()
    d.tick()
    assert broker.ids() == ["o@2026-10-31T12:00:00.0000000Z"]
    clock.advance(days=1)
    d.tick()
    assert broker.ids() == []


def test_r6_max_runs_and_end_at(durable: Durable, clock: FakeClock, broker: Broker) -> None:
    durable.schedules.create("m", "backup", "/srv", Every(timedelta(seconds=2), max_runs=3))
    durable.schedules.create(
        "e", "backup", "/srv", Every(timedelta(seconds=2), end_at=T0 + timedelta(seconds=5))
    )
    d = durable.dispatcher()
    seen = []
    for _ in range(6):
        clock.advance(seconds=2)
        d.tick()
        seen += broker.ids()
    assert sorted(seen) == sorted(
        [f"m@2026-11-02T12:00:0{s}.0000000Z" for s in (2, 4, 6)]
        + [f"e@2026-11-02T12:00:0{s}.0000000Z" for s in (2, 4)]
    )
    view = durable.schedules.state("m")
    assert view is not None and view.next_due is None


def test_a6_decided_but_not_started_is_enqueued_after_restart(
    any_durable: Durable, clock: FakeClock, broker: Broker
) -> None:
    any_durable.schedules.create("a6", "backup", "/srv", Every(timedelta(seconds=10)))
    clock.advance(seconds=10)
    # A dispatcher that crashed after storing the decision: decide and append, send nothing.
    state = any_durable._store.load("a6")
    any_durable._store.execute("a6", lambda now: DecideDue(now=now))
    assert broker.ids() == []
    assert state.version == 1
    assert [r.state for r in any_durable.schedules.runs("a6")] == ["decided"]
    any_durable.dispatcher().tick()
    assert broker.ids() == ["a6@2026-11-02T12:00:10.0000000Z"]
    assert [r.state for r in any_durable.schedules.runs("a6")] == ["started"]


def test_d3_sleep_until_earliest_due_capped_by_poll(durable: Durable, clock: FakeClock) -> None:
    durable.schedules.create("slow", "backup", "/srv", Every(timedelta(minutes=10)))
    d = durable.dispatcher(poll_interval=30)
    assert d.tick() == 30
    clock.set(T0 + timedelta(minutes=9, seconds=50))
    assert d.tick() == pytest.approx(10)


def test_d3_sees_a_schedule_created_by_another_process_at_the_next_tick(
    make_durable: Callable[[], Durable], broker: Broker
) -> None:
    d = make_durable().dispatcher()
    d.tick()
    other = make_durable()
    other.schedules.create("late", "backup", "/srv", Once(T0))
    d.tick()
    assert broker.ids() == ["late@2026-11-02T12:00:00.0000000Z"]


def test_d4_unregistered_task_logs_at_each_due_time_and_catches_up(
    durable: Durable,
    app: Celery,
    clock: FakeClock,
    broker: Broker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    durable.schedules.create("gone", "backup", "/srv", Every(timedelta(seconds=10)), CatchUp.ALL)
    task = app.tasks.pop("backup")
    d = durable.dispatcher()
    with caplog.at_level(logging.ERROR, logger="celery_durable.dispatcher"):
        for _ in range(3):
            clock.advance(seconds=10)
            d.tick()
            d.tick()
    errors = [r for r in caplog.records if "not registered" in r.getMessage()]
    assert len(errors) == 3
    assert all("gone" in r.getMessage() and "backup" in r.getMessage() for r in errors)
    assert broker.ids() == []
    assert durable.schedules.runs("gone") == []
    app.tasks["backup"] = task
    clock.advance(seconds=1)
    d.tick()
    assert len(broker.ids()) == 3  # CatchUp.ALL: the three due times missed while it was gone


def test_d5_run_that_cannot_be_enqueued_is_recorded_and_the_schedule_goes_on(
    durable: Durable, clock: FakeClock, broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    # invoice(customer, amount=0) takes the stored args; then a deploy changes its signature:
    # the stored arguments can never fit the task that runs now.
    durable.schedules.create("bad", "invoice", None, Every(timedelta(seconds=10)), args=[1, 2])
    del durable.app.tasks["invoice"]

    @durable.app.task(name="invoice", shared=False)
    def invoice(customer: str) -> str:  # pragma: no cover - never enqueued
        return customer

    d = durable.dispatcher()
    with caplog.at_level(logging.ERROR, logger="celery_durable.dispatcher"):
        clock.advance(seconds=10)
        d.tick()
        d.tick()
    assert broker.ids() == []
    [run] = durable.schedules.runs("bad")
    assert run.state == "failed_to_start" and "TypeError" in (run.error or "")
    assert len([r for r in caplog.records if "can never be enqueued" in r.getMessage()]) == 1
    view = durable.schedules.state("bad")
    assert view is not None and view.next_due == T0 + timedelta(seconds=20)


def test_an_expiry_no_date_can_hold_is_refused_and_a_stored_one_fails_alone(
    durable: Durable,
    clock: FakeClock,
    broker: Broker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """D5, D12: ``expires=1e300`` is refused when the schedule is created; one stored before
    that check makes Celery's message builder overflow: that run fails to start, and the
    other schedules' runs of the same round are sent (they were all held back, retried
    every 5 s as if the broker were away)."""
    from celery_durable import InvalidSchedule, schedules

    with pytest.raises(InvalidSchedule, match="option 'expires'"):
        durable.schedules.create(
            "far", "backup", "/srv", Every(timedelta(seconds=10)), expires=1e300
        )
    monkeypatch.setattr(schedules, "MAX_OPTION_SECONDS", float("inf"))  # stored before
    durable.schedules.create("good", "backup", "/srv", Every(timedelta(seconds=10)))
    durable.schedules.create("far", "backup", "/srv", Every(timedelta(seconds=10)), expires=1e300)
    d = durable.dispatcher()
    clock.advance(seconds=10)
    d.tick()
    assert broker.ids() == ["good@2026-11-02T12:00:10.0000000Z"]
    [run] = durable.schedules.runs("far")
    assert run.state == "failed_to_start" and "OverflowError" in (run.error or "")


def test_broker_down_keeps_the_run_and_retries(
    clock: FakeClock,
    broker: Broker,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app, proxy = app_behind_proxy(redis_url, "outage")
    app.conf.broker_connection_timeout = 1
    durable = Durable(app, store=MemoryStore(), clock=clock)
    try:
        durable.schedules.create("r", "backup", "/srv", Every(timedelta(seconds=10)))
        durable.schedules.create("ok", "backup", "/srv", Every(timedelta(seconds=10)))
        d = durable.dispatcher()
        d.tick()
        proxy.cut()
        with caplog.at_level(logging.ERROR, logger="celery_durable.dispatcher"):
            for _ in range(3):
                clock.advance(seconds=10)
                assert d.tick() <= 5
        assert {r.state for r in durable.schedules.runs("r")} == {"decided"}
        assert len(durable.schedules.runs("r")) == 3
        # Logged once per outage, not once per tick.
        assert len([r for r in caplog.records if "cannot enqueue" in r.getMessage()]) == 1
        proxy.restore()
        clock.advance(seconds=2)
        d.tick()
        assert broker.ids() == []  # retried after min(check interval, 5 s), not before
        clock.advance(seconds=3)
        d.tick()
        ids = sorted(broker.ids())
        assert len(ids) == 6 and len(set(ids)) == 6
        assert {r.state for r in durable.schedules.runs("r")} == {"started"}
    finally:
        durable.close()
        proxy.cut()


def test_two_dispatchers_one_leader(
    make_durable: Callable[[], Durable], clock: FakeClock, broker: Broker
) -> None:
    durable = make_durable()
    durable.schedules.create("x", "backup", "/srv", Every(timedelta(seconds=1)))
    first = durable.dispatcher(owner="first")
    second = make_durable().dispatcher(owner="second")
    seen = []
    for step in range(30):
        clock.advance(seconds=1)
        if step < 15:
            first.tick()
        second.tick()
        seen += broker.ids()
    # The first stops at step 15; the second takes over once the 10 s lease has expired.
    assert len(seen) == len(set(seen))
    assert seen[:15] == [
        f"x@{(T0 + timedelta(seconds=s)).strftime('%Y-%m-%dT%H:%M:%S')}.0000000Z"
        for s in range(1, 16)
    ]
    assert len(seen) >= 15 + 5


def test_d9_trigger_starts_one_run_now_outside_the_rule(
    durable: Durable, clock: FakeClock, broker: Broker
) -> None:
    durable.schedules.create("t", "backup", "/srv", Daily("02:00", "Europe/Oslo"))
    d = durable.dispatcher()
    d.tick()
    clock.advance(seconds=7)
    run = durable.schedules.trigger("t")
    assert run == "t@2026-11-02T12:00:07.0000000Z"
    d.tick()
    assert broker.ids() == [run]
    view = durable.schedules.state("t")
    assert view is not None and view.next_due == datetime(2026, 11, 3, 1, tzinfo=UTC)
    assert [r.reason for r in durable.schedules.runs("t")] == ["trigger"]


def test_d9_backfill_decides_missing_due_times_once(
    durable: Durable, clock: FakeClock, broker: Broker
) -> None:
    durable.schedules.create("nightly", "backup", "/srv", Daily("02:00", "Europe/Oslo"))
    clock.set(datetime(2026, 11, 5, 9, tzinfo=UTC))
    d = durable.dispatcher()
    d.tick()
    assert broker.ids() == ["nightly@2026-11-05T01:00:00.0000000Z"]
    start, end = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 30, tzinfo=UTC)
    decided = durable.schedules.backfill("nightly", start, end)
    # 11-02 01:00 is before the creation (T0 is 11-02 12:00) but inside the range: it is a due
    # time of the rule, so it is backfilled too. 11-05 was decided already; later ones are not
    # the rule's past yet.
    assert decided == [
        "nightly@2026-11-01T01:00:00.0000000Z",
        "nightly@2026-11-02T01:00:00.0000000Z",
        "nightly@2026-11-03T01:00:00.0000000Z",
        "nightly@2026-11-04T01:00:00.0000000Z",
    ]
    assert durable.schedules.backfill("nightly", start, end) == []
    d.tick()
    assert broker.ids() == decided
    with pytest.raises(InvalidSchedule):
        durable.schedules.backfill("nightly", end, start)
    with pytest.raises(ScheduleConflict):
        durable.schedules.backfill("unknown", start, end)


# -- bursts: rounds of CHUNK schedules, the starts of one stored while the next is sent --------


def _runs_by_type(durable: Durable) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for event in durable.journal.read_all(0, category="schedule"):
        if event.type in ("RunDecided", "RunStarted"):
            sid = event.stream.split("/", 1)[1]
            found.setdefault(event.type, []).append(f"{sid}@{event.data['due']}")
    return found


def test_a_burst_of_several_rounds_decides_sends_and_records_each_run_once(
    any_durable: Durable, clock: FakeClock, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatcher = _burst_in_rounds(any_durable, monkeypatch, 130)  # rounds of 40, 40, 40, 10
    clock.advance(seconds=61)
    collector = gc.get_threshold(), gc.get_freeze_count()
    dispatcher.tick()
    assert (gc.get_threshold(), gc.get_freeze_count()) == collector, "the collector restored"
    ids = broker.ids()
    assert len(ids) == len(set(ids)) == 130
    assert dispatcher._writer is not None, "the rounds' starts were not stored in the background"
    runs = _runs_by_type(any_durable)
    assert sorted(runs["RunDecided"]) == sorted(runs["RunStarted"])
    assert len(runs["RunStarted"]) == len(set(runs["RunStarted"])) == 130
    clock.advance(seconds=1)
    dispatcher.tick()
    assert broker.ids() == []
    assert dispatcher.next_attention == T0 + timedelta(minutes=2)  # nothing left over
    dispatcher.close()


def _burst_in_rounds(durable: Durable, monkeypatch: pytest.MonkeyPatch, count: int) -> Any:
    """``count`` schedules of ``Every(1 min)``, dispatched in rounds of 40, and a dispatcher
    that has ticked once (their first due time is a minute later)."""
    monkeypatch.setattr("celery_durable.dispatch.dispatcher.CHUNK", 40)
    for i in range(count):
        durable.schedules.create(f"b{i:03d}", "backup", f"/srv/{i}", Every(timedelta(minutes=1)))
    dispatcher = durable.dispatcher()
    dispatcher.tick()
    return dispatcher


def _burst_of_100_whose_second_append_fails(
    durable: Durable, monkeypatch: pytest.MonkeyPatch, event_type: str
) -> Any:
    """100 schedules due in rounds of 40, and a dispatcher whose journal fails the second
    append of ``event_type`` events (a round's decisions or starts) once."""
    from celery_durable.store.memory import MemoryUnitOfWork
    from celery_durable.store.sql_store import SqlStore, SqlUnitOfWork

    dispatcher = _burst_in_rounds(durable, monkeypatch, 100)
    unit_class = SqlUnitOfWork if isinstance(durable.runtime.store, SqlStore) else MemoryUnitOfWork
    real = unit_class.append
    calls = 0

    def failing_once(unit, appends):  # type: ignore[no-untyped-def]
        nonlocal calls
        if any(e.type == event_type for a in appends for e in a.events):
            calls += 1
            if calls == 2:
                raise ConnectionError("journal connection lost")
        return real(unit, appends)

    monkeypatch.setattr(unit_class, "append", failing_once)
    return dispatcher


def test_a_round_whose_starts_cannot_be_stored_is_sent_again_after_the_failure(
    any_durable: Durable, clock: FakeClock, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal fails while the writer stores a round's starts: the tick raises, every run
    stays decided, and the next tick enqueues the unrecorded ones again with the same IDs."""
    dispatcher = _burst_of_100_whose_second_append_fails(any_durable, monkeypatch, "RunStarted")
    clock.advance(seconds=61)
    collector = gc.get_threshold(), gc.get_freeze_count()
    with pytest.raises(ConnectionError):
        dispatcher.tick()
    assert (gc.get_threshold(), gc.get_freeze_count()) == collector, "the collector restored"
    first = broker.ids()
    runs = _runs_by_type(any_durable)
    assert len(runs["RunDecided"]) == len(set(runs["RunDecided"]))
    unrecorded = set(runs["RunDecided"]) - set(runs["RunStarted"])
    assert unrecorded, "the failed round's starts should be missing"
    clock.advance(seconds=1)
    dispatcher.tick()
    again = broker.ids()
    runs = _runs_by_type(any_durable)
    assert len(runs["RunDecided"]) == len(set(runs["RunDecided"])) == 100
    assert sorted(runs["RunStarted"]) == sorted(runs["RunDecided"])
    assert set(first) | set(again) == _run_ids(runs)
    assert set(again) == {_run_id(r) for r in unrecorded}  # same IDs, only the unrecorded
    dispatcher.close()


def test_each_round_of_a_burst_is_decided_and_stored_before_any_of_its_runs_is_sent(
    any_durable: Durable, clock: FakeClock, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A6 in a burst: when a round's messages go out, every run among them is decided in
    the journal already (while the round before is being recorded in the background)."""
    from celery_durable.dispatch.publisher import Publisher

    dispatcher = _burst_in_rounds(any_durable, monkeypatch, 130)  # rounds of 40, 40, 40, 10
    sent_rounds: list[int] = []
    undecided_when_sent: list[str] = []
    real_send = Publisher.send

    def send(self, runs, now, *, batch_size):  # type: ignore[no-untyped-def]
        decided = {_run_id(r) for r in _runs_by_type(any_durable).get("RunDecided", [])}
        undecided_when_sent.extend(p.run_id for _, p in runs if p.run_id not in decided)
        sent_rounds.append(len(runs))
        return real_send(self, runs, now, batch_size=batch_size)

    monkeypatch.setattr(Publisher, "send", send)
    clock.advance(seconds=61)
    dispatcher.tick()
    assert sent_rounds == [40, 40, 40, 10]
    assert undecided_when_sent == [], "a run was sent before its decision was stored"
    ids = broker.ids()
    assert len(ids) == len(set(ids)) == 130
    runs = _runs_by_type(any_durable)
    assert sorted(runs["RunDecided"]) == sorted(runs["RunStarted"])
    dispatcher.close()


def test_a_bursts_round_whose_decisions_cannot_be_stored_is_not_sent_until_they_are(
    any_durable: Durable, clock: FakeClock, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal fails while the writer stores the next round's decisions: the tick raises,
    none of that round is sent, the round before it is sent and recorded once, and the next
    tick decides and sends the rest."""
    dispatcher = _burst_of_100_whose_second_append_fails(any_durable, monkeypatch, "RunDecided")
    clock.advance(seconds=61)
    with pytest.raises(ConnectionError):
        dispatcher.tick()
    first = broker.ids()
    runs = _runs_by_type(any_durable)
    assert len(first) == len(runs["RunDecided"]) == 40, "only the first round was decided"
    assert set(first) == _run_ids(runs)
    assert sorted(runs["RunStarted"]) == sorted(runs["RunDecided"])
    clock.advance(seconds=1)
    dispatcher.tick()
    again = broker.ids()
    assert len(again) == 60 and not set(again) & set(first)
    runs = _runs_by_type(any_durable)
    assert len(runs["RunDecided"]) == len(set(runs["RunDecided"])) == 100
    assert sorted(runs["RunStarted"]) == sorted(runs["RunDecided"])
    dispatcher.close()


def _run_id(decided: str) -> str:
    sid, due = decided.split("@", 1)
    from celery_durable.core.codec import time_from_json
    from celery_durable.core.ids import run_id

    return run_id(sid, time_from_json(due))


def _run_ids(runs: dict[str, list[str]]) -> set[str]:
    return {_run_id(r) for r in runs["RunDecided"]}


def test_a_tick_does_not_stall_while_the_broker_refuses_connections(
    clock: FakeClock, broker: Broker, redis_url: str
) -> None:
    """D3 with Celery's default broker_connection_timeout (4 s, retried with 2 s sleeps): the
    dispatcher tries each broker host once per round and moves on."""
    import time

    parts = urlsplit(redis_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 6379)
    proxy.restore()
    app = Celery(
        "stall", broker=f"redis://127.0.0.1:{proxy.port}{parts.path}", set_as_current=False
    )
    app.conf.broker_connection_retry_on_startup = False
    assert app.conf.broker_connection_timeout == 4.0

    @app.task(name="backup", shared=False)
    def backup(folder: str) -> str:  # pragma: no cover - the test reads the queue
        return folder

    durable = Durable(app, store=MemoryStore(), clock=clock)
    try:
        for i in range(3):
            durable.schedules.create(f"s{i}", "backup", "/srv", Every(timedelta(seconds=10)))
        d = durable.dispatcher()
        d.tick()
        proxy.cut()
        for _ in range(3):
            clock.advance(seconds=10)
            started = time.monotonic()
            d.tick()
            assert time.monotonic() - started < 2.0, "the tick waited for the broker"
        assert len(durable.schedules.runs("s0")) == 3  # decided on time all the same
        proxy.restore()
        clock.advance(seconds=5)
        d.tick()
        ids = broker.ids()
        assert len(ids) == len(set(ids)) == 9
    finally:
        durable.close()
        proxy.cut()


@pytest.mark.timeout(60)
def test_a_schedule_whose_stream_is_behind_its_index_row_does_not_hang_the_tick(
    sql_durable: Durable,
    clock: FakeClock,
    broker: Broker,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A journal restored from a backup older than its index: the index row of "behind" folds
    events its stream no longer holds, so every append at the row's version conflicts. The
    tick leaves that schedule out after the conflict limit with one ERROR line naming the
    rebuild, sends the other schedule's run, and looks at "behind" again at the next tick."""
    import sqlalchemy as sa

    from celery_durable.store import conflicts
    from celery_durable.store.journal.schema import events

    monkeypatch.setattr(conflicts.time, "sleep", lambda _s: None)  # the back-off is not tested here

    sql_durable.schedules.create("behind", "backup", "/srv/a", Every(timedelta(seconds=10)))
    sql_durable.schedules.create("fine", "backup", "/srv/b", Every(timedelta(seconds=10)))
    first = sql_durable.dispatcher()
    for _ in range(3):
        clock.advance(seconds=10)
        first.tick()
    first.close()  # the index rows of both are at their streams' versions
    broker.take()
    # created, then 3 × (decided, started)
    assert sql_durable.index.load(["behind"])["behind"].version == 7
    with sql_durable.journal.engine.begin() as conn:  # the backup lacks the last two events
        conn.execute(
            sa.delete(events).where(events.c.stream == "schedule/behind", events.c.version > 5)
        )
    dispatcher = sql_durable.dispatcher()
    clock.advance(seconds=10)
    with caplog.at_level(logging.ERROR, logger="celery_durable.dispatcher"):
        dispatcher.tick()
    assert broker.ids() == ["fine@2026-11-02T12:00:40.0000000Z"]
    gave_up = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(gave_up) == 1 and "'behind'" in gave_up[0], gave_up
    assert "celery durable index rebuild" in gave_up[0]
    caplog.clear()
    clock.advance(seconds=10)
    with caplog.at_level(logging.ERROR, logger="celery_durable.dispatcher"):
        dispatcher.tick()  # "behind" was not dropped: it is decided (and refused) again
    assert broker.ids() == ["fine@2026-11-02T12:00:50.0000000Z"]
    assert ["'behind'" in r.getMessage() for r in caplog.records] == [True]
    dispatcher.close()
