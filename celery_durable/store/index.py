"""The schedule index: one row per schedule, kept by a projection of schedule events (D2).

Each row holds the folded :class:`~.schedule_aggregate.ScheduleState` (JSON, format
``STATE_FORMAT``), the stream version it has folded, and the moment the schedule next needs
the dispatcher (``next_due``: its earliest unsent run, else its rule's next due time). The
projection's read position lives in ``celery_durable_progress`` and is written in the same
transaction as the rows, so a crash can never separate them. Folding is idempotent: an event
whose version a row already has is skipped, so re-reading after a crash is harmless.

Start-up reads the ``(schedule_id, next_due)`` of the rows due soon (a window of due times,
the next one when its time comes) and only the events stored after the position — never the
whole history, nor every schedule (D13).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection

from celery_durable.core.codec import dumps, loads_written
from celery_durable.core.journal import Journal, StoredEvent
from celery_durable.core.partitions import PROJECTION, partition_of, progress_name, slot_of
from celery_durable.core.rules import LiveSchedules
from celery_durable.core.schedule_aggregate import STATE_FORMAT, ScheduleState
from celery_durable.errors import JournalError
from celery_durable.message import origin_of
from celery_durable.store.journal.database import Database
from celery_durable.store.journal.errors import translating
from celery_durable.store.journal.schema import progress, schedule_index
from celery_durable.store.journal.sql import SqlJournal
from celery_durable.store.snapshots import (
    SnapshotLookup,
    SnapshotStore,
    fold_with_snapshots,
    snapshot_map,
)

log = logging.getLogger("celery_durable.index")

READ_BATCH = 5000


class UnreadableEntry(JournalError):
    """An index row this version cannot read (written by a newer version, or damaged)."""


def attention_of(state: ScheduleState, live: LiveSchedules | None = None) -> datetime | None:
    """When the dispatcher must next look at a schedule (:meth:`ScheduleState.attention`);
    ``live`` evaluates ``BeatEntry`` rules where a beat holds their objects (B3)."""
    return state.attention(live=live)


def stream_schedule_id(stream: str) -> str:
    """The schedule ID of a ``schedule/<id>`` stream."""
    return stream.split("/", 1)[1]


def fold_stored(
    states: dict[str, ScheduleState],
    stored: Iterable[StoredEvent],
    snapshots: SnapshotLookup | None = None,
) -> set[str]:
    """Fold journal events into ``states`` (in place), skipping versions already folded.

    Returns the IDs of the schedules whose state changed. (The dispatcher folds its own
    appends at once and writes their rows in the same transaction, so it skips them here.)
    Where retention left a gap in a stream, the state continues from its snapshot (O2).
    """
    changed: set[str] = set()
    for event in stored:
        sid = stream_schedule_id(event.stream)
        if fold_with_snapshots(states, sid, event, snapshots):
            changed.add(sid)
    return changed


@translating
class ScheduleIndex:
    """Reads and writes the index rows and the projection position.

    ``live``: the beat's schedule objects, so that the ``next_due`` column of a ``BeatEntry``
    schedule is its object's answer (B3); ``None`` outside a beat.
    """

    def __init__(
        self,
        journal: SqlJournal,
        live: LiveSchedules | None = None,
        partitions: int | None = None,
    ) -> None:
        self.journal = journal
        self.live = live
        self.snapshots = SnapshotStore(journal)
        self._partitions = partitions

    @property
    def partitions(self) -> int:
        """The journal's partition count (D10), read once unless a beat sets it."""
        if self._partitions is None:
            from celery_durable.store.partitions import partition_count

            self._partitions = partition_count(self.journal)
        return self._partitions

    def use_partitions(self, count: int) -> None:
        """Work with ``count`` partitions from now on (the beat's, read once, D10)."""
        self._partitions = count

    def mine(self, schedule_id: str, held: Collection[int] | None) -> bool:
        """Whether a schedule is in one of the ``held`` partitions (``None``: all are)."""
        return held is None or partition_of(schedule_id, self.partitions) in held

    # Reads ------------------------------------------------------------------------------------

    def position(self, conn: Connection | None = None, held: Collection[int] | None = None) -> int:
        """The last event position folded into the rows of the ``held`` partitions (of all of
        them by default); 0 when none.

        Row ``schedule_index`` covers every partition; with several, row ``schedule_index/<k>``
        covers partition ``k`` (its holder saves it) and a partition counts from the higher
        of the two: rows never go back in version, so both stay true.
        """
        query = select(progress.c.name, progress.c.position).where(
            (progress.c.name == PROJECTION) | progress.c.name.like(f"{PROJECTION}/%")
        )
        if conn is not None:
            rows = {r[0]: r[1] for r in conn.execute(query)}
        else:
            self.journal.ensure_ready()
            with self.journal.engine.connect() as c:
                rows = {r[0]: r[1] for r in c.execute(query)}
        base = int(rows.get(PROJECTION) or 0)
        count = self.partitions
        if count == 1:
            return base
        wanted = range(count) if held is None else held
        return min(
            (max(int(rows.get(progress_name(k, count)) or 0), base) for k in wanted),
            default=base,
        )

    def attention_window(
        self, after: datetime | None, upto: datetime, held: Collection[int] | None = None
    ) -> tuple[list[tuple[str, datetime]], datetime | None]:
        """``(schedule_id, next_due)`` of the rows whose ``next_due`` is after ``after`` (from
        the earliest when ``None``) and at most ``upto`` (of the ``held`` partitions only), and
        the earliest ``next_due`` later than ``upto`` (``None``: no row is due later).

        Two indexed reads: beat's start-up reads the due times of a window, not of every
        schedule (D13); the dispatcher reads the next window when its time comes.
        """
        self.journal.ensure_ready()
        column = schedule_index.c.next_due
        mine = []
        count = self.partitions
        if held is not None and count > 1:
            mine.append((schedule_index.c.slot % count).in_(sorted(held)))
        lower = column.is_not(None) if after is None else column > after
        rows_query = select(schedule_index.c.schedule_id, column).where(
            lower, column <= upto, *mine
        )
        later_query = select(func.min(column)).where(column > upto, *mine)
        with self.journal.engine.connect() as conn:
            rows = [(r[0], r[1]) for r in conn.execute(rows_query).all()]
            later = conn.execute(later_query).scalar()
        return rows, later

    def waiting_at(self, now: datetime, limit: int) -> list[str]:
        """The IDs of up to ``limit`` schedules whose ``next_due`` is at or before ``now``,
        oldest first (an indexed read: the health check's candidates, O3)."""
        self.journal.ensure_ready()
        column = schedule_index.c.next_due
        query = (
            select(schedule_index.c.schedule_id)
            .where(column.is_not(None), column <= now)
            .order_by(column)
            .limit(limit)
        )
        with self.journal.engine.connect() as conn:
            return list(conn.execute(query).scalars())

    def waiting_rows(self, now: datetime, limit: int) -> list[tuple[str, datetime]]:
        """``(schedule_id, next_due)`` of up to ``limit`` rows due at or before ``now``, oldest
        first (the lag of each partition, D11)."""
        self.journal.ensure_ready()
        column = schedule_index.c.next_due
        query = (
            select(schedule_index.c.schedule_id, column)
            .where(column.is_not(None), column <= now)
            .order_by(column)
            .limit(limit)
        )
        with self.journal.engine.connect() as conn:
            return [(r[0], r[1]) for r in conn.execute(query)]

    def count(self) -> int:
        self.journal.ensure_ready()
        with self.journal.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(schedule_index)).scalar() or 0)

    def load(self, schedule_ids: Sequence[str] | None = None) -> dict[str, ScheduleState]:
        """States from the rows (all of them when ``schedule_ids`` is None); ``UnreadableEntry``."""
        self.journal.ensure_ready()
        query = select(schedule_index.c.schedule_id, schedule_index.c.state)
        found: dict[str, ScheduleState] = {}
        with self.journal.engine.connect() as conn:
            rows: list[Any] = []  # fetched at once, not row by row
            if schedule_ids is None:
                rows.extend(conn.execute(query).all())
            else:
                ids = list(schedule_ids)
                for start in range(0, len(ids), 1000):
                    chunk = ids[start : start + 1000]
                    where = self.journal.database.one_of(schedule_index.c.schedule_id, chunk)
                    rows.extend(conn.execute(query.where(where)).all())
        for sid, text in rows:
            found[sid] = read_entry(sid, text)
        return found

    def with_origin(self, origin: str) -> list[str]:
        """The IDs of the rows whose schedule came from ``origin`` (an indexed read, D13)."""
        self.journal.ensure_ready()
        query = select(schedule_index.c.schedule_id).where(schedule_index.c.origin == origin)
        with self.journal.engine.connect() as conn:
            return list(conn.execute(query).scalars())

    def events_after(self, position: int) -> list[StoredEvent]:
        """Every schedule event stored after ``position``, oldest first."""
        return schedule_events_after(self.journal, position)

    # Writes -----------------------------------------------------------------------------------

    def save(
        self,
        states: Iterable[ScheduleState],
        position: int,
        now: datetime,
        held: Collection[int] | None = None,
    ) -> None:
        """Write rows and the read position (of the ``held`` partitions, else of all) in one
        transaction; rows never go back in version."""
        rows = [entry_row(s, now, self.live) for s in states]
        count = self.partitions
        names = (
            [PROJECTION]
            if held is None or count == 1
            else [progress_name(k, count) for k in sorted(held)]
        )
        with self.journal.transaction() as conn:
            if rows:
                upsert(conn, self.journal.database, rows)
            for name in names:
                _set_position(conn, position, name)

    def rebuild(self, now: datetime) -> dict[str, ScheduleState]:
        """Drop every row and fold the whole schedule history again (logged)."""
        log.warning("rebuilding the schedule index from the journal's events")
        states: dict[str, ScheduleState] = {}
        events = self.events_after(0)
        fold_stored(states, events, snapshot_map(self.snapshots.load()))
        position = events[-1].position if events else 0
        rows = [entry_row(s, now, self.live) for s in states.values()]
        with self.journal.transaction() as conn:
            conn.execute(delete(schedule_index))
            for start in range(0, len(rows), 1000):
                conn.execute(insert(schedule_index), rows[start : start + 1000])
            conn.execute(
                delete(progress).where(
                    (progress.c.name == PROJECTION) | progress.c.name.like(f"{PROJECTION}/%")
                )
            )
            conn.execute(insert(progress).values(name=PROJECTION, position=position))
        log.warning("schedule index rebuilt: %d schedules, position %d", len(states), position)
        return states

    def needs_rebuild(self) -> bool:
        """True when the rows cannot match the position (the table was dropped and recreated)."""
        if self.position() == 0:
            return False
        with self.journal.engine.connect() as conn:  # one row's look, not a count of them all
            return conn.execute(select(schedule_index.c.schedule_id).limit(1)).first() is None


def schedule_events_after(journal: Journal, position: int) -> list[StoredEvent]:
    """Every schedule event ``journal`` stored after ``position``, oldest first, read in
    batches of :data:`READ_BATCH`."""
    out: list[StoredEvent] = []
    while True:
        batch = journal.read_all(position, category="schedule", limit=READ_BATCH)
        out.extend(batch)
        if len(batch) < READ_BATCH:
            return out
        position = batch[-1].position


def read_entry(schedule_id: str, text: str) -> ScheduleState:
    """Parse one index row; ``UnreadableEntry`` names the schedule when it cannot."""
    try:
        return ScheduleState.from_json(loads_written(text))
    except (ValueError, KeyError, TypeError, JournalError) as exc:
        raise UnreadableEntry(
            f"index entry of schedule {schedule_id!r} is unreadable: {exc}", schedule_id=schedule_id
        ) from exc


def entry_row(
    state: ScheduleState, now: datetime, live: LiveSchedules | None = None
) -> dict[str, Any]:
    """The index row of a state."""
    return {
        "schedule_id": state.schedule_id,
        "version": state.version,
        "format": STATE_FORMAT,
        "next_due": attention_of(state, live),
        "state": dumps(state.to_json()),
        "updated_at": now,
        "origin": None if state.content is None else origin_of(state.content.options),
        "slot": slot_of(state.schedule_id),
    }


_ROW_COLUMNS = ("version", "format", "next_due", "state", "updated_at", "origin")


def upsert(conn: Connection, database: Database, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert or update rows, keeping the one with the higher version."""
    stmt = database.insert_newer(schedule_index, "schedule_id", _ROW_COLUMNS, "version")
    for start in range(0, len(rows), 1000):
        conn.execute(stmt, list(rows[start : start + 1000]))


def _set_position(conn: Connection, position: int, name: str = PROJECTION) -> None:
    done = conn.execute(
        update(progress)
        .where(progress.c.name == name, progress.c.position <= position)
        .values(position=position)
    ).rowcount
    if not done:
        exists = conn.execute(select(progress.c.position).where(progress.c.name == name)).first()
        if exists is None:
            conn.execute(insert(progress).values(name=name, position=position))


__all__ = [
    "PROJECTION",
    "ScheduleIndex",
    "UnreadableEntry",
    "attention_of",
    "entry_row",
    "fold_stored",
    "read_entry",
    "upsert",
]
