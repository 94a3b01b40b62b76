"""``celery durable import django-celery-beat`` against django-celery-beat itself (SPEC I1).

django-celery-beat 2.9 creates its tables with its own migrations and saves rows of every
kind through its models, in a subprocess (Django's settings are configured once per process:
tests/support/beat_rows.py). The same subprocess asks the peer's ``ModelEntry`` — with only
its clock simulated — when it sends each row over the next days and with which options: the
oracle. Here the rows are imported by database URL (SQLAlchemy, no Django) into a journal on a
fake clock, and the schedule aggregate decides the due times of the same days.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_durable import Durable
from celery_durable.cli import main
from celery_durable.core.schedule_aggregate import DecideDue, MarkStarted, decide, fold_all
from celery_durable.core.schedule_events import RunDecided
from celery_durable.importers import django_beat
from celery_durable.importers.plan import run_import
from celery_durable.message import IMPORTED, run_message
from tests.support.beat_rows import NAMES_LONG
from tests.support.clock import T0, FakeClock

UTC = timezone.utc
ROOT = Path(__file__).resolve().parents[2]
DAYS = 40


def make_rows(path: Path, bad: bool = False) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.beat_rows", str(path), T0.isoformat(), str(DAYS)]
        + (["bad"] if bad else []),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    path = tmp_path_factory.mktemp("dcb") / "beat.db"
    oracle = make_rows(path)
    return f"sqlite:///{path}.rows", oracle


@pytest.fixture(scope="module")
def bad_rows_and_sends(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    path = tmp_path_factory.mktemp("dcb-bad") / "beat.db"
    sends = make_rows(path, bad=True)
    return f"sqlite:///{path}.rows", sends


@pytest.fixture(scope="module")
def bad_rows(bad_rows_and_sends: tuple[str, dict[str, str]]) -> str:
    return bad_rows_and_sends[0]


def make_app() -> Celery:
    app = Celery("import_tests", broker="memory://", set_as_current=False)
    app.conf.timezone = "Europe/Oslo"

    @app.task(name="proj.work", shared=False)
    def work(*args: Any, **kwargs: Any) -> None:  # pragma: no cover - messages are compared
        return None

    @app.task(name="proj.report", shared=False)
    def report(customer: Any) -> None:  # pragma: no cover - not run
        return None

    return app


@pytest.fixture
def durable(sqlite_url: str) -> Iterator[Durable]:
    found = Durable(make_app(), sqlite_url, clock=FakeClock(T0))
    yield found
    found.close()


def import_rows(durable: Durable, url: str, **kwargs: Any) -> Any:
    entries, unreadable = django_beat.entries(django_beat.rows_from_url(url))
    return run_import(
        durable.runtime,
        durable.schedules,
        entries,
        source=django_beat.SOURCE,
        unreadable=unreadable,
        **kwargs,
    )


def decided(durable: Durable, sid: str, until: datetime) -> list[RunDecided]:
    """The runs the aggregate decides for ``sid`` from now to ``until``, each when due."""
    state = durable.schedules.store.load(sid)
    runs: list[RunDecided] = []
    while True:
        due = state.next_due()
        if due is None or due >= until:
            return runs
        now = max(due, T0)
        events = decide(state, DecideDue(now=now))
        state = fold_all(state, events)
        for event in events:
            if isinstance(event, RunDecided):
                runs.append(event)
                state = fold_all(state, decide(state, MarkStarted(due=event.due, now=now)))


def test_every_row_runs_when_django_celery_beat_would_run_it(
    durable: Durable, rows: tuple[str, dict[str, Any]]
) -> None:
    url, oracle = rows
    result = import_rows(durable, url)
    assert not result.refused, [i.to_json() for i in result.refused]
    ids = {i.name: i.schedule_id for i in result.items}
    assert set(ids) == set(oracle)
    assert ids[NAMES_LONG] != NAMES_LONG and ids[NAMES_LONG].startswith("entry-")
    until = T0 + timedelta(days=DAYS)
    compared = 0
    for name, expected in oracle.items():
        sid = ids[name]
        runs = decided(durable, sid, until)
        # Sent when due, or at once when overdue: the moment the run is sent.
        ours = [max(r.due, T0) for r in runs]
        theirs = [datetime.fromisoformat(t) for t in expected["due"]]
        if name == "solar-later":
            # The documented difference: django-celery-beat also runs a solar row once at its
            # start_time (its "last run 30 years ago" makes it overdue there); the durable
            # schedule starts at the first sunset after it.
            assert theirs[0] == T0 + timedelta(days=2, hours=1)
            theirs = theirs[1:]
        if name.startswith(
            "solar"
        ):  # both compute the sunrise with ephem: equal to the millisecond
            assert len(ours) == len(theirs)
            gaps = [abs(a - b) for a, b in zip(ours, theirs, strict=True)]
            assert max(gaps) < timedelta(seconds=1), gaps
        else:
            assert ours == theirs, name
        compared += len(theirs)
        if runs:
            message = run_message(sid, _pending(durable, sid, runs[0]), durable=False)
            sent = dict(
                message.options,
                headers={k: v for k, v in message.headers.items() if not k.startswith("durable_")},
            )
            sent["headers"].pop("celery_beat_task")
            theirs_options = expected["options"]
            if "expires" in sent and not isinstance(sent["expires"], int):
                sent["expires"] = str(sent["expires"])
            assert sent == theirs_options, name
            # As the worker decodes them (kombu's typed JSON: the datetime comes back as one).
            sent_args = json.loads(json.dumps(message.args, default=str))
            assert sent_args == expected["args"], name
            assert message.kwargs == expected["kwargs"]
    assert compared > 1000


def _pending(durable: Durable, sid: str, run: RunDecided) -> Any:
    from celery_durable.core.schedule_aggregate import PendingRun

    return PendingRun(
        due=run.due, run_id=run.run_id, task=run.task, input=run.input, options=run.options
    )


GENERATED = int(os.environ.get("CELERY_DURABLE_TEST_GENERATED_ROWS", "80"))


def test_generated_rows_run_when_django_celery_beat_would_run_them(
    durable: Durable, tmp_path: Path
) -> None:
    """Random interval and crontab rows (last runs, start times, one-offs, expiry) over four
    days: the peer's ``ModelEntry`` is the oracle (more: CELERY_DURABLE_TEST_GENERATED_ROWS)."""
    seed = int(os.environ.get("CELERY_DURABLE_TEST_SEED", "7"))
    path = tmp_path / "generated.db"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.beat_rows",
            str(path),
            T0.isoformat(),
            "4",
            "generated",
            str(seed),
            str(GENERATED),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    oracle = json.loads(done.stdout)
    result = import_rows(durable, f"sqlite:///{path}.rows")
    assert not result.refused, [i.to_json() for i in result.refused]
    ids = {i.name: i.schedule_id for i in result.items}
    compared = 0
    for name, expected in oracle.items():
        runs = decided(durable, ids[name], T0 + timedelta(days=4)) if ids[name] else []
        ours = [max(r.due, T0) for r in runs]
        theirs = [datetime.fromisoformat(t) for t in expected["due"]]
        assert ours == theirs, (name, ours[:3], theirs[:3])
        compared += len(theirs)
    assert compared > 100


def test_every_field_is_carried(durable: Durable, rows: tuple[str, dict[str, Any]]) -> None:
    url, _ = rows
    import_rows(durable, url)
    state = durable.schedules.state
    assert state("disabled").paused
    assert state("one-off-interval").rule.max_runs == 1
    assert state("expires").rule.end_at == T0 + timedelta(hours=5) - timedelta(microseconds=1)
    assert state("clocked").rule.describe().startswith("once at 2026-11-03T12:00:00")
    assert state("cron-both-days").rule.describe() == 'crontab "0 9 1-7 * 1" Europe/Oslo'
    sid = django_beat_id(NAMES_LONG)
    marker = state(sid).options[IMPORTED]
    assert marker == {
        "source": "django-celery-beat",
        "name": NAMES_LONG,
        "description": "the weekly sales report",
    }
    every = state("every-5-min")
    assert every.anchor == T0 - timedelta(minutes=2)  # timing continues from last_run_at
    assert every.options["queue"] == "reports"
    assert every.options["headers"] == {"h": "v", "periodic_task_name": "every-5-min"}


def django_beat_id(name: str) -> str:
    from celery_durable.core.ids import schedule_id_for_name

    return schedule_id_for_name(name, "proj.work")


def test_a_second_run_changes_only_what_changed(
    durable: Durable, rows: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    import shutil

    copy = tmp_path / "rows.db"  # the rows are changed below: a copy of the module's
    shutil.copy(rows[0].removeprefix("sqlite:///"), copy)
    url = f"sqlite:///{copy}"
    first = import_rows(durable, url)
    assert {i.action for i in first.items} == {"create", "skip"} or {
        i.action for i in first.items
    } == {"create"}
    versions = {v.id: v.version for v in durable.schedules.list()}
    again = import_rows(durable, url)
    assert {i.action for i in again.items} <= {"unchanged", "skip"}
    assert {v.id: v.version for v in durable.schedules.list()} == versions
    # django-celery-beat ran a row again after the first import: its timing moves on.
    path = url.removeprefix("sqlite:///")
    _sql(
        path,
        "UPDATE django_celery_beat_periodictask SET last_run_at = '2026-11-02 11:59:00' "
        "WHERE name = 'every-5-min'",
    )
    moved = import_rows(durable, url)
    assert [(i.name, i.action, i.changes) for i in moved.items if i.action != "unchanged"] == [
        ("every-5-min", "change", ["last run"])
    ]
    assert durable.schedules.state("every-5-min").next_due == T0 + timedelta(minutes=4)
    # A row disabled after the first import pauses its schedule; enabled again, resumes it.
    _sql(path, "UPDATE django_celery_beat_periodictask SET enabled = 0 WHERE name = 'routing'")
    _sql(path, "UPDATE django_celery_beat_periodictask SET queue = 'q2' WHERE name = 'clocked'")
    third = import_rows(durable, url)
    actions = {i.name: i.action for i in third.items}
    assert actions["routing"] == "pause" and actions["clocked"] == "change"
    assert [c for i in third.items if i.name == "clocked" for c in i.changes] == ["option queue"]
    assert durable.schedules.state("routing").paused
    assert durable.schedules.state("clocked").options["queue"] == "q2"
    _sql(path, "UPDATE django_celery_beat_periodictask SET enabled = 1 WHERE name = 'routing'")
    _sql(path, "DELETE FROM django_celery_beat_periodictask WHERE name = 'starts-later'")
    fourth = import_rows(durable, url)
    assert {i.name: i.action for i in fourth.items}["routing"] == "resume"
    assert not durable.schedules.state("routing").paused
    assert [i.schedule_id for i in fourth.removed] == ["starts-later"]
    assert durable.schedules.state("starts-later").paused
    # Each stored step says where it came from (O5).
    history = [(h.action, h.reason) for h in durable.schedules.history("routing")]
    assert history[0] == ("created", "imported from django-celery-beat")
    assert history[-2][0] == "paused" and history[-2][1].startswith("disabled in ")
    assert history[-1] == ("resumed", "imported from django-celery-beat")


def _sql(path: str, statement: str) -> None:
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.execute(statement)


BAD = {"half-second", "bad-cron", "bad-args"}


def test_bad_rows_all_or_nothing(durable: Durable, bad_rows: str) -> None:
    result = import_rows(durable, bad_rows)
    refused = {i.name: i.error for i in result.refused}
    assert set(refused) == BAD
    assert "R3" in refused["half-second"] and "1 second" in refused["half-second"]
    assert "61" in refused["bad-cron"]
    assert durable.schedules.list() == []  # nothing half-stored
    skipped = import_rows(durable, bad_rows, skip_invalid=True)
    assert len(durable.schedules.list()) == len(skipped.items) - len(BAD)
    assert not any(v.id in BAD for v in durable.schedules.list())


def test_a_row_whose_args_cannot_call_its_task_is_refused_as_create_refuses_it(
    durable: Durable,
    bad_rows_and_sends: tuple[str, dict[str, str]],
    sqlite_url: str,
    monkeypatch: Any,
) -> None:
    """``def report(customer)`` with ``args='[1,2,3,4]'``: the peer's beat fails every send of
    the row (Celery checks the call); the import refuses it with the test ``schedules create``
    uses (I1), in the report, the dry run and the CLI, and stores it only never."""
    from celery_durable import Every, InvalidSchedule

    url, sends = bad_rows_and_sends
    assert sends["bad-args"].startswith("SchedulingError: "), sends
    assert "TypeError" in sends["bad-args"] or "positional" in sends["bad-args"], sends
    with pytest.raises(InvalidSchedule) as created:
        durable.schedules.create(
            "by-hand", "proj.report", None, Every(timedelta(hours=1)), args=[1, 2, 3, 4]
        )
    why = str(created.value).split(": ", 1)[1]  # the signature's own words
    dry = import_rows(durable, url, dry_run=True)
    error = {i.name: i.error for i in dry.refused}.get("bad-args")
    assert error == (
        "django-celery-beat entry 'bad-args': task 'proj.report' cannot be called with "
        f"the django-celery-beat entry's args and kwargs: {why}"
    ), error
    import_rows(durable, url, skip_invalid=True)
    assert durable.schedules.state("bad-args") is None
    monkeypatch.setenv("CELERY_DURABLE_URL", sqlite_url)
    app_module = "tests.importers.test_import_django_beat:args_cli_app"  # its own journal URL
    shown = CliRunner().invoke(
        main,
        ["-A", app_module, "import", "django-celery-beat", "--database-url", url, "--dry-run"],
    )
    assert shown.exit_code == 2, shown.output
    line = next(row for row in shown.output.splitlines() if row.startswith("bad-args"))
    assert "refused" in line and "cannot be called with" in line, line


def test_the_cli_dry_run_table_and_json(
    rows: tuple[str, dict[str, Any]], bad_rows: str, sqlite_url: str, monkeypatch: Any
) -> None:
    url, _ = rows
    monkeypatch.setenv("CELERY_DURABLE_URL", sqlite_url)
    app_module = "tests.importers.test_import_django_beat:cli_app"
    runner = CliRunner()
    dry = runner.invoke(
        main, ["-A", app_module, "import", "django-celery-beat", "--database-url", url, "--dry-run"]
    )
    assert dry.exit_code == 0, dry.output
    assert "row" in dry.output and "next (UTC)" in dry.output and "dry run" in dry.output
    assert "name breaks S1 → schedule ID entry-" in dry.output
    assert "one_off → at most 1 run" in dry.output
    as_json = runner.invoke(
        main,
        ["-A", app_module, "import", "django-celery-beat", "--database-url", url, "--json"],
    )
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    assert data["applied"] and data["counts"] == {"create": 12, "skip": 1}  # "expires" is over
    bad = runner.invoke(
        main, ["-A", app_module, "import", "django-celery-beat", "--database-url", bad_rows]
    )
    assert bad.exit_code == 2
    assert "REFUSED" in bad.output and "nothing stored" in bad.output


cli_app = make_app()
args_cli_app = make_app()


def test_the_management_command_inside_a_django_project(tmp_path: Path) -> None:
    """``manage.py durable_import_beat`` reads the rows through Django's ORM (I1)."""
    journal = f"sqlite:///{tmp_path / 'journal.db'}"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.beat_rows",
            str(tmp_path / "site.db"),
            T0.isoformat(),
            "1",
            "manage",
            journal,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    dry, first, again = json.loads(done.stdout)
    assert not json.loads(dry)["applied"]
    stored = json.loads(first)
    assert stored["applied"] and stored["counts"]["create"] == 12
    assert {e["name"] for e in stored["entries"]} >= {NAMES_LONG, "cron-both-days", "solar"}
    # The rows were written for T0, a month ago: "expires" is over.
    assert "django-celery-beat: 1 skip, 12 unchanged (nothing to store)" in again, again
    found = Durable(make_app(), journal)
    try:
        assert {v.options[IMPORTED]["name"] for v in found.schedules.list()} >= {NAMES_LONG}
    finally:
        found.close()


def test_since_is_an_optional_field_of_created_and_changed() -> None:
    """An imported schedule's timing continues from its source (I1); the field is optional,
    so events stored without it read and fold as before (SPEC §9)."""
    from celery_durable.core.rules import Every
    from celery_durable.core.schedule_aggregate import Change, ScheduleState
    from celery_durable.core.schedule_events import (
        Content,
        ScheduleChanged,
        ScheduleCreated,
        from_data,
        to_data,
    )

    content = Content(task="t", input=None, rule=Every(timedelta(minutes=5)))
    created = ScheduleCreated(at=T0, content=content, since=T0 - timedelta(minutes=2))
    data = to_data(created)
    assert data["since"] == "2026-11-02T11:58:00.000000Z"
    assert from_data("ScheduleCreated", data) == created
    old = to_data(ScheduleCreated(at=T0, content=content))
    assert "since" not in old and from_data("ScheduleCreated", old).since is None
    state = fold_all(ScheduleState(schedule_id="s"), [created])
    assert state.anchor == T0 - timedelta(minutes=2) and state.next_due() == T0 + timedelta(
        minutes=3
    )
    # A run decided at T0+3m: a re-import from an older last run never goes back before it.
    state = fold_all(state, decide(state, DecideDue(now=T0 + timedelta(minutes=3))))
    assert state.last_decided == T0 + timedelta(minutes=3)
    again = Change(content=content, now=T0 + timedelta(minutes=4), since=T0 - timedelta(hours=1))
    events = decide(state, again)
    assert [type(e) for e in events] == [ScheduleChanged]
    state = fold_all(state, events)
    assert state.cursor == T0 + timedelta(minutes=3)
    assert state.next_due() == T0 + timedelta(minutes=5)  # on the grid of the given last run
    # The same content and last run again: nothing to store (A2).
    assert decide(state, again) == []


def _comparable(entry: Any) -> dict[str, Any]:
    from dataclasses import asdict

    from celery_durable.importers.entries import rule_of

    found = {k: v for k, v in asdict(entry).items() if k != "schedule"}
    try:
        found["rule"] = rule_of(entry.schedule, make_app(), entry.name).to_json()
    except ValueError as exc:  # the half-second interval: refused alike
        found["rule"] = str(exc)
    return found


@pytest.mark.parametrize("database", ["postgres", "mysql"])
def test_the_url_reader_reads_the_same_rows_from_every_database(
    database: str, request: pytest.FixtureRequest, bad_rows: str
) -> None:
    """The rows saved by django-celery-beat on PostgreSQL and MariaDB read as on SQLite."""
    url = request.getfixturevalue("pg_url" if database == "postgres" else "mysql_url")
    make_rows_at(url)
    theirs, refused = django_beat.entries(django_beat.rows_from_url(url))
    ours, refused_here = django_beat.entries(django_beat.rows_from_url(bad_rows))
    assert refused.keys() == refused_here.keys() == {"bad-cron"}
    by_name = sorted(theirs, key=lambda e: e.name), sorted(ours, key=lambda e: e.name)
    assert [_comparable(e) for e in by_name[0]] == [_comparable(e) for e in by_name[1]]
    assert len(theirs) == 15


def make_rows_at(url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.beat_rows", url, T0.isoformat(), "1", "bad"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_a_real_worker_receives_what_django_celery_beat_would_send(
    rows: tuple[str, dict[str, Any]], redis_url: str, sqlite_url: str
) -> None:
    """Imported rows, our dispatcher on a fake clock, a real worker on Redis (I1, B5)."""
    from celery.contrib.testing.worker import start_worker

    from tests.support.processes import wait_for

    url, oracle = rows
    seen: dict[str, dict[str, Any]] = {}
    app = Celery("import_worker", broker=redis_url, set_as_current=False)
    app.conf.update(timezone="Europe/Oslo", broker_connection_retry_on_startup=False)

    @app.task(name="proj.work", bind=True, shared=False)
    def work(self: Any, *args: Any, **kwargs: Any) -> None:
        seen[self.request.get("periodic_task_name")] = {
            "args": list(args),
            "kwargs": kwargs,
            "beat": self.request.get("celery_beat_task"),
            "team": self.request.get("h"),
            "expires": self.request.expires,
            "id": self.request.id,
        }

    clock = FakeClock(T0)
    found = Durable(app, sqlite_url, clock=clock)
    try:
        import_rows(found, url)
        dispatcher = found.dispatcher()
        dispatcher.tick()  # at T0: the rows due (or overdue) now
        clock.set(T0 + timedelta(minutes=3))
        dispatcher.tick()  # "every-5-min": one interval after its last_run_at
        with start_worker(
            app,
            pool="solo",
            perform_ping_check=False,
            shutdown_timeout=30,
            queues=["celery", "reports"],
        ):
            wait_for(lambda: {"every-5-min", "expire-seconds", "one-off-interval"} <= set(seen), 30)
        dispatcher.close()
    finally:
        found.close()
    report = seen["every-5-min"]
    assert report["id"] == "every-5-min@2026-11-02T12:03:00.0000000Z"
    assert report["beat"] is True and report["team"] == "v"
    assert report["args"] == [1, "x", datetime(2026, 1, 2, 3, 4, 5)]  # kombu's typed JSON
    assert report["kwargs"] == oracle["every-5-min"]["kwargs"]
    # expire_seconds=30: the message expires 30 s after it was sent, as django-celery-beat's.
    assert seen["expire-seconds"]["expires"] is not None
    # "expires" was sent too, with its row's expiry (T0 + 5 h) as the message's: the worker's
    # own clock is past it, so the worker discards it, as it would django-celery-beat's.
    assert set(seen) == {"every-5-min", "expire-seconds", "one-off-interval"}


@settings(max_examples=150, deadline=None)
@given(
    minute=st.sampled_from(["0", "*/15", "5,35", "59", "10-20/5"]),
    hour=st.sampled_from(["*", "9", "0-6", "22-2", "*/7"]),
    day_of_month=st.sampled_from(["*", "1-7", "13", "28-31", "*/10"]),
    month=st.sampled_from(["*", "1", "2,12", "11-3"]),
    day_of_week=st.sampled_from(["*", "mon", "fri-sun", "0", "1-5"]),
    zone=st.sampled_from(["UTC", "Asia/Tokyo", "Asia/Kolkata", "America/Sao_Paulo"]),
    start=st.integers(min_value=0, max_value=500 * 24 * 60),
)
def test_crontab_rows_are_due_when_tzawarecrontab_is(
    minute: str,
    hour: str,
    day_of_month: str,
    month: str,
    day_of_week: str,
    zone: str,
    start: int,
) -> None:
    """Generated crontab rows (both day fields, own zones): the imported rule's due times are
    django-celery-beat's ``TzAwareCrontab``'s, computed by the peer itself (B2, I1)."""
    from zoneinfo import ZoneInfo

    from django_celery_beat.tzcrontab import TzAwareCrontab

    from celery_durable.importers.entries import rule_of

    row = {
        "crontab_minute": minute,
        "crontab_hour": hour,
        "crontab_day_of_month": day_of_month,
        "crontab_month_of_year": month,
        "crontab_day_of_week": day_of_week,
        "crontab_timezone": zone,
    }
    peer = TzAwareCrontab(minute, hour, day_of_week, day_of_month, month, tz=ZoneInfo(zone))
    rule = rule_of(django_beat.schedule_of(row), CRON_APP, "generated")
    moment = T0 + timedelta(minutes=start)
    for _ in range(4):
        last, delta, _now = peer.remaining_delta(moment.astimezone(peer.tz))
        theirs = (last + delta).astimezone(UTC)
        ours = rule.next_after(moment)
        assert ours == theirs, (row, moment)
        moment = theirs


CRON_APP = make_app()


def test_an_imported_schedule_can_be_changed_like_any_other(
    durable: Durable, rows: tuple[str, dict[str, Any]]
) -> None:
    """After the import the schedule is the project's: the API (and so the CLI and the admin)
    changes it, keeping where it came from."""
    import_rows(durable, rows[0])
    view = durable.schedules.state("every-5-min")
    assert view is not None
    options = dict(view.options, queue="elsewhere")
    durable.schedules.change(view.id, view.task, view.input, view.rule, view.catch_up, **options)
    changed = durable.schedules.state("every-5-min")
    assert changed is not None and changed.options["queue"] == "elsewhere"
    assert changed.options[IMPORTED]["source"] == "django-celery-beat"
