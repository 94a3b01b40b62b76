"""``durable.schedules`` on real journals (SQLite file and PostgreSQL): SPEC §3, §7, §8."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import datetime, time, timedelta, timezone

import pytest
from celery import Celery

from celery_durable import (
    CatchUp,
    Cron,
    Crontab,
    Daily,
    Durable,
    DurableError,
    Every,
    InvalidSchedule,
    Once,
    Overlap,
    ScheduleConflict,
    Solar,
    UnknownTask,
    Weekly,
)
from celery_durable.errors import SolarUnavailable
from celery_durable.store.memory import MemoryStore
from tests.core.test_solar import celery_next as solar_next
from tests.support.clock import T0, FakeClock

UTC = timezone.utc


@pytest.fixture
def app() -> Celery:
    app = Celery("api_tests", broker="memory://", set_as_current=False)

    @app.task(name="backup", shared=False)
    def backup(folder: str = "/srv") -> str:  # pragma: no cover - never run here
        return folder

    return app


@pytest.fixture
def durable(app: Celery, clock: FakeClock) -> Iterator[Durable]:
    """The API's checks and decisions need no database: a Durable on a memory store."""
    d = Durable(app, store=MemoryStore(), clock=clock)
    yield d
    d.close()


@pytest.fixture
def sql_durable(app: Celery, journal_url: str, clock: FakeClock) -> Iterator[Durable]:
    """A Durable on each SQL database, for what is stored and read back."""
    d = Durable(app, journal_url, clock=clock)
    yield d
    d.close()


@pytest.fixture(params=["memory", "sqlite", "postgres", "mysql"])
def any_durable(request: pytest.FixtureRequest, app: Celery, clock: FakeClock) -> Iterator[Durable]:
    """The memory store and each SQL database."""
    url = None
    if request.param != "memory":
        fixture = {"sqlite": "sqlite_url", "postgres": "pg_url", "mysql": "mysql_url"}
        url = str(request.getfixturevalue(fixture[request.param]))
    d = Durable(app, url, clock=clock, store=MemoryStore() if url is None else None)
    yield d
    d.close()


def stored_events(durable: Durable) -> int:
    return durable.journal.head()


def test_create_then_state(any_durable: Durable) -> None:
    any_durable.schedules.create("nightly", "backup", "/srv", Daily(time(2), "Europe/Oslo"))
    view = any_durable.schedules.state("nightly")
    assert view is not None
    assert (view.id, view.task, view.input) == ("nightly", "backup", "/srv")
    assert view.rule == Daily("02:00", "Europe/Oslo")
    assert view.catch_up is CatchUp.LATEST
    assert view.overlap is Overlap.ALLOW
    assert not view.paused and not view.deleted
    assert view.anchor == T0
    assert view.next_due == datetime(2026, 11, 3, 1, tzinfo=UTC)
    assert any_durable.schedules.state("missing") is None


def test_create_with_task_object_and_options(durable: Durable, app: Celery) -> None:
    task = app.tasks["backup"]
    durable.schedules.create(
        "q",
        task,
        "/srv",
        Every(timedelta(minutes=5)),
        CatchUp.ALL,
        queue="slow",
        priority=3,
        overlap="skip",
    )
    view = durable.schedules.state("q")
    assert view is not None
    assert view.options == {"queue": "slow", "priority": 3}
    assert view.catch_up is CatchUp.ALL
    assert view.overlap is Overlap.SKIP


def test_a1_repeated_create_is_idempotent_and_other_content_conflicts(any_durable: Durable) -> None:
    rule = Weekly(["thu", "mon"], "08:00", "Europe/Oslo")
    any_durable.schedules.create("w", "backup", {"c": "Ada"}, rule, CatchUp.ALL)
    head = stored_events(any_durable)
    any_durable.schedules.create(
        "w", "backup", {"c": "Ada"}, Weekly(["mon", "thu"], "08:00", "Europe/Oslo"), "all"
    )
    assert stored_events(any_durable) == head
    with pytest.raises(ScheduleConflict):
        any_durable.schedules.create("w", "backup", {"c": "Bob"}, rule, CatchUp.ALL)
    assert stored_events(any_durable) == head


def test_a2_change_replaces_everything(any_durable: Durable, clock: FakeClock) -> None:
    any_durable.schedules.create("e", "backup", "a", Every(timedelta(seconds=10)))
    clock.advance(seconds=3)
    any_durable.schedules.change("e", "backup", "b", Every(timedelta(seconds=7)), CatchUp.NONE)
    view = any_durable.schedules.state("e")
    assert view is not None
    assert view.input == "b" and view.catch_up is CatchUp.NONE
    assert view.anchor == T0 + timedelta(seconds=3)
    assert view.next_due == T0 + timedelta(seconds=10)
    head = stored_events(any_durable)
    any_durable.schedules.change("e", "backup", "b", Every(timedelta(seconds=7)), CatchUp.NONE)
    assert stored_events(any_durable) == head
    with pytest.raises(ScheduleConflict):
        any_durable.schedules.change("nope", "backup", "b", Every(timedelta(seconds=7)))


def test_a3_pause_resume(durable: Durable, clock: FakeClock) -> None:
    durable.schedules.create("n", "backup", "/srv", Daily("02:00", "Europe/Oslo"))
    durable.schedules.pause("n")
    durable.schedules.pause("n")
    view = durable.schedules.state("n")
    assert view is not None and view.paused and view.next_due is None
    clock.advance(days=3)
    durable.schedules.resume("n")
    view = durable.schedules.state("n")
    assert view is not None and not view.paused
    assert view.next_due == datetime(2026, 11, 6, 1, tzinfo=UTC)
    with pytest.raises(ScheduleConflict):
        durable.schedules.resume("n")
    with pytest.raises(ScheduleConflict):
        durable.schedules.pause("unknown")


def test_a4_delete(durable: Durable) -> None:
    durable.schedules.create("d", "backup", None, Every(timedelta(minutes=1)))
    durable.schedules.delete("d")
    durable.schedules.delete("d")
    view = durable.schedules.state("d")
    assert view is not None and view.deleted and view.next_due is None
    with pytest.raises(ScheduleConflict):
        durable.schedules.create("d", "backup", None, Every(timedelta(minutes=1)))
    with pytest.raises(ScheduleConflict):
        durable.schedules.delete("never")
    assert [v.id for v in durable.schedules.list()] == []
    assert [v.id for v in durable.schedules.list(include_deleted=True)] == ["d"]


def test_a7_unknown_task_is_refused_before_storing(durable: Durable) -> None:
    with pytest.raises(UnknownTask, match="not registered"):
        durable.schedules.create("x", "no.such.task", None, Every(timedelta(minutes=1)))
    with pytest.raises(LookupError):
        durable.schedules.create("x", "no.such.task", None, Every(timedelta(minutes=1)))
    assert durable.schedules.state("x") is None
    assert stored_events(durable) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"id": "a~b"}, "schedule ID must not contain '~'"),
        ({"id": ""}, "schedule ID must not be blank"),
        ({"rule": None}, "rule is missing"),
        ({"rule": "daily"}, "rule must be"),
        ({"catch_up": None}, "catch_up is missing"),
        ({"catch_up": "sometimes"}, "catch_up must be one of"),
        ({"input": (1, 2)}, "JSON round trip"),
        ({"input": {1: "x"}}, "JSON round trip"),
        ({"input": float("nan")}, "JSON round trip"),
        ({"input": {"x": object()}}, "JSON round trip"),
        ({"input": "x" * (256 * 1024 + 1)}, "bytes"),
        ({"task": None}, "task is missing"),
        ({"task": 12}, "task must be"),
        ({"colour": "red"}, "unknown option 'colour'"),
        ({"priority": 300}, "priority"),
        ({"overlap": "maybe"}, "overlap must be"),
        ({"rule": Daily("02:00", "UTC", end_at=T0 - timedelta(days=1))}, "end_at"),
    ],
)
def test_bad_input_raises_invalid_schedule_and_stores_nothing(
    durable: Durable, kwargs: dict, message: str
) -> None:
    args = {
        "id": "s",
        "task": "backup",
        "input": None,
        "rule": Every(timedelta(minutes=1)),
    } | kwargs
    with pytest.raises(InvalidSchedule, match=message):
        durable.schedules.create(**args)
    assert stored_events(durable) == 0


def test_exception_hierarchy() -> None:
    assert issubclass(InvalidSchedule, DurableError) and issubclass(InvalidSchedule, ValueError)
    assert issubclass(ScheduleConflict, DurableError)
    assert issubclass(UnknownTask, DurableError) and issubclass(UnknownTask, LookupError)


def test_list_is_ordered_by_id(durable: Durable) -> None:
    for sid in ("b", "a", "c"):
        durable.schedules.create(sid, "backup", sid, Cron("0 * * * *"))
    assert [v.id for v in durable.schedules.list()] == ["a", "b", "c"]


def test_once_view_completes(durable: Durable) -> None:
    durable.schedules.create("o", "backup", None, Once(T0 + timedelta(hours=1)))
    view = durable.schedules.state("o")
    assert view is not None and view.next_due == T0 + timedelta(hours=1)


def test_runs_are_empty_before_any_decision(durable: Durable) -> None:
    durable.schedules.create("r", "backup", None, Every(timedelta(seconds=1)))
    assert durable.schedules.runs("r") == []


def test_v2_runs_limit_keeps_the_newest_and_refuses_what_is_no_count(
    durable: Durable, clock: FakeClock
) -> None:
    durable.schedules.create("r", "backup", None, Every(timedelta(seconds=1)))
    d = durable.dispatcher()
    for _ in range(4):
        clock.advance(seconds=1)
        d.tick()
    d.close()
    newest = [r.run_id for r in durable.schedules.runs("r")]
    assert len(newest) == 4
    assert [r.run_id for r in durable.schedules.runs("r", limit=2)] == newest[:2]
    assert durable.schedules.runs("r", limit=0) == []
    for bad in (-1, 2.5, "2", True):
        with pytest.raises(InvalidSchedule, match="limit"):
            durable.schedules.runs("r", limit=bad)  # type: ignore[arg-type]


def test_run_statuses_merge_each_run_with_its_durable_run(
    any_durable: Durable, clock: FakeClock
) -> None:
    """V2 and the pages' one read: the run table's word for each run, and the ending of each
    durable run that ended, read for all the runs at once (memory and each SQL store)."""
    from celery_durable import ScheduledRun
    from celery_durable.core.outcomes import Faulted, Finished
    from celery_durable.message import scheduled_message

    d = any_durable

    @d.task(name="job", shared=False)
    def job(run: ScheduledRun) -> str:
        if run.input == "fail":
            raise RuntimeError("disk full")
        return f"did {run.input}"

    for sid, value in (("ok", "a"), ("bad", "fail")):
        d.schedules.create(sid, "job", value, Every(timedelta(hours=1)))
        run_id = d.schedules.trigger(sid)
        [run] = d.schedules.runs(sid)
        args, kwargs, _ = scheduled_message(ScheduledRun(sid, run.due, run.input))
        d.app.tasks["job"].apply(args, kwargs, task_id=run_id)
    clock.advance(seconds=1)
    d.schedules.trigger("ok")  # decided, never sent: no durable run yet
    runs = [*d.schedules.runs("ok"), *d.schedules.runs("bad")]
    plain = d.schedules.run_statuses(runs)
    assert [(s.state, s.stage, s.outcome) for s in plain] == [
        ("decided", "decided", ""),
        ("finished", "started", "finished"),
        ("faulted", "started", "faulted"),
    ]
    assert all(s.ending is None for s in plain)
    ended = d.schedules.run_statuses(runs, endings=True)
    assert [s.ending for s in ended] == [
        None,
        Finished("did a"),
        Faulted("disk full", "RuntimeError"),
    ]
    assert d.schedules.run_statuses([]) == []


def test_naive_clock_is_refused(app: Celery, sqlite_url: str) -> None:
    d = Durable(app, sqlite_url, clock=lambda: datetime(2026, 1, 1))
    with pytest.raises(DurableError, match="aware"):
        d.schedules.create("x", "backup", None, Every(timedelta(minutes=1)))


def test_url_falls_back_to_conf_then_env(app: Celery, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("CELERY_DURABLE_URL", raising=False)
    assert Durable(app).config.url == "sqlite:///celery_durable.db"
    monkeypatch.setenv("CELERY_DURABLE_URL", f"sqlite:///{tmp_path}/env.db")
    assert Durable(app).config.url == f"sqlite:///{tmp_path}/env.db"
    app.conf.durable_url = f"sqlite:///{tmp_path}/conf.db"
    assert Durable(app).config.url == f"sqlite:///{tmp_path}/conf.db"
    assert Durable(app, "sqlite:///x.db").config.url == "sqlite:///x.db"


def test_construction_opens_no_connection(app: Celery) -> None:
    d = Durable(app, "postgresql+psycopg://nobody@127.0.0.1:1/none")
    assert "journal" not in repr(d) or "not opened" in repr(d)


def test_unknown_schedule_is_a_conflict_of_kind_not_found(durable: Durable) -> None:
    from celery_durable import ScheduleNotFound

    for call in (durable.schedules.pause, durable.schedules.resume, durable.schedules.delete):
        with pytest.raises(ScheduleNotFound) as info:
            call("nobody")
        assert isinstance(info.value, ScheduleConflict)


def test_crontab_create_change_and_read_back(
    sql_durable: Durable, app: Celery, journal_url: str, clock: FakeClock
) -> None:
    """B2: a Crontab rule stored, changed and read back by a fresh Durable."""
    first_monday = Crontab(minute=0, hour=9, day_of_month="1-7", day_of_week="mon")
    sql_durable.schedules.create("first-monday", "backup", "/srv", first_monday)
    view = sql_durable.schedules.state("first-monday")
    assert view is not None and view.rule == first_monday
    assert view.next_due == datetime(2026, 12, 7, 9, tzinfo=UTC)  # T0 is Monday 2 Nov, 12:00

    evening = Crontab(minute=30, hour="22-2", day_of_week="fri-mon", zone="Europe/Oslo")
    sql_durable.schedules.change("first-monday", "backup", "/srv", evening)
    reopened = Durable(app, journal_url, clock=clock)
    try:
        view = reopened.schedules.state("first-monday")
        assert view is not None and view.rule == evening
        # Monday 2 Nov 2026, 22:30 in Oslo (CET) is 21:30 UTC.
        assert view.next_due == datetime(2026, 11, 2, 21, 30, tzinfo=UTC)
    finally:
        reopened.close()


def test_solar_create_change_and_read_back(
    sql_durable: Durable, app: Celery, journal_url: str
) -> None:
    """B3: a Solar rule stored, changed and read back by a fresh Durable."""
    sql_durable.schedules.create("lights-on", "backup", "/srv", Solar("sunset", 59.91, 10.75))
    view = sql_durable.schedules.state("lights-on")
    assert view is not None and view.rule == Solar("sunset", 59.91, 10.75)
    # T0 is 2026-11-02 12:00 UTC; Oslo's sunset that day is at 16:19 CET.
    t0 = datetime(2026, 11, 2, 12, tzinfo=UTC)
    assert view.next_due is not None
    assert abs(view.next_due - solar_next("sunset", 59.91, 10.75, t0)) < timedelta(seconds=1)
    assert view.next_due.replace(second=0, microsecond=0) == datetime(
        2026, 11, 2, 15, 19, tzinfo=UTC
    )

    sql_durable.schedules.change("lights-on", "backup", "/srv", Solar("dusk_civil", 59.91, 10.75))
    reopened = Durable(app, journal_url, clock=FakeClock())
    try:
        view = reopened.schedules.state("lights-on")
        assert view is not None and view.rule == Solar("dusk_civil", 59.91, 10.75)
        assert view.next_due == Solar("dusk_civil", 59.91, 10.75).next_after(t0)
    finally:
        reopened.close()


def test_solar_without_ephem_is_refused_before_storing(
    durable: Durable, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ephem", None)  # as if it were not installed
    before = stored_events(durable)
    with pytest.raises(SolarUnavailable, match=r"pip install 'celery-durable\[solar\]'"):
        durable.schedules.create("lights", "backup", "/srv", Solar("sunset", 59.91, 10.75))
    assert stored_events(durable) == before
