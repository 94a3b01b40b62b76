"""Retention (O1) by the working dispatcher and by ``celery durable prune``.

The months test compresses four months with the fake clock: schedules of ``Every(1 h)`` run for
120 simulated days with ``durable_retention`` of 30 days while the dispatcher's background
passes prune aggressively (every 6 simulated hours, batches of 50) during the ticks. By default
it runs 4 schedules (11,520 runs per database) so that the file stays well under a minute;
``CELERY_DURABLE_MONTHS_SCHEDULES=200`` runs the full size of O1's acceptance test (576,000 runs).
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery
from celery.signals import before_task_publish
from click.testing import CliRunner

from celery_durable import CatchUp, Durable, Every, ScheduleConflict
from celery_durable.core.codec import time_from_json
from celery_durable.core.schedule_events import RUN_RECORD_TYPES
from celery_durable.store.journal.schema import events as events_table
from celery_durable.store.journal.schema import snapshots as snapshots_table
from celery_durable.store.retention import Pruner, TailMemory
from tests.support.clock import T0, FakeClock
from tests.support.processes import REPO_ROOT, child_env, run_child

UTC = timezone.utc
SCHEDULES = int(os.environ.get("CELERY_DURABLE_MONTHS_SCHEDULES", "4"))
DAYS = 120
RETENTION = timedelta(days=30)
PRUNE_EVERY = timedelta(hours=6)


@pytest.fixture
def sent() -> Iterator[Counter[str]]:
    """Task ids of every message the dispatcher publishes (Celery's own signal)."""
    ids: Counter[str] = Counter()

    def record(headers: dict[str, Any] | None = None, **_: Any) -> None:
        if headers and "id" in headers:
            ids[headers["id"]] += 1

    before_task_publish.connect(record, weak=False)
    yield ids
    before_task_publish.disconnect(record)


def make_app(retention: timedelta = RETENTION) -> Celery:
    app = Celery("months", broker="memory://", set_as_current=False)
    app.conf.durable_sqlite_synchronous = "OFF"  # simulated months: no fsync per tick
    app.conf.durable_retention = retention
    app.conf.durable_prune_interval = PRUNE_EVERY.total_seconds()
    app.conf.durable_prune_batch = 50

    @app.task(name="job", shared=False)
    def job(n: int) -> int:  # pragma: no cover - nothing consumes the queue
        return n

    return app


def count(durable: Durable, table: sa.Table) -> int:
    with durable.journal.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() or 0)


@pytest.mark.parametrize("url_fixture", ["sqlite_url", "pg_url"])
def test_months_of_hourly_runs_level_off_and_decide_each_due_time_once(
    url_fixture: str, request: pytest.FixtureRequest, sent: Counter[str]
) -> None:
    """O1: row counts level off at what 30 days need; every due time is decided exactly once
    (A6) though passes prune during the ticks; a backfill over pruned days decides nothing;
    a deleted ID stays refused (A4); ``max_runs`` still completes its schedule (R6)."""
    url = request.getfixturevalue(url_fixture)
    clock = FakeClock(T0)
    durable = Durable(make_app(), url, clock=clock)
    schedules = durable.schedules
    ids = [f"hourly-{n}" for n in range(SCHEDULES)]
    # Ticks every 2 hours (half the ticks); CatchUp.ALL decides both due times of each tick.
    hourly = Every(timedelta(hours=1))
    for sid in ids:
        schedules.create(sid, "job", 1, hourly, CatchUp.ALL)
    schedules.create("gone", "job", 2, hourly, CatchUp.ALL)
    schedules.create("bounded", "job", 3, Every(timedelta(hours=1), max_runs=24 * 50), "all")
    dispatcher = durable.dispatcher()
    levels: dict[int, int] = {}
    try:
        for hour in range(2, DAYS * 24 + 1, 2):
            clock.advance(hours=2)
            dispatcher.tick()
            if hour % 12 == 0:
                # Simulated hours pass in milliseconds: let every other pass finish before the
                # clock moves on, as a pass does in a real hour; the others overlap the ticks.
                dispatcher.pruning.wait()
            if hour == 24:
                schedules.delete("gone")
            if hour % (24 * 30) == 0:
                dispatcher.pruning.wait()
                levels[hour // 24] = count(durable, events_table)
        dispatcher.pruning.wait()
        last = dispatcher.pruning.last
    finally:
        dispatcher.close()
    assert last is not None and last.complete

    # Each due time went out exactly once, none was skipped: 24 a day per schedule.
    per_schedule = Counter(run_id.split("@")[0] for run_id in sent)
    assert set(sent.values()) == {1}
    assert all(per_schedule[sid] == DAYS * 24 for sid in ids), per_schedule
    assert per_schedule["gone"] == 24 and per_schedule["bounded"] == 24 * 50
    for sid in ids:
        view = schedules.state(sid)
        assert view is not None and view.runs_decided == DAYS * 24
        assert view.next_due == clock() + timedelta(hours=1)
    assert schedules.state("bounded").runs_decided == 24 * 50  # type: ignore[union-attr]
    bounded = schedules.state("bounded")
    assert bounded is not None and bounded.next_due is None  # max_runs reached (R6)

    # The journal levels off: 30 days plus one pass interval of two events per run, plus the
    # life-cycle events and the event each snapshot keeps.
    streams = SCHEDULES + 2
    bound = (
        int((RETENTION + PRUNE_EVERY + timedelta(days=1)) / timedelta(hours=1))
        * 2
        * (SCHEDULES + 1)
        + 4 * streams
    )
    assert levels[60] <= bound and levels[90] <= bound and levels[120] <= bound, (levels, bound)
    assert levels[120] <= levels[60], levels  # "bounded" completed on day 50: fewer since
    assert levels[120] >= int(RETENTION / timedelta(hours=1)) * 2 * SCHEDULES  # 30 days kept
    assert count(durable, snapshots_table) == streams

    # Pruned days stay settled, the deleted ID stays deleted.
    assert schedules.backfill(ids[0], T0, clock() - timedelta(days=40)) == []
    with pytest.raises(ScheduleConflict):
        schedules.create("gone", "job", 2, Every(timedelta(hours=1)))
    durable.index.rebuild(clock())
    view = schedules.state(ids[0])
    assert view is not None and view.runs_decided == DAYS * 24
    durable.close()


def test_the_dispatcher_stops_pruning_when_it_loses_the_lease(sqlite_url: str) -> None:
    """O1: a pass stops before its next batch once this process no longer holds the lease."""
    clock = FakeClock(T0)
    app = make_app()
    app.conf.durable_prune_interval = 10 * 24 * 3600.0  # only the pass started by hand
    durable = Durable(app, sqlite_url, clock=clock)
    for n in range(4):
        durable.schedules.create(f"s{n}", "job", n, Every(timedelta(hours=6)))
    dispatcher = durable.dispatcher()
    try:
        for _ in range(4 * 40):
            clock.advance(hours=6)
            dispatcher.tick()
        dispatcher.pruning.wait()
        before = count(durable, events_table)
        dispatcher.lease.held = False  # as after a failed renewal: another beat took over
        job = dispatcher.pruning
        job._next = clock()  # a pass is due now
        job.poke(clock())
        report = job.wait()
        assert report is not None and not report.complete and report.schedule_events == 0
        assert count(durable, events_table) == before
    finally:
        dispatcher.close()
        durable.close()


def run_cli(url: str, *args: str) -> Any:
    from celery.bin.celery import celery as celery_main

    result = CliRunner().invoke(
        celery_main,
        ["-A", "tests.e2e.cli_app", "durable", "--url", url, *args],
        catch_exceptions=False,
    )
    return result


def test_the_prune_command(sqlite_url: str) -> None:
    """``celery durable prune [--older-than] [--dry-run] [--json]`` (O1), on the real clock."""
    now = datetime.now(UTC)
    clock = FakeClock(now - timedelta(days=50))
    # The history is written without pruning, for the command to find it.
    durable = Durable(make_app(retention=timedelta(days=366)), sqlite_url, clock=clock)
    durable.schedules.create("old", "job", 1, Every(timedelta(hours=1)))
    dispatcher = durable.dispatcher()
    for _ in range(24 * 45):
        clock.advance(hours=1)
        dispatcher.tick()
    dispatcher.close()
    events = count(durable, events_table)

    dry = run_cli(sqlite_url, "prune", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    counted = json.loads(dry.stdout)
    assert counted["dry_run"] is True and counted["schedule_events"] > 0
    # The JSON form of every time in the CLI (docs/cli.md): UTC, microseconds, "Z".
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", counted["horizon"])
    assert count(durable, events_table) == events

    shown = run_cli(sqlite_url, "prune", "--older-than", "40d")
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.startswith("removed: ") and "schedule event(s)" in shown.stdout
    assert re.search(r"runs due before \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\)", shown.stdout)
    after_40 = count(durable, events_table)
    assert after_40 < events
    done = json.loads(run_cli(sqlite_url, "prune", "--json").stdout)  # durable_retention: 30 d
    assert 0 < done["schedule_events"] < counted["schedule_events"]
    assert count(durable, events_table) == events - counted["schedule_events"]

    bad = run_cli(sqlite_url, "prune", "--older-than", "soon")
    assert bad.exit_code != 0 and "--older-than" in bad.output
    zero = run_cli(sqlite_url, "prune", "--older-than", "0s")
    assert zero.exit_code != 0 and "--older-than" in zero.output
    durable.close()


def old_run_records(durable: Durable, horizon: datetime) -> int:
    """Run records due before ``horizon`` that retention may remove: all but a stream's newest
    event (the schedules of these tests track no run: plain tasks, no overlap policy)."""
    events = []
    position = 0
    while batch := durable.journal.read_all(position, category="schedule", limit=1000):
        events.extend(batch)
        position = batch[-1].position
    newest: dict[str, int] = {}
    for event in events:
        newest[event.stream] = max(newest.get(event.stream, 0), event.version)
    old = 0
    for event in events:
        data = event.data if isinstance(event.data, dict) else json.loads(event.data)
        due = data.get("through" if event.type == "RunsMissed" else "due")
        if (
            event.type in RUN_RECORD_TYPES
            and event.version < newest[event.stream]
            and due is not None
            and time_from_json(due) < horizon
        ):
            old += 1
    return old


def record_late(durable: Durable, clock: FakeClock, *, down: timedelta) -> None:
    """Beat down for ``down``: a catch-up ``ALL`` then decides every two-hourly due time at
    once, and a backfill decides the hourly ones of a ``LATEST`` schedule up to a day ago.
    Old due times land at new positions (recorded now)."""
    schedules = durable.schedules
    schedules.create("two-hourly", "job", 1, Every(timedelta(hours=2)), CatchUp.ALL)
    schedules.create("backfilled", "job", 2, Every(timedelta(hours=1)), CatchUp.LATEST)
    dispatcher = durable.dispatcher()
    try:
        dispatcher.tick()
        clock.advance(seconds=down.total_seconds())
        dispatcher.tick()
        decided = schedules.backfill("backfilled", clock() - down, clock() - timedelta(days=1))
        assert len(decided) > 24 * 20
        for _ in range(5):  # the backfilled runs go out (RunStarted, recorded now too)
            clock.advance(seconds=1)
            dispatcher.tick()
    finally:
        dispatcher.close()


@pytest.mark.parametrize("url_fixture", ["sqlite_url", "pg_url"])
def test_one_prune_removes_runs_recorded_out_of_time_order(
    url_fixture: str, request: pytest.FixtureRequest
) -> None:
    """O1: a catch-up after downtime and a backfill record old due times late; one prune call
    removes every eligible record all the same, ``--dry-run`` counts them all, and the report
    says ``complete`` only then. Pruned due times stay settled (A6)."""
    url = request.getfixturevalue(url_fixture)
    clock = FakeClock(T0)
    durable = Durable(make_app(retention=timedelta(days=366)), url, clock=clock)
    record_late(durable, clock, down=timedelta(days=60))
    horizon = clock() - RETENTION
    eligible = old_run_records(durable, horizon)
    assert eligible > 2 * 24 * 25  # both schedules' old runs: RunDecided and RunStarted

    counted = durable.prune(RETENTION, dry_run=True)
    assert counted.schedule_events == eligible and counted.complete
    assert old_run_records(durable, horizon) == eligible
    report = durable.prune(RETENTION)
    assert (report.schedule_events, old_run_records(durable, horizon)) == (eligible, 0)
    assert report.complete and report.snapshots == 2
    again = durable.prune(RETENTION)
    assert again.schedule_events == 0 and again.complete

    assert durable.schedules.backfill("backfilled", T0, horizon) == []  # A6
    durable.index.rebuild(clock())
    view = durable.schedules.state("two-hourly")
    assert view is not None and view.runs_decided == 12 * 60
    durable.close()


def stored_after(durable: Durable, position: int) -> int:
    """Schedule events stored after ``position``."""
    table = events_table
    query = sa.select(sa.func.count()).where(
        table.c.category == "schedule", table.c.position > position
    )
    with durable.journal.engine.connect() as conn:
        return int(conn.execute(query).scalar() or 0)


@pytest.mark.parametrize("url_fixture", ["sqlite_url", "pg_url"])
def test_the_dispatchers_passes_find_late_records_and_read_the_tail_once(
    url_fixture: str, request: pytest.FixtureRequest
) -> None:
    """O1: the working dispatcher's first pass reads the whole journal once; later passes
    read only what was stored since, the start of the journal up to the horizon, and the
    late records they remember, which go as soon as their due time passes the horizon."""
    url = request.getfixturevalue(url_fixture)
    clock = FakeClock(T0)
    app = make_app()
    app.conf.durable_prune_interval = 1000 * 24 * 3600.0  # only the passes started here
    durable = Durable(app, url, clock=clock)
    schedules = durable.schedules
    schedules.create("steady", "job", 1, Every(timedelta(hours=6)), CatchUp.ALL)
    schedules.create("backfilled", "job", 2, Every(timedelta(hours=1)))
    schedules.pause("backfilled")
    dispatcher = durable.dispatcher()
    job = dispatcher.pruning

    def ticks(days: int) -> None:
        for _ in range(days * 4):
            clock.advance(hours=6)
            dispatcher.tick()

    def prune_pass() -> Any:
        job._next = clock()  # a pass is due now
        job.poke(clock())
        report = job.wait()
        assert report is not None and report.complete
        assert old_run_records(durable, clock() - RETENTION) == 0
        return report

    try:
        ticks(40)
        schedules.resume("backfilled")
        assert len(schedules.backfill("backfilled", T0, clock() - timedelta(days=1))) == 39 * 24
        clock.advance(seconds=1)
        dispatcher.tick()  # the backfilled runs go out
        stored = durable.journal.head("schedule")
        first = prune_pass()
        assert first.schedule_events > 2 * 24 * 10  # the first ten days
        assert first.events_read >= count(durable, events_table) - 5
        assert len(job.tail.late) > 2 * 24 * 25  # backfilled days 10 to 39: not old yet

        ticks(5)
        second = prune_pass()
        new = stored_after(durable, stored)
        # Five days of "backfilled" late records go, read where remembered; those of "steady"
        # come from the head scan (one batch past the horizon); the tail is read from pass 1 on.
        assert second.schedule_events >= 2 * 24 * 5
        assert second.events_read <= second.schedule_events + new + 50 + 10, second

        stored = durable.journal.head("schedule")
        ticks(30)
        third = prune_pass()
        new = stored_after(durable, stored)
        assert third.events_read <= third.schedule_events + new + 50 + 10, third
        assert not job.tail.due_before(clock() - RETENTION)
    finally:
        dispatcher.close()
    durable.index.rebuild(clock())
    view = schedules.state("steady")
    assert view is not None and view.runs_decided == 75 * 4
    durable.close()


def prune_in_child(url: str, *args: str, terminal: bool) -> tuple[int, str, str]:
    """``celery durable prune`` in a subprocess, stderr on a pseudo-terminal when ``terminal``:
    (exit code, stdout, stderr)."""
    command = [
        sys.executable, "-m", "celery", "-A", "tests.e2e.cli_app", "durable", "--url", url,
        "prune", *args,
    ]  # fmt: skip
    env = child_env()
    if not terminal:
        done = run_child(command, cwd=REPO_ROOT, env=env)
        return done.returncode, done.stdout, done.stderr
    leader, follower = pty.openpty()
    try:
        child = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=follower,
        )  # fmt: skip
    finally:
        os.close(follower)
    shown = bytearray()
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    stdout = child.stdout.read().decode() if child.stdout is not None else ""
    return child.wait(timeout=60), stdout, shown.decode(errors="replace")


def test_prune_shows_its_progress_on_a_terminal(sqlite_url: str) -> None:
    """O1: ``celery durable prune`` draws a progress line on stderr when stderr is a terminal,
    and only then; ``--dry-run`` counts everything one call then removes."""
    now = datetime.now(UTC)
    clock = FakeClock(now - timedelta(days=70, minutes=1))
    durable = Durable(make_app(retention=timedelta(days=366)), sqlite_url, clock=clock)
    record_late(durable, clock, down=timedelta(days=70))
    horizon = now - RETENTION
    eligible = old_run_records(durable, horizon)
    assert eligible > 2 * 24 * 30

    code, out, err = prune_in_child(sqlite_url, "--dry-run", "--json", terminal=False)
    assert code == 0, err
    assert json.loads(out)["schedule_events"] == eligible and "prune:" not in err
    code, out, err = prune_in_child(sqlite_url, "--older-than", "30d", terminal=True)
    assert code == 0, err
    assert "\rprune: schedule events: position " in err, err
    assert out.startswith(f"removed: {eligible} schedule event(s)"), out
    assert old_run_records(durable, horizon) == 0
    durable.close()


def test_a_full_tail_memory_forgets_no_eligible_record(sqlite_url: str) -> None:
    """O1: when more late records are found than the memory keeps, the pass after the horizon
    passes the earliest one it forgot reads the tail again: nothing eligible is left."""
    clock = FakeClock(T0)
    durable = Durable(make_app(retention=timedelta(days=366)), sqlite_url, clock=clock)
    record_late(durable, clock, down=timedelta(days=60))
    pruner = Pruner(durable.journal, durable.index, batch=50)
    pruner.catch_up_index(clock())
    tail = TailMemory(limit=5)
    first = pruner.prune(clock(), timedelta(days=50), tail=tail)
    assert first.complete and len(tail.late) == 5 and tail.floor is not None
    assert old_run_records(durable, clock() - timedelta(days=50)) == 0
    for days in (5, 15):
        later = clock() + timedelta(days=days)
        report = pruner.prune(later, timedelta(days=50), tail=tail)
        assert report.complete and report.schedule_events > 2 * 24 * 5
        assert old_run_records(durable, later - timedelta(days=50)) == 0
    durable.close()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e20])
def test_a_retention_no_timedelta_can_hold_is_refused_naming_the_setting(bad: float) -> None:
    """O1: ``durable_retention`` is checked with the other settings, in words (not as the
    ``ValueError``/``OverflowError`` of ``timedelta``)."""
    from celery_durable.config import ConfigError, DurableConfig

    with pytest.raises(ConfigError, match="durable_retention"):
        DurableConfig.from_app({"durable_retention": bad})


def test_a_retention_longer_than_the_journals_history_keeps_everything(sqlite_url: str) -> None:
    """O1: a retention reaching before any due time (centuries) removes nothing, in the
    dispatcher's passes and in ``prune``, instead of failing on the date arithmetic."""
    clock = FakeClock(T0)
    app = make_app(retention=timedelta(days=900_000))
    with closing(Durable(app, sqlite_url, clock=clock)) as durable:
        durable.schedules.create("old", "job", 1, Every(timedelta(hours=1)))
        dispatcher = durable.dispatcher()
        for _ in range(24):
            clock.advance(hours=1)
            dispatcher.tick()
        dispatcher.close()
        report = durable.prune()
        assert (report.schedule_events, report.runs, report.complete) == (0, 0, True)
        assert len(durable.schedules.runs("old")) == 24


@pytest.mark.parametrize(
    ("key", "bad"),
    [
        ("durable_prune_interval", float("inf")),
        ("durable_prune_interval", 1e300),
        ("durable_prune_batch", 0.5),
        ("durable_prune_batch", 1e30),
        ("durable_prune_batch", float("nan")),
    ],
)
def test_prune_settings_that_cannot_work_are_refused_naming_them(key: str, bad: float) -> None:
    """O1: an interval no date can hold, or a batch that is no row count, is a ConfigError
    when the settings are read, not an OverflowError in the dispatcher's passes."""
    from celery_durable.config import ConfigError, DurableConfig

    with pytest.raises(ConfigError, match=key):
        DurableConfig.from_app({key: bad})
