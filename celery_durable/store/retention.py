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
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.engine import Connection

from celery_durable.core.codec import time_from_json
from celery_durable.core.ids import run_stream
from celery_durable.core.journal import StoredEvent
from celery_durable.core.limits import EARLIEST
from celery_durable.core.schedule_aggregate import ScheduleState
from celery_durable.core.schedule_events import RUN_RECORD_TYPES, RunsMissed
from celery_durable.store.index import ScheduleIndex, fold_stored, stream_schedule_id
from celery_durable.store.journal.database import Database
from celery_durable.store.journal.errors import translating
from celery_durable.store.journal.schema import events as events_table
from celery_durable.store.journal.schema import runs as runs_table
from celery_durable.store.journal.sql import SqlJournal
from celery_durable.store.runs import CANCELLED, FAILED_TO_START, FAULTED, FINISHED, MISSED
from celery_durable.store.snapshots import SnapshotStore

__all__ = ["DEFAULT_BATCH", "LATE", "PruneProgress", "PruneReport", "Pruner", "TailMemory"]

log = logging.getLogger("celery_durable.retention")

DEFAULT_BATCH = 100
"""Events (or runs) looked at per batch: one short transaction each."""

LATE = timedelta(minutes=10)
"""A run record stored this long or longer after its due time is *late* (a backfill, a catch-up
after downtime, the end of a long run): a pass finds it by the tail scan, not the head scan."""

TAIL_MEMORY = 100_000
"""Late records a :class:`TailMemory` keeps at most (about 100 bytes each)."""

OVER = (FINISHED, FAULTED, CANCELLED, MISSED, FAILED_TO_START)
"""Statuses of a durable run that has an outcome."""


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
    events_read: int = 0
    """Schedule events the pass read (head scan, tail scan and late records)."""
    complete: bool = True
    """True when the pass removed everything eligible; False when it stopped early (the
    dispatcher lost its lease, or is closing)."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["horizon"] = self.horizon.isoformat()
        return data


@dataclass(frozen=True, slots=True, kw_only=True)
class PruneProgress:
    """Where a pass is, after each batch: for a progress line (``celery durable prune``)."""

    phase: str
    """``"late records"``, ``"head"``, ``"tail"`` (schedule events) or ``"runs"``."""
    position: int
    """The last schedule event position the head or tail scan read."""
    head: int
    """The journal's last schedule event position when the pass started."""
    report: PruneReport


@dataclass(slots=True)
class TailMemory:
    """What the dispatcher's passes carry from one to the next (O1), so that each reads the
    tail of the journal once: how far it was read, and the late records found in it that
    could not go yet (position → due time).

    A pass without one (``celery durable prune``) reads the whole tail. When the memory is full
    a late record is forgotten and ``floor`` keeps the earliest due time forgotten: once the
    horizon passes it, the next pass forgets everything and reads the tail again.
    """

    position: int = 0
    late: dict[int, datetime] = field(default_factory=dict)
    floor: datetime | None = None
    limit: int = TAIL_MEMORY

    def remember(self, position: int, due: datetime) -> None:
        if position in self.late or len(self.late) < self.limit:
            self.late[position] = due
        elif self.floor is None or due < self.floor:
            self.floor = due

    def due_before(self, horizon: datetime) -> list[int]:
        """Positions of the remembered late records due before ``horizon``, in order."""
        return sorted(p for p, due in self.late.items() if due < horizon)

    def forget(self) -> None:
        self.position = 0
        self.late.clear()
        self.floor = None


@dataclass(slots=True, kw_only=True)
class _Scan:
    """One pass's bookkeeping over the schedule events."""

    report: PruneReport
    now: datetime
    head: int
    tail: TailMemory | None
    progress: Callable[[PruneProgress], None] | None = None
    position: int = 0
    snapshotted: set[str] = field(default_factory=set)

    def show(self, phase: str) -> None:
        if self.progress is not None:
            self.progress(
                PruneProgress(
                    phase=phase, position=self.position, head=self.head, report=self.report
                )
            )


@translating
class Pruner:
    """Removes what retention allows, in batches of ``batch`` rows.

    ``keep_going`` is asked before each batch: the dispatcher's job stops there when it lost
    its lease. ``pause`` seconds are slept between batches so that other writers (the
    dispatcher's decisions) get the journal in between on SQLite. ``fault`` is the runtime's
    fault hook, called at the named points ``prune-batch`` and ``prune-runs`` (crash tests).
    """

    def __init__(
        self,
        journal: SqlJournal,
        index: ScheduleIndex,
        *,
        batch: int = DEFAULT_BATCH,
        fault: Callable[[str], None] = lambda point: None,
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch must be at least 1, not {batch!r}")
        self.journal = journal
        self.index = index
        self.batch = batch
        self.fault = fault

    def prune(
        self,
        now: datetime,
        older_than: timedelta,
        *,
        dry_run: bool = False,
        keep_going: Callable[[], bool] = lambda: True,
        pause: float = 0.0,
        tail: TailMemory | None = None,
        progress: Callable[[PruneProgress], None] | None = None,
    ) -> PruneReport:
        """One pass: remove everything eligible before ``now - older_than``, in batches.

        The run records of the schedule events go whatever order they were stored in: a head
        scan reads from the start while events were recorded before the horizon, a tail scan
        reads the rest for the late records (backfills, catch-ups after downtime). ``tail``
        (the dispatcher's) remembers how far the tail was read and the late records found in
        it, so that the next pass reads only what is new. ``progress`` is called after each
        batch. The report says ``complete`` only when nothing eligible was left.
        """
        if older_than <= timedelta(0):
            raise ValueError(f"older_than must be positive, not {older_than}")
        # A retention reaching before every instant a rule may name (core.limits.EARLIEST)
        # keeps everything; now - older_than could not even be written as a date.
        horizon = now - older_than if older_than < now - EARLIEST else EARLIEST
        report = PruneReport(horizon=horizon, dry_run=dry_run)
        if dry_run:
            tail = None  # a count reads everything and leaves the memory as it was
        head = self.journal.head("schedule") if progress is not None else 0  # for the line only
        seen = _Scan(report=report, now=now, head=head, tail=tail, progress=progress)

        def more() -> bool:
            if not keep_going():
                report.complete = False
                return False
            if pause and report.batches:
                time.sleep(pause)
            return True

        self._prune_schedules(seen, more)
        if report.complete:
            self._prune_runs(seen, more)
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

    def _prune_schedules(self, seen: _Scan, more: Callable[[], bool]) -> None:
        """Late records remembered, then the head scan and the tail scan (docs/retention.md)."""
        report, tail = seen.report, seen.tail
        if tail is not None:
            if tail.floor is not None and tail.floor < report.horizon:
                tail.forget()  # the memory was full: read the whole tail again
            self._prune_late(seen, tail.due_before(report.horizon), more, tail)
        # Twice LATE: an event recorded on time by a writer whose clock is up to LATE behind
        # is still due after the horizon.
        end, finished = self._scan(seen, 0, more, stop=report.horizon + 2 * LATE)
        if finished or not report.complete:
            if tail is not None and finished:
                tail.position = max(tail.position, end)
            return
        start = end if tail is None else max(end, tail.position)
        last, finished = self._scan(seen, start, more, stop=None)
        if tail is not None and finished:
            tail.position = last

    def _scan(
        self, seen: _Scan, start: int, more: Callable[[], bool], *, stop: datetime | None
    ) -> tuple[int, bool]:
        """Read the schedule events after ``start`` in batches, removing the old ones.

        The head scan (``stop`` given) ends after the first batch whose last event was
        recorded at ``stop`` or later: positions follow recording times, so no later event
        recorded on time is old. Returns the last position read and whether the scan reached
        the end of the journal.
        """
        position = start
        while more():
            batch = self.journal.read_all(position, category="schedule", limit=self.batch)
            if not batch:
                return position, True
            position = batch[-1].position
            self._prune_read(seen, batch, "head" if stop is not None else "tail")
            if len(batch) < self.batch:
                return position, True
            last_at = _at_of(batch[-1])
            if stop is not None and last_at is not None and last_at >= stop:
                return position, False
        return position, False

    def _prune_late(
        self, seen: _Scan, due: Sequence[int], more: Callable[[], bool], tail: TailMemory
    ) -> None:
        """Remove the remembered late records whose due time passed the horizon."""
        for start in range(0, len(due), self.batch):
            if not more():
                return
            chunk = due[start : start + self.batch]
            kept = self._prune_read(seen, self.journal.read_positions(chunk), "late records")
            # Forgotten only once removed (or gone): a batch that fails keeps them for the next.
            for position in set(chunk) - kept:
                tail.late.pop(position, None)

    def _prune_read(self, seen: _Scan, batch: Sequence[StoredEvent], phase: str) -> set[int]:
        """Remove what one batch read holds that may go; remember (and return the positions
        of) the late records it keeps.

        A late record (due ``LATE`` or more before it was recorded) may be old long before a
        head scan reaches it: the tail memory keeps it, with the old ones that must stay for
        now (a run still tracked).
        """
        report = seen.report
        old: list[tuple[StoredEvent, datetime]] = []
        late: list[tuple[StoredEvent, datetime]] = []
        for event in batch:
            if event.type not in RUN_RECORD_TYPES:
                continue
            due = _due_of(event)
            if due is None:
                continue
            if due < report.horizon:
                old.append((event, due))
            else:
                at = _at_of(event)
                if at is not None and due <= at - LATE:
                    late.append((event, due))
        removed = self._prune_schedule_batch(old, seen) if old else set()
        late.extend(pair for pair in old if pair[0].position not in removed)
        if seen.tail is not None:
            for event, due in late:
                seen.tail.remember(event.position, due)
        report.events_read += len(batch)
        report.batches += 1
        if batch and phase != "late records":
            seen.position = max(seen.position, batch[-1].position)
        seen.show(phase)
        return {event.position for event, _ in late}

    def _prune_schedule_batch(
        self, old: Sequence[tuple[StoredEvent, datetime]], seen: _Scan
    ) -> set[int]:
        """Remove one batch's events with their schedules' snapshots; return their positions."""
        report = seen.report
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
        seen.snapshotted |= set(covered)
        report.snapshots = len(seen.snapshotted)
        if report.dry_run:
            return set(positions)
        with self.journal.transaction() as conn:
            for state, through in covered.values():
                SnapshotStore.write(conn, state, through, seen.now)
            self.fault("prune-batch")
            _delete_positions(conn, self.journal.database, positions)
        return set(positions)

    # Durable runs ---------------------------------------------------------------------------

    def _prune_runs(self, seen: _Scan, more: Callable[[], bool]) -> None:
        report = seen.report
        after = ""
        table = runs_table
        one_of = self.journal.database.one_of
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
                    count = select(func.count()).where(one_of(events_table.c.stream, streams))
                    report.run_events += int(conn.execute(count).scalar() or 0)
                report.runs += len(ids)
                seen.show("runs")
                continue
            with self.journal.transaction() as conn:
                # Only runs still over: a run sent again meanwhile (D8) keeps its journal.
                gone = conn.execute(
                    delete(table).where(one_of(table.c.run_id, ids), table.c.status.in_(OVER))
                ).rowcount
                self.fault("prune-runs")
                if gone != len(ids):
                    still = select(table.c.run_id).where(one_of(table.c.run_id, ids))
                    kept = {row[0] for row in conn.execute(still)}
                    streams = [run_stream(r) for r in ids if r not in kept]
                removed = conn.execute(
                    delete(events_table).where(one_of(events_table.c.stream, streams))
                ).rowcount
            report.runs += gone
            report.run_events += removed
            seen.show("runs")

    # Space ----------------------------------------------------------------------------------

    def _return_space(self, more: Callable[[], bool]) -> None:
        """Hand freed pages back to the file system where the database needs it (SQLite)."""
        journal = self.journal
        journal.database.return_space(journal.engine, journal.transaction, more)


def _delete_positions(conn: Connection, database: Database, positions: Sequence[int]) -> None:
    for start in range(0, len(positions), 1000):
        chunk = positions[start : start + 1000]
        conn.execute(delete(events_table).where(database.one_of(events_table.c.position, chunk)))


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
