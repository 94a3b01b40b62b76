"""``beat_schedule`` under ``-S durable`` with a fake clock, against stock beat (SPEC B1–B8).

The scheduler runs in-process on a real journal and a real Redis broker; messages are read
raw from the queue. Where behaviour must match stock beat, Celery's own ``Scheduler`` sends
the same entry on the same app and the two messages are compared.
"""

from __future__ import annotations

import base64
import json
import logging
import zlib
from collections.abc import Callable, Iterator
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
from celery import Celery
from celery.beat import PersistentScheduler, ScheduleEntry, Scheduler
from celery.schedules import BaseSchedule, crontab, schedstate, schedule
from sqlalchemy import event as sa_event

from celery_durable import Durable, Every, parse_run_id
from celery_durable.beat import DurableScheduler
from celery_durable.core.ids import schedule_id_for_name
from celery_durable.core.rules import BeatEntry
from celery_durable.core.schedule_events import SchedulePaused
from celery_durable.importers.beat_schedule import REMOVED, import_beat_schedule
from tests.dispatch.test_dispatcher import Broker
from tests.support.clock import T0, FakeClock

UTC = timezone.utc


class EvenMinutes(BaseSchedule):
    """A custom schedule as projects write them: only ``is_due``, due in even minutes."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        now = self.now()
        if now.minute % 2 == 0 and (now - last_run_at) >= timedelta(minutes=1):
            return schedstate(True, 60.0)
        return schedstate(False, 10.0)

    def __repr__(self) -> str:
        return "<even minutes>"


class WeekdaysOnly(schedule):
    """A ``schedule`` subclass overriding ``is_due``: the interval, but never on weekends."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        if self.now().weekday() >= 5:
            return schedstate(False, 60.0)
        return super().is_due(last_run_at)


def make_app(redis_url: str, beat_schedule: dict[str, Any], **conf: Any) -> Celery:
    app = Celery("beat_import_tests", broker=redis_url, set_as_current=False)
    app.conf.update(broker_connection_retry_on_startup=False, beat_schedule=beat_schedule, **conf)

    @app.task(name="report", shared=False)
    def report(*args: Any, **kwargs: Any) -> None:  # pragma: no cover - tests read the queue
        return None

    return app


class Beat:
    """Starts ``DurableScheduler`` in-process on one journal, as ``celery beat`` would."""

    def __init__(self, redis_url: str, journal_url: str, clock: FakeClock) -> None:
        self.redis_url, self.journal_url, self.clock = redis_url, journal_url, clock
        self.schedulers: list[DurableScheduler] = []
        self.durable: Durable  # of the latest start

    def start(self, beat_schedule: dict[str, Any], **conf: Any) -> DurableScheduler:
        for old in self.schedulers:
            old.close()
        app = make_app(self.redis_url, beat_schedule, **conf)
        self.durable = Durable(app, self.journal_url, clock=self.clock)
        scheduler = DurableScheduler(app=app, lazy=False)
        self.schedulers.append(scheduler)
        return scheduler

    def close(self) -> None:
        for scheduler in self.schedulers:
            scheduler.close()


@pytest.fixture
def beat(redis_url: str, sqlite_url: str, clock: FakeClock) -> Iterator[Beat]:
    runner = Beat(redis_url, sqlite_url, clock)
    yield runner
    runner.close()


@pytest.fixture
def broker(redis_url: str) -> Broker:
    return Broker(redis_url)


def run_until(
    scheduler: DurableScheduler, clock: FakeClock, until: datetime, step: timedelta
) -> None:
    while clock.now < until:
        clock.set(min(clock.now + step, until))
        scheduler.tick()


def dues(messages: list[dict], sid: str) -> list[datetime]:
    found = [parse_run_id(m["headers"]["id"]) for m in messages]
    return [due for s, due in found if s == sid]


# B1 ---------------------------------------------------------------------------------------------


def test_a_bad_entry_is_refused_by_name_and_the_others_run(
    beat: Beat, broker: Broker, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "celery_durable.beat")
    scheduler = beat.start(
        {
            "good": {"task": "report", "schedule": 60.0, "args": [1]},
            "typo": {"task": "report", "schedule": 60.0, "kwarg": {}},
            "nothing": {"task": "report"},
            "objects": {"task": "report", "schedule": 60.0, "args": [object()]},
        }
    )
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("'typo'" in e and "unknown key 'kwarg'" in e for e in errors)
    assert any("'nothing'" in e and "'schedule' is missing" in e for e in errors)
    assert any("'objects'" in e and "args" in e for e in errors)
    run_until(scheduler, clock, T0 + timedelta(minutes=1), timedelta(seconds=30))
    messages = broker.take()
    assert [m["headers"]["task"] for m in messages] == ["report"]
    assert dues(messages, "good") == [T0 + timedelta(minutes=1)]


def test_a_name_that_breaks_s1_runs_under_its_mapped_id(
    beat: Beat, broker: Broker, clock: FakeClock
) -> None:
    name = "weekly ~ report\n"
    scheduler = beat.start({name: {"task": "report", "schedule": 10.0}})
    run_until(scheduler, clock, T0 + timedelta(seconds=10), timedelta(seconds=10))
    sid = schedule_id_for_name(name)
    assert sid.startswith("weekly-report-")
    assert dues(broker.take(), sid) == [T0 + timedelta(seconds=10)]


# B3 ---------------------------------------------------------------------------------------------


def stock_due_times(
    obj: BaseSchedule, clock: FakeClock, start: datetime, until: datetime, step: timedelta
) -> list[datetime]:
    """When stock beat sends an entry with this schedule, ticking at ``step``."""
    clock.set(start)
    entry = ScheduleEntry("x", "report", schedule=obj, last_run_at=start)
    sent: list[datetime] = []
    while clock.now < until:
        clock.set(min(clock.now + step, until))
        if entry.is_due().is_due:
            sent.append(clock.now)
            entry.last_run_at = clock.now
    return sent


FRIDAY = T0 + timedelta(days=4, minutes=37, seconds=10)  # Friday 2026-11-06 12:37:10 UTC


@pytest.mark.parametrize(
    ("name", "make", "days", "step"),
    [
        ("even", lambda clock: EvenMinutes(nowfun=clock), 0.1, 1),
        ("weekdays", lambda clock: WeekdaysOnly(timedelta(hours=5), nowfun=clock), 3.5, 20),
        ("relative", lambda clock: schedule(timedelta(hours=1), relative=True, nowfun=clock), 1, 7),
    ],
)
def test_a_schedule_object_is_due_when_it_says_as_stock_beat_asks_it(
    beat: Beat,
    broker: Broker,
    clock: FakeClock,
    name: str,
    make: Callable[[FakeClock], BaseSchedule],
    days: float,
    step: int,
) -> None:
    until, tick = FRIDAY + timedelta(days=days), timedelta(minutes=step)
    stock = stock_due_times(make(clock), clock, FRIDAY, until, tick)
    clock.set(FRIDAY)
    scheduler = beat.start({name: {"task": "report", "schedule": make(clock)}})
    view = beat.durable.schedules.state(name)
    assert view is not None and isinstance(view.rule, BeatEntry)
    run_until(scheduler, clock, until, tick)
    got = dues(broker.take(), name)
    assert len(got) == len(stock) >= 3
    if name == "relative":  # due on the hour, as the object says; stock sends at the tick after
        assert [due.minute for due in got] == [0] * len(got)
        assert all(s - tick < g <= s for g, s in zip(got, stock, strict=True))
    else:  # due when is_due says so: at the tick, as stock beat sends
        assert got == stock
    if name == "weekdays":
        assert all(due.weekday() < 5 for due in got)


def test_a_schedule_object_decision_is_stored_before_the_send(
    beat: Beat, broker: Broker, clock: FakeClock
) -> None:
    scheduler = beat.start({"even": {"task": "report", "schedule": EvenMinutes(nowfun=clock)}})
    run_until(scheduler, clock, T0 + timedelta(minutes=4), timedelta(minutes=1))
    runs = beat.durable.schedules.runs("even")
    sent = [m["headers"]["id"] for m in broker.take()]
    assert sorted(sent) == sorted(r.run_id for r in runs)
    assert {r.state for r in runs} == {"started"}


def test_a_schedule_object_catches_up_by_the_entry_policy(
    beat: Beat, broker: Broker, clock: FakeClock
) -> None:
    obj = schedule(timedelta(hours=1), relative=True, nowfun=clock)
    scheduler = beat.start(
        {"relative": {"task": "report", "schedule": obj, "options": {"catch_up": "all"}}}
    )
    clock.advance(hours=5, minutes=30)
    scheduler.tick()
    assert dues(broker.take(), "relative") == [T0 + timedelta(hours=h) for h in range(1, 6)]


class Broken(BaseSchedule):
    """A schedule object whose own code fails."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        raise RuntimeError("database unavailable")

    def __repr__(self) -> str:
        return "<broken>"


def test_a_schedule_object_that_raises_holds_back_only_its_own_entry(
    beat: Beat, broker: Broker, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = beat.start(
        {
            "broken": {"task": "report", "schedule": Broken(nowfun=clock)},
            "fine": {"task": "report", "schedule": 10.0},
        }
    )
    run_until(scheduler, clock, T0 + timedelta(seconds=30), timedelta(seconds=5))
    messages = broker.take()
    assert dues(messages, "fine") == [T0 + timedelta(seconds=s) for s in (10, 20, 30)]
    assert dues(messages, "broken") == []
    assert any("'broken'" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records)


# B4 ---------------------------------------------------------------------------------------------


def test_a_task_known_only_to_workers_is_sent_by_name_with_one_warning(
    beat: Beat, broker: Broker, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "celery_durable")
    scheduler = beat.start({"remote": {"task": "worker.only", "schedule": 10.0, "args": [7]}})
    run_until(scheduler, clock, T0 + timedelta(seconds=30), timedelta(seconds=5))
    messages = broker.take()
    assert [m["headers"]["task"] for m in messages] == ["worker.only"] * 3
    assert dues(messages, "remote") == [T0 + timedelta(seconds=s) for s in (10, 20, 30)]
    warnings = [r.getMessage() for r in caplog.records if "worker.only" in r.getMessage()]
    assert len(warnings) == 1 and "sent by name" in warnings[0]


# B5 ---------------------------------------------------------------------------------------------

OPTIONS: dict[str, Any] = {
    "queue": "reports",
    "exchange": "reports",
    "routing_key": "reports",
    "priority": 7,
    "headers": {"tenant": "acme"},
    "serializer": "json",
    "ignore_result": True,
    "time_limit": 30,
    "soft_time_limit": 20,
    "shadow": "report-shadow",
    "compression": "zlib",
    "delivery_mode": 1,
    "link": {"task": "report", "args": [], "kwargs": {}, "options": {}, "subtask_type": None},
}


def stock_message(app: Celery, broker: Broker, entry: dict[str, Any]) -> dict:
    """What stock beat puts on the queue for ``entry``."""
    scheduler = Scheduler(app=app, lazy=True)
    sched = ScheduleEntry("stock", app=app, **entry)
    scheduler.apply_async(sched, producer=scheduler.producer, advance=False)
    scheduler.close()
    (message,) = broker.take(entry.get("options", {}).get("queue", "celery"))
    return message


def comparable(message: dict) -> dict:
    """A message without what differs per send: ids, durable headers, delivery data."""
    headers = {
        k: v
        for k, v in message["headers"].items()
        if k not in ("id", "root_id", "correlation_id", "argsrepr", "kwargsrepr")
        and not k.startswith("durable_")
    }
    properties = {
        k: v
        for k, v in message["properties"].items()
        if k not in ("correlation_id", "delivery_tag", "delivery_info", "expiration")
    }
    body = message["body"]
    return {"headers": headers, "properties": properties, "body": body}


def test_every_option_reaches_the_message_as_stock_beat_sends_it(
    beat: Beat, broker: Broker, clock: FakeClock
) -> None:
    entry = {
        "task": "report",
        "schedule": 10.0,
        "args": (1, ("nested", 2)),
        "kwargs": {"n": 3},
        "options": dict(OPTIONS),
    }
    scheduler = beat.start({"opts": entry})
    run_until(scheduler, clock, T0 + timedelta(seconds=10), timedelta(seconds=10))
    (durable,) = broker.take("reports")
    stock = stock_message(scheduler.app, broker, entry)
    assert comparable(durable) == comparable(stock)
    assert durable["headers"]["celery_beat_task"] is True
    args, kwargs, _embed = json.loads(zlib.decompress(base64.b64decode(durable["body"])))
    assert args == [1, ["nested", 2]] and kwargs == {"n": 3}


def test_the_message_carries_the_beat_header(beat: Beat, broker: Broker, clock: FakeClock) -> None:
    scheduler = beat.start({"plain": {"task": "report", "schedule": 10.0}})
    run_until(scheduler, clock, T0 + timedelta(seconds=10), timedelta(seconds=10))
    (message,) = broker.take()
    assert message["headers"]["celery_beat_task"] is True


# B6 ---------------------------------------------------------------------------------------------


def pause_reasons(durable: Durable, sid: str) -> list[str | None]:
    events = durable.schedules.store.events(sid)
    return [e.reason for e in events if isinstance(e, SchedulePaused)]


def test_a_removed_entry_is_paused_and_resumes_when_put_back(
    beat: Beat, broker: Broker, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "celery_durable.beat")
    entries = {
        "keep": {"task": "report", "schedule": 10.0},
        "gone": {"task": "report", "schedule": 10.0},
    }
    beat.start(entries)
    beat.durable.schedules.create("runtime", "report", None, Every(timedelta(seconds=10)))
    beat.durable.schedules.create("held", "report", None, Every(timedelta(seconds=10)))
    beat.durable.schedules.pause("held")
    second = beat.start({"keep": entries["keep"]})
    durable = beat.durable
    gone = durable.schedules.state("gone")
    assert gone is not None and gone.paused
    assert pause_reasons(beat.durable, "gone") == [REMOVED]
    assert any("'gone'" in r.getMessage() and REMOVED in r.getMessage() for r in caplog.records)
    runtime = durable.schedules.state("runtime")
    assert runtime is not None and not runtime.paused
    run_until(second, clock, T0 + timedelta(seconds=20), timedelta(seconds=10))
    assert {parse_run_id(m["headers"]["id"])[0] for m in broker.take()} == {"keep", "runtime"}
    third = beat.start(entries)
    durable = beat.durable
    back = durable.schedules.state("gone")
    assert back is not None and not back.paused
    held = durable.schedules.state("held")
    assert held is not None and held.paused  # paused by a person, not by the import
    run_until(third, clock, T0 + timedelta(seconds=30), timedelta(seconds=10))
    assert dues(broker.take(), "gone") == [T0 + timedelta(seconds=30)]


# B7 ---------------------------------------------------------------------------------------------


def test_backend_cleanup_is_installed_when_stock_beat_installs_it(
    beat: Beat, tmp_path: Any
) -> None:
    with_db = beat.start({}, result_backend=f"db+sqlite:///{tmp_path / 'results.db'}")
    view = beat.durable.schedules.state("celery.backend_cleanup")
    assert view is not None and view.task == "celery.backend_cleanup"
    assert view.options["expires"] == 12 * 3600
    assert "celery.backend_cleanup" in stock_entries(with_db.app, tmp_path / "one")
    without = beat.start({}, result_expires=None)
    view = beat.durable.schedules.state("celery.backend_cleanup")
    assert view is not None and view.paused  # no longer installed: removed (B6)
    assert "celery.backend_cleanup" not in stock_entries(without.app, tmp_path / "two")


def stock_entries(app: Celery, path: Any) -> set[str]:
    """The entries stock beat (its default PersistentScheduler) runs for ``app``."""
    stock = PersistentScheduler(app=app, schedule_filename=str(path), lazy=False)
    try:
        return set(stock.schedule)
    finally:
        stock.close()


@pytest.mark.parametrize("deadline", [None, 600])
def test_beat_cron_starting_deadline_skips_a_missed_crontab_run_as_stock_beat(
    beat: Beat, broker: Broker, clock: FakeClock, deadline: int | None
) -> None:
    hourly = crontab(minute=0, nowfun=clock)
    stock = ScheduleEntry("x", "report", schedule=hourly, last_run_at=T0, app=None)
    entries = {"hourly": {"task": "report", "schedule": hourly}}
    scheduler = beat.start(entries, beat_cron_starting_deadline=deadline)
    stock.app = scheduler.app
    hourly.app = scheduler.app
    scheduler.tick()
    clock.set(T0 + timedelta(hours=3, minutes=30))  # beat was down: 13:00 to 15:00 missed
    stock_runs = stock.is_due().is_due
    scheduler.tick()
    clock.set(T0 + timedelta(hours=4, seconds=5))
    scheduler.tick()
    got = dues(broker.take(), "hourly")
    late = [T0 + timedelta(hours=3)] if stock_runs else []
    assert got == [*late, T0 + timedelta(hours=4)]
    assert stock_runs is (deadline is None)  # the oracle: Celery's own crontab.is_due


# B8 ---------------------------------------------------------------------------------------------


def test_an_interval_runs_one_interval_after_creation_and_keeps_its_grid_across_restarts(
    beat: Beat, broker: Broker, clock: FakeClock
) -> None:
    clock.set(T0 + timedelta(seconds=3.5))
    entries = {"grid": {"task": "report", "schedule": timedelta(seconds=10)}}
    first = beat.start(entries)
    run_until(first, clock, T0 + timedelta(seconds=25), timedelta(seconds=1))
    clock.advance(seconds=2)
    second = beat.start(entries)
    run_until(second, clock, T0 + timedelta(seconds=45), timedelta(seconds=1))
    got = dues(broker.take(), "grid")
    assert got == [T0 + timedelta(seconds=s) for s in (13.5, 23.5, 33.5, 43.5)]


# The BeatEntry rule --------------------------------------------------------------------------


def test_a_beat_entry_rule_round_trips_as_json_and_is_blind_without_its_object() -> None:
    from celery_durable.core.rules import rule_from_json

    rule = BeatEntry("orphan", "<even minutes>")
    assert rule_from_json(rule.to_json()) == rule
    assert rule.to_json()["type"] == "beat-entry"
    assert rule.next_after(T0) is None  # no beat here holds the entry's object
    assert "orphan" in str(rule)


def test_only_the_beat_that_imported_an_entry_asks_its_object(beat: Beat, clock: FakeClock) -> None:
    """B3: the schedule object lives in the beat's runtime, not in a process-wide registry:
    another client of the same journal in the same process sees no next due time."""
    beat.start({"even": {"task": "report", "schedule": EvenMinutes(nowfun=clock)}})
    mine = beat.durable.schedules.state("even")
    other = Durable(make_app(beat.redis_url, {}), beat.journal_url, clock=clock)
    theirs = other.schedules.state("even")
    assert mine is not None and theirs is not None
    assert mine.next_due is not None and theirs.next_due is None
    other.close()


def test_the_api_does_not_create_beat_entry_rules(beat: Beat) -> None:
    from celery_durable import InvalidSchedule

    beat.start({})
    durable = beat.durable
    with pytest.raises(InvalidSchedule, match="rule must be"):
        durable.schedules.create("x", "report", None, BeatEntry("x", "custom"))


def test_typed_values_reach_the_message_as_stock_beat_sends_them(
    beat: Beat, broker: Broker, clock: FakeClock
) -> None:
    when = datetime(2099, 1, 1, 12, 30, tzinfo=UTC)
    entry = {
        "task": "report",
        "schedule": 10.0,
        "args": (when, Decimal("1.10"), UUID(int=7), ("nested", (1, 2)), {3: "int key"}),
        "kwargs": {"day": date(2026, 11, 2), "at": time(9, 30)},
        "options": {"expires": when},
    }
    scheduler = beat.start({"typed": entry})
    run_until(scheduler, clock, T0 + timedelta(seconds=10), timedelta(seconds=10))
    (durable,) = broker.take()
    stock = stock_message(scheduler.app, broker, entry)
    assert comparable(durable) == comparable(stock)
    assert durable["headers"]["expires"] == when.isoformat()
    # The broker TTL: milliseconds from each send to `when`, so the sends' moments differ.
    ttl = int(durable["properties"]["expiration"]) - int(stock["properties"]["expiration"])
    assert abs(ttl) < 60_000


# D13 --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite_url", "pg_url"])
def test_the_import_reads_only_the_schedules_it_imported(
    backend: str, request: pytest.FixtureRequest, clock: FakeClock
) -> None:
    """Beat's start-up never reads every schedule (D13): with 300 schedules created through
    the API beside two ``beat_schedule`` entries, the import reads the rows of its own entries
    only. Every statement it issues on the real journal is recorded and run again to count
    the rows it read."""
    durable = Durable(make_app("memory://", {}), request.getfixturevalue(backend), clock=clock)
    entries = {
        "keep": {"task": "report", "schedule": 60.0},
        "gone": {"task": "report", "schedule": 60.0},
    }
    import_beat_schedule(durable, entries)
    others = 300
    for i in range(others):
        durable.schedules.create(f"api-{i}", "report", None, Every(timedelta(minutes=1)))
    dispatcher = durable.dispatcher()
    dispatcher.tick()  # the index rows of all 302 schedules, at the journal's head
    dispatcher.close()
    engine = durable.journal.engine
    statements: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append((statement, parameters))

    sa_event.listen(engine, "before_cursor_execute", record)
    try:
        report = import_beat_schedule(durable, {"keep": entries["keep"]})
    finally:
        sa_event.remove(engine, "before_cursor_execute", record)
    assert report.paused == ["gone"]
    read = {"celery_durable_schedule_index": 0, "celery_durable_events": 0}
    with engine.connect() as conn:
        for statement, parameters in statements:
            for table in read:
                if f"FROM {table}" in statement:
                    read[table] += len(conn.exec_driver_sql(statement, parameters).all())
    durable.close()
    rows = read["celery_durable_schedule_index"]
    assert rows <= 5 * len(entries), (
        f"the import read {rows} index rows for {len(entries)} beat_schedule entries "
        f"beside {others} other schedules (D13: only the schedules it imported)"
    )
    assert read["celery_durable_events"] <= 10 * len(entries), read


def test_beat_logs_the_import_only_when_it_stored_something_and_names_celerys_entry(
    beat: Beat, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A project without ``beat_schedule`` gets ``celery.backend_cleanup`` from Celery (B7):
    the first start says so, naming why; a start that changes nothing logs no import line."""
    caplog.set_level(logging.INFO, "celery_durable.beat")
    backend = {"result_backend": f"db+sqlite:///{tmp_path / 'results.db'}"}
    beat.start({}, **backend)
    first = [r.getMessage() for r in caplog.records if "beat_schedule" in r.getMessage()]
    assert len(first) == 1, first
    assert (
        "1 created (celery.backend_cleanup: installed by Celery because result_expires"
        in (first[0])
    )
    caplog.clear()
    beat.start({}, **backend)
    again = [r.getMessage() for r in caplog.records if "beat_schedule" in r.getMessage()]
    assert again == [], f"a start that changed nothing logged {again}"
    caplog.clear()
    beat.start({"nightly": {"task": "report", "schedule": 3600.0}}, **backend)
    added = [r.getMessage() for r in caplog.records if "beat_schedule" in r.getMessage()]
    assert added == ["durable scheduler: beat_schedule imported: 1 created (nightly)"], added
