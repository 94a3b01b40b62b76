"""Upgrade safety (SPEC §9): open a journal written by an earlier version.

``tests/data/journal-v1.sqlite`` was written through the public API by
``tests/data/make_journal_v1.py`` (see its docstring for what it holds). The test works on a
copy, reads every state back, and lets the current dispatcher and durable-task code continue
from it. A change to a stored format must keep this test green, or add a migration.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery

from celery_durable import CatchUp, Durable, Every, Faulted, Finished
from celery_durable.importers.beat_schedule import import_beat_schedule
from celery_durable.store.journal.schema import SCHEMA_VERSIONS
from tests.data.make_journal_v1 import BASE, FIXTURE, Clock, build
from tests.data.make_journal_v1_beat import BASE as BEAT_BASE
from tests.data.make_journal_v1_beat import ENTRIES as BEAT_ENTRIES
from tests.data.make_journal_v1_beat import FIXTURE as BEAT_FIXTURE
from tests.data.make_journal_v1_beat import ORIGINS

EXPECTED_SCHEDULES = {
    # id: (paused, deleted, next_due after BASE, runs by (state, outcome))
    "every-10m": (False, False, BASE + timedelta(minutes=70), {("started", None): 6}),
    "pending-5m": (
        False, False, BASE + timedelta(minutes=70),
        {("started", None): 12, ("decided", None): 1},
    ),
    "paused-daily": (True, False, None, {}),
    "deleted-cron": (False, True, None, {("started", None): 1}),
    "changed-weekly": (False, False, BASE + timedelta(days=3, hours=-4), {}),
    "once": (False, False, None, {("started", None): 1}),
    "skip-durable": (
        False, False, BASE + timedelta(minutes=66),
        {("skipped", None): 60, ("started", "queued"): 1},
    ),
}  # fmt: skip

FAR_FUTURE = datetime(9999, 1, 1, tzinfo=timezone.utc)


def copy_of(fixture: Path, tmp_path: Path) -> Path:
    """A copy of a checked-in journal to work on (the fixture itself stays as written)."""
    path = tmp_path / fixture.name
    shutil.copyfile(fixture, path)
    return path


def pairs(durable: Any, query: str) -> dict[Any, Any]:
    """A two-column query's rows as a dict, read through the durable's journal."""
    with durable.journal.engine.connect() as conn:
        return dict(conn.execute(sa.text(query)).all())  # type: ignore[arg-type]


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    return copy_of(FIXTURE, tmp_path)


def test_the_fixture_is_a_v1_sqlite_journal() -> None:
    conn = sqlite3.connect(f"file:{FIXTURE}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        versions = dict(conn.execute("SELECT component, version FROM celery_durable_schema"))
        assert versions == {"journal": 1}
        types = {t for (t,) in conn.execute("SELECT DISTINCT type FROM celery_durable_events")}
    finally:
        conn.close()
    assert {"ScheduleCreated", "ScheduleChanged", "SchedulePaused", "ScheduleDeleted",
            "RunDecided", "RunStarted", "RunSkipped", "RunsMissed", "StepCompleted",
            "SignalReceived", "RunFinished", "RunFaulted"} <= types  # fmt: skip


def test_renamed_event_classes_keep_their_stored_type_names() -> None:
    """§9: the Python names of two schedule events changed (``RunSent``, ``RunEndReported``,
    apart from the run stream's ``RunStarted`` and the ``RunEnded`` exception); what is stored
    and read back did not."""
    from celery_durable.core.schedule_events import RunEndReported, RunSent, from_data

    assert (RunSent.TYPE, RunEndReported.TYPE) == ("RunStarted", "RunEnded")
    sent = from_data(
        "RunStarted",
        {"v": 1, "at": "2026-11-02T12:00:00.0000000Z", "due": "2026-11-02T12:00:00.0000000Z"},
    )
    ended = from_data(
        "RunEnded",
        {"v": 1, "at": "2026-11-02T12:00:00.0000000Z", "due": "2026-11-02T12:00:00.0000000Z",
         "outcome": "finished"},
    )  # fmt: skip
    assert isinstance(sent, RunSent) and isinstance(ended, RunEndReported)


def test_current_code_reads_every_state(copy: Path) -> None:
    durable, _ = build(f"sqlite:///{copy}", Clock(BASE + timedelta(minutes=66)))
    try:
        views = {v.id: v for v in durable.schedules.list(include_deleted=True)}
        assert set(views) == set(EXPECTED_SCHEDULES)
        for sid, (paused, deleted, next_due, runs) in EXPECTED_SCHEDULES.items():
            view = views[sid]
            assert (view.paused, view.deleted, view.next_due) == (paused, deleted, next_due), sid
            got = Counter((r.state, r.outcome) for r in durable.schedules.runs(sid))
            assert got == Counter(runs), sid
        changed = views["changed-weekly"]
        assert changed.input == 2 and changed.catch_up.value == "none"
        assert views["every-10m"].input == {"a": 1}
        assert durable.outcome("flow-finished", 0) == Finished(
            {"first": {"n": 3, "items": [1, 2.5, "é", None]}, "got": {"payload": "before the wait"}}
        )
        faulted = durable.outcome("flow-faulted", 0)
        assert isinstance(faulted, Faulted) and "the fixture's failing step" in faulted.error
        with pytest.raises(LookupError):
            durable.outcome("flow-future", 0)
    finally:
        durable.close()


def test_the_dispatcher_and_workers_continue_from_it(copy: Path) -> None:
    clock = Clock(BASE + timedelta(minutes=70))
    durable, tasks = build(f"sqlite:///{copy}", clock)
    try:
        before = durable.journal.head()
        dispatcher = durable.dispatcher()
        dispatcher.tick()
        dispatcher.close()
        # The run decided while the broker was down is enqueued now, with its old run ID ...
        pending = Counter(r.state for r in durable.schedules.runs("pending-5m"))
        assert pending == {"started": 14}  # 12 + the old pending one (13:05) + 13:10
        # ... CatchUp.ALL continues where it stopped, no due time twice ...
        every = durable.schedules.runs("every-10m")
        assert [r.due for r in every] == [BASE + timedelta(minutes=m) for m in range(70, 0, -10)]
        for sid in EXPECTED_SCHEDULES:
            ids = [r.run_id for r in durable.schedules.runs(sid)]
            assert len(ids) == len(set(ids)), sid
        # ... paused, deleted and complete schedules stay so.
        assert durable.schedules.runs("paused-daily") == []
        assert len(durable.schedules.runs("deleted-cron")) == 1
        assert len(durable.schedules.runs("once")) == 1
        assert durable.journal.head() > before
        # A signal stored before its run started is consumed by the new code.
        tasks["flow"].apply(args=[4], task_id="flow-future")
        outcome = durable.outcome("flow-future", 10)
        assert isinstance(outcome, Finished) and outcome.value["got"] == ["kept", 1]
        # A redelivery of a finished run returns its stored result and stores nothing.
        head = durable.journal.head()
        tasks["flow"].apply(args=[3], task_id="flow-finished")
        assert durable.journal.head() == head
    finally:
        durable.close()
    conn = sqlite3.connect(copy)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


def test_timing_policies_on_a_v1_journal(copy: Path) -> None:
    """SPEC §9 for P1–P3: schedules written before the policies existed read without them,
    a create with their first content still stores nothing (A1: the digest is unchanged), and
    a change adds the policies to an old schedule, its pending run keeping no deadline (A5)."""
    clock = Clock(BASE + timedelta(minutes=66))
    durable, _ = build(f"sqlite:///{copy}", clock)
    try:
        views = durable.schedules.list(include_deleted=True)
        assert {(v.start_deadline, v.jitter, v.catch_up_window) for v in views} == {
            (None, None, None)
        }
        head = durable.journal.head()
        durable.schedules.create(
            "every-10m", "upgrade.plain", {"a": 1}, Every(timedelta(minutes=10)), CatchUp.ALL
        )
        assert durable.journal.head() == head
        durable.schedules.change(
            "pending-5m",
            "upgrade.plain",
            None,
            Every(timedelta(minutes=5)),
            start_deadline=timedelta(minutes=1),
            jitter=30,
        )
        view = durable.schedules.state("pending-5m")
        assert view is not None
        assert (view.start_deadline, view.jitter) == (timedelta(minutes=1), timedelta(seconds=30))
        clock.advance(minutes=10)
        dispatcher = durable.dispatcher()
        dispatcher.tick()
        dispatcher.close()
        runs = durable.schedules.runs("pending-5m")
        # The run decided by the old version, long before, has no deadline: it is sent (A5).
        assert Counter(r.state for r in runs)["missed"] == 0
        assert runs[-1].state == "started"
    finally:
        durable.close()


def test_a_v1_journal_opens_snapshots_and_prunes(copy: Path) -> None:
    """O1/O2 on a journal written before retention existed: the snapshots table is added on
    open, a prune months later removes the old run records and the finished durable runs, and
    every schedule reads back as before."""
    clock = Clock(BASE + timedelta(minutes=66))
    durable, _ = build(f"sqlite:///{copy}", clock)
    try:
        views = {v.id: v for v in durable.schedules.list(include_deleted=True)}
        # The fixture's durable runs ended when it was written (2026-12-02, the workers' clock).
        clock.now = BASE + timedelta(days=120)
        report = durable.prune()  # durable_retention: 30 days by default
        assert report.schedule_events > 0 and report.snapshots > 0
        assert report.runs == 2  # flow-finished and flow-faulted; flow-future never started
        assert {v.id: v for v in durable.schedules.list(include_deleted=True)} == views
        durable.index.rebuild(clock.now)
        assert {v.id: v for v in durable.schedules.list(include_deleted=True)} == views
        with pytest.raises(LookupError):
            durable.outcome("flow-finished", 0)
        assert durable.schedules.backfill("every-10m", BASE, BASE + timedelta(hours=1)) == []
        assert durable.prune().schedule_events == 0  # nothing left to remove
    finally:
        durable.close()
    conn = sqlite3.connect(copy)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        tables = {t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "celery_durable_snapshots" in tables
    finally:
        conn.close()


# Schema version 2 (2026-12-04): the index's ``origin`` column (D13) ----------------------------


@pytest.fixture
def beat_copy(tmp_path: Path) -> Path:
    return copy_of(BEAT_FIXTURE, tmp_path)


def test_the_beat_fixture_is_a_v1_journal_without_the_origin_column() -> None:
    conn = sqlite3.connect(f"file:{BEAT_FIXTURE}?mode=ro", uri=True)
    try:
        versions = dict(conn.execute("SELECT component, version FROM celery_durable_schema"))
        columns = {r[1] for r in conn.execute("PRAGMA table_info(celery_durable_schedule_index)")}
        rows = {r[0] for r in conn.execute("SELECT schedule_id FROM celery_durable_schedule_index")}
    finally:
        conn.close()
    assert versions == {"journal": 1}
    assert "origin" not in columns and rows == set(ORIGINS)


def test_a_v1_journal_gains_the_origin_of_each_schedule_and_beat_reads_only_its_own(
    beat_copy: Path,
) -> None:
    """Opening the v1 journal migrates it to version 2, filling ``origin`` from the stored
    options; the next beat start then finds its removed entry through that column alone (the
    index is at the journal's head, so no event is read for it) and pauses it (B6)."""
    app = Celery("upgrade-beat-continue", broker="memory://", set_as_current=False)
    app.conf.update(task_ignore_result=True)
    clock = Clock(BEAT_BASE + timedelta(minutes=5))
    durable = Durable(app, f"sqlite:///{beat_copy}", clock=clock)
    try:
        durable.journal.ensure_ready()
        origins = pairs(durable, "SELECT schedule_id, origin FROM celery_durable_schedule_index")
        versions = pairs(durable, "SELECT component, version FROM celery_durable_schema")
        assert versions == dict(SCHEMA_VERSIONS)
        assert origins == ORIGINS
        entries = {k: v for k, v in BEAT_ENTRIES.items() if k != "gone"}
        report = import_beat_schedule(durable, entries)
        assert report.paused == ["gone"]
        gone, api = durable.schedules.state("gone"), durable.schedules.state("api-made")
        assert gone is not None and gone.paused
        assert api is not None and not api.paused
    finally:
        durable.close()


def test_a_v1_journal_gains_the_slot_of_each_schedule_and_a_partitioned_read(
    beat_copy: Path,
) -> None:
    """Journal version 3 (D10): opening the v1 journal fills the index's ``slot`` column with
    each schedule ID's stable hash, so a beat of a partitioned journal reads only its rows."""
    from celery_durable.core.partitions import partition_of, slot_of
    from celery_durable.store.index import ScheduleIndex

    app = Celery("upgrade-slots", broker="memory://", set_as_current=False)
    durable = Durable(app, f"sqlite:///{beat_copy}", clock=Clock(BEAT_BASE))
    try:
        durable.journal.ensure_ready()
        with durable.journal.engine.connect() as conn:
            slots = dict(conn.execute(sa.text(
                "SELECT schedule_id, slot FROM celery_durable_schedule_index"
            )).all())  # fmt: skip
        assert slots == {sid: slot_of(sid) for sid in ORIGINS}
        index = ScheduleIndex(durable.journal, partitions=4)
        for k in range(4):
            expected = {sid for sid in ORIGINS if partition_of(sid, 4) == k}
            rows, later = index.attention_window(None, FAR_FUTURE, frozenset({k}))
            assert {sid for sid, _ in rows} == expected and later is None
    finally:
        durable.close()


def test_a_v3_journals_waiting_parent_gains_a_countdown_column_and_its_fan_out_finishes(
    tmp_path: Path,
) -> None:
    """Journal version 4 (W11, 2026-12-06): the run table's ``wake_after`` column. In the v3
    journal a parent waits for the children of its ``map_children``; opened by the current
    code, the column is added empty (the first child's end wakes that parent, as when it was
    written), and the fan-out finishes, later suspensions counting their children's ends."""
    from celery_durable.testing import DurableHarness, TestClock
    from tests.data import make_journal_v3_children as v3

    conn = sqlite3.connect(f"file:{v3.FIXTURE}?mode=ro", uri=True)
    try:
        (version,) = conn.execute("SELECT version FROM celery_durable_schema").fetchone()
        columns = {row[1] for row in conn.execute("PRAGMA table_info(celery_durable_runs)")}
    finally:
        conn.close()
    assert version == 3 and "wake_after" not in columns
    path = copy_of(v3.FIXTURE, tmp_path)
    app = Celery("upgrade-children", broker="memory://", set_as_current=False)
    app.conf.update(task_ignore_result=True)
    clock = TestClock(v3.BASE + timedelta(seconds=1))
    with DurableHarness(app, f"sqlite:///{path}", clock=clock) as durable:
        durable.start()
        v3.register(durable)
        durable.journal.ensure_ready()
        versions = pairs(durable, "SELECT component, version FROM celery_durable_schema")
        rows = pairs(durable, "SELECT run_id, wake_after FROM celery_durable_runs")
        assert versions == dict(SCHEMA_VERSIONS)
        assert rows == {"fan": None, "fan:0.0": None, "fan:0.1": None, "fan:0.2": None}
        for _ in range(8):
            durable.advance(v3.NAP)
        assert durable.result("fan") == [x * 10 for x in range(v3.INPUTS)]


def test_a_v4_journal_gains_the_gap_trigger_and_its_run_finishes(tmp_path: Path) -> None:
    """Journal version 5 (A8, 2026-12-06): on SQLite the events table's trigger refuses a row
    past the end of its stream, so a step's result is one plain INSERT in autocommit mode. The
    v4 journal has no trigger; opened by the current code it gains it, its run replays its two
    stored steps (not run again) and finishes, and appends past the end or at a stale version
    are refused as before."""
    from celery_durable.core.journal import NewEvent
    from celery_durable.errors import AppendConflict
    from celery_durable.store.journal.schema import SQLITE_GAP_TRIGGER
    from celery_durable.testing import DurableHarness, TestClock
    from tests.data import make_journal_v4_steps as v4

    conn = sqlite3.connect(f"file:{v4.FIXTURE}?mode=ro&immutable=1", uri=True)
    try:
        (version,) = conn.execute("SELECT version FROM celery_durable_schema").fetchone()
        triggers = conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall()
    finally:
        conn.close()
    assert version == 4 and triggers == []
    path = copy_of(v4.FIXTURE, tmp_path)
    app = Celery("upgrade-steps", broker="memory://", set_as_current=False)
    app.conf.update(task_ignore_result=True)
    clock = TestClock(v4.BASE + timedelta(seconds=1))
    calls: list[str] = []
    with DurableHarness(app, f"sqlite:///{path}", clock=clock) as durable:
        durable.start()
        v4.register(durable, calls)
        durable.journal.ensure_ready()
        assert pairs(durable, "SELECT component, version FROM celery_durable_schema") == {
            "journal": 5
        }
        found = pairs(durable, "SELECT name, type FROM sqlite_master WHERE type = 'trigger'")
        assert found == {SQLITE_GAP_TRIGGER: "trigger"}
        durable.advance(v4.NAP)
        durable.advance(v4.NAP)
        assert durable.result("steps") == (4 + 1) * 10 + 3
        assert calls == ["third"]  # the stored steps were replayed, not run again
        journal = durable.journal
        stored = journal.read_stream("run/steps")
        assert [e.version for e in stored] == list(range(1, len(stored) + 1))
        head = stored[-1].version
        for expected in (head + 1, head - 1):  # past the end, stale
            with pytest.raises(AppendConflict) as info:
                journal.append("run/steps", expected, [NewEvent(type="Late")])
            assert info.value.actual_version == head
        assert len(journal.read_stream("run/steps")) == head
