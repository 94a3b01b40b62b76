"""Retention (O1): remove the records of runs that are over and older than the retention.

Two kinds of rows go, in small batches, each batch one short transaction:

* **Schedule events that only record a run** (``RunDecided``, ``RunStarted``, ``RunSkipped``,
  ``RunFailedToStart``, ``RunMissed``, ``RunsMissed``, ``RunEnded``) whose due time is before
  the horizon, below the version of the schedule's index row, and not of a run the schedule
  still tracks (unsent, or running under an overlap policy). The same transaction stores the
  schedule's snapshot at its row's version (O2), so every deleted event is covered by it, and
  raises its ``pruned_through`` to the latest due time removed, so a backfill never decides one
  of them again (A6). Life-cycle events (created, changed, paused, resumed, deleted) stay: they
  are few, and they are the schedule's history (A1, A4).
* **Durable runs that have an outcome** (finished, faulted, cancelled, missed) and were last
  updated before the horizon: their row in ``celery_durable_runs`` and their ``run/<id>``
  stream.

Nothing that deciding needs is removed: the cursor, ``max_runs`` counts and the deleted flag
live in the snapshot and the index row, and a stream's newest event always stays (appends
check that their previous version exists). docs/retention.md has the whole design.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.engine import Connection

from celery_durable.core.codec import time_from_json
from celery_durable.core.ids import run_stream
from celery_durable.core.journal import StoredEvent
from celery_durable.core.schedule_aggregate import ScheduleState
from celery_durable.core.schedule_events import RUN_RECORD_TYPES, RunsMissed
from celery_durable.store.index import ScheduleIndex, fold_stored, stream_schedule_id
from celery_durable.store.journal.schema import events as events_table
from celery_durable.store.journal.schema import runs as runs_table
from celery_durable.store.journal.sql import SqlJournal, one_of
from celery_durable.store.runs import CANCELLED, FAULTED, FINISHED, MISSED
from celery_durable.store.snapshots import SnapshotStore

__all__ = ["DEFAULT_BATCH", "PruneReport", "Pruner"]

log = logging.getLogger("celery_durable.retention")

DEFAULT_BATCH = 100
"""Events (or runs) looked at per batch: one short transaction each."""

"""Schedule events that only record a run: the ones retention may remove."""

OVER = (FINISHED, FAULTED, CANCELLED, MISSED)
"""Statuses of a durable run that has an outcome."""

_VACUUM_PAGES = 2000


@dataclass(slots=True, kw_only=True)
class PruneReport:
    """What one pass removed (or, with ``dry_run``, would remove)."""

    horizon: datetime
    dry_run: bool = False
    schedule_events: int = 0
    snapshots: int = 0
    """Schedules whose snapshot the pass wrote (or would write)."""
    runs: int = 0
    run_events: int = 0
    batches: int = 0
    complete: bool = True
    """False when the pass stopped early (the dispatcher lost its lease, or is closing)."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["horizon"] = self.horizon.isoformat()
        return data


def _crash_point(name: str) -> None:
    """Die here, like ``kill -9``, when ``CELERY_DURABLE_TEST_CRASH`` names this point (tests)."""
    if os.environ.get("CELERY_DURABLE_TEST_CRASH") == name:
        os.kill(os.getpid(), signal.SIGKILL)


class Pruner:
    """Removes what retention allows, in batches of ``batch`` rows.

    ``keep_going`` is asked before each batch: the dispatcher's job stops there when it lost
    its lease. ``pause`` seconds are slept between batches so that other writers (the
    dispatcher's decisions) get the journal in between on SQLite.
    """

    def __init__(
        self, journal: SqlJournal, index: ScheduleIndex, *, batch: int = DEFAULT_BATCH
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch must be at least 1, not {batch!r}")
        self.journal = journal
        self.index = index
        self.batch = batch

    def prune(
        self,
        now: datetime,
        older_than: timedelta,
        *,
        dry_run: bool = False,
        keep_going: Callable[[], bool] = lambda: True,
        pause: float = 0.0,
    ) -> PruneReport:
        """One pass over the journal: every batch older than ``now - older_than``."""
        if older_than <= timedelta(0):
            raise ValueError(f"older_than must be positive, not {older_than}")
        report = PruneReport(horizon=now - older_than, dry_run=dry_run)

        def more() -> bool:
            if not keep_going():
                report.complete = False
                return False
            if pause and report.batches:
                time.sleep(pause)
            return True

        self._prune_schedules(report, now, more)
        if report.complete:
            self._prune_runs(report, more)
        if report.complete and not dry_run and (report.schedule_events or report.runs):
            self._return_space(more)
        log.info(
            "retention: %s %d schedule event(s) (%d snapshot(s)), %d run(s) with %d event(s)%s",
            "would remove" if dry_run else "removed",
            report.schedule_events,
            report.snapshots,
            report.runs,
            report.run_events,
            "" if report.complete else "; stopped early",
        )
        return report

    # Schedule events ------------------------------------------------------------------------

    def catch_up_index(self, now: datetime) -> None:
        """Fold the schedule events stored after the index position into the rows.

        Only the events below a row's version may go: without a dispatcher (the CLI), the rows
        are brought up to date first.
        """
        index = self.index
        position = index.position()
        events = index.events_after(position)
        if not events:
            return
        sids = sorted({stream_schedule_id(e.stream) for e in events})
        states = index.load(sids)
        changed = fold_stored(states, events, index.snapshots.state)
        index.save([states[s] for s in sorted(changed)], events[-1].position, now)

    def _prune_schedules(
        self, report: PruneReport, now: datetime, more: Callable[[], bool]
    ) -> None:
        position = 0
        snapshotted: set[str] = set()
        while more():
            batch = self.journal.read_all(position, category="schedule", limit=self.batch)
            if not batch:
                return
            position = batch[-1].position
            old: list[tuple[StoredEvent, datetime]] = []
            for event in batch:
                if event.type in RUN_RECORD_TYPES:
                    due = _due_of(event)
                    if due is not None and due < report.horizon:
                        old.append((event, due))
            if old:
                snapshotted |= self._prune_schedule_batch(old, report, now)
                report.snapshots = len(snapshotted)
            report.batches += 1
            # Positions follow time: once a batch ends in events after the horizon, the rest
            # of the journal is newer still.
            last_at = _at_of(batch[-1])
            if len(batch) < self.batch or (last_at is not None and last_at >= report.horizon):
                return

    def _prune_schedule_batch(
        self, old: Sequence[tuple[StoredEvent, datetime]], report: PruneReport, now: datetime
    ) -> set[str]:
        """Remove one batch's events with their schedules' snapshots; return those schedules."""
        sids = sorted({stream_schedule_id(e.stream) for e, _ in old})
        rows = self.index.load(sids)
        positions: list[int] = []
        covered: dict[str, tuple[ScheduleState, datetime]] = {}
        for event, due in old:
            sid = stream_schedule_id(event.stream)
            state = rows.get(sid)
            if state is None or event.version >= state.version or due in _tracked(state):
                continue
            positions.append(event.position)
            through = covered[sid][1] if sid in covered else due
            covered[sid] = (state, max(through, due))
        if not positions:
            return set()
        report.schedule_events += len(positions)
        if report.dry_run:
            return set(covered)
        with self.journal.transaction() as conn:
            for state, through in covered.values():
                SnapshotStore.write(conn, state, through, now)
            _crash_point("prune-batch")
            _delete_positions(conn, positions)
        return set(covered)

    # Durable runs ---------------------------------------------------------------------------

    def _prune_runs(self, report: PruneReport, more: Callable[[], bool]) -> None:
        after = ""
        table = runs_table
        while more():
            query = (
                select(table.c.run_id)
                .where(
                    table.c.status.in_(OVER),
                    table.c.updated_at < report.horizon,
                    table.c.run_id > after,
                )
                .order_by(table.c.run_id)
                .limit(self.batch)
            )
            with self.journal.engine.connect() as conn:
                ids = [row[0] for row in conn.execute(query)]
            if not ids:
                return
            after = ids[-1]
            report.batches += 1
            streams = [run_stream(r) for r in ids]
            if report.dry_run:
                with self.journal.engine.connect() as conn:
                    count = select(func.count()).where(one_of(conn, events_table.c.stream, streams))
                    report.run_events += int(conn.execute(count).scalar() or 0)
                report.runs += len(ids)
                continue
            with self.journal.transaction() as conn:
                # Only runs still over: a run sent again meanwhile (D8) keeps its journal.
                gone = conn.execute(
                    delete(table).where(one_of(conn, table.c.run_id, ids), table.c.status.in_(OVER))
                ).rowcount
                _crash_point("prune-runs")
                if gone != len(ids):
                    still = select(table.c.run_id).where(one_of(conn, table.c.run_id, ids))
                    kept = {row[0] for row in conn.execute(still)}
                    streams = [run_stream(r) for r in ids if r not in kept]
                removed = conn.execute(
                    delete(events_table).where(one_of(conn, events_table.c.stream, streams))
                ).rowcount
            report.runs += gone
            report.run_events += removed

    # Space ----------------------------------------------------------------------------------

    def _return_space(self, more: Callable[[], bool]) -> None:
        """SQLite: hand freed pages back to the file system (``auto_vacuum = INCREMENTAL``).

        A journal created before retention existed has ``auto_vacuum = NONE``; its freed pages
        stay in the file and are reused by new rows, so the file stops growing instead of
        shrinking (``VACUUM`` once converts it, docs/retention.md).
        """
        if self.journal.engine.dialect.name != "sqlite":
            return
        with self.journal.engine.connect() as conn:
            mode = int(conn.exec_driver_sql("PRAGMA auto_vacuum").scalar() or 0)
        if mode != 2:
            return
        before = None
        while more():
            with self.journal.transaction() as conn:
                free = int(conn.exec_driver_sql("PRAGMA freelist_count").scalar() or 0)
                if free == 0 or free == before:
                    return
                conn.exec_driver_sql(f"PRAGMA incremental_vacuum({_VACUUM_PAGES})")
            before = free


def _delete_positions(conn: Connection, positions: Sequence[int]) -> None:
    for start in range(0, len(positions), 1000):
        chunk = positions[start : start + 1000]
        conn.execute(delete(events_table).where(one_of(conn, events_table.c.position, chunk)))


def _tracked(state: ScheduleState) -> set[datetime]:
    """Due times of runs the schedule still tracks: their records stay."""
    return {p.due for p in state.pending} | set(state.running)


def _due_of(event: StoredEvent) -> datetime | None:
    data = _data(event)
    value = data.get("through" if event.type == RunsMissed.TYPE else "due")
    return time_from_json(value) if isinstance(value, str) else None


def _at_of(event: StoredEvent) -> datetime | None:
    value = _data(event).get("at")
    return time_from_json(value) if isinstance(value, str) else None


def _data(event: StoredEvent) -> dict[str, Any]:
    data: Any = event.data
    if isinstance(data, str):
        data = json.loads(data)
    return data if isinstance(data, dict) else {}
