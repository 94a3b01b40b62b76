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
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery
from celery.signals import before_task_publish
from click.testing import CliRunner

from celery_durable import CatchUp, Durable, Every, ScheduleConflict
from celery_durable.store.journal.schema import events as events_table
from celery_durable.store.journal.schema import snapshots as snapshots_table
from tests.support.clock import T0, FakeClock

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
    assert count(durable, events_table) == events

    shown = run_cli(sqlite_url, "prune", "--older-than", "40d")
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.startswith("removed: ") and "schedule event(s)" in shown.stdout
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
