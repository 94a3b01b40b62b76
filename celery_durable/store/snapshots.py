"""Schedule snapshots (O2): the folded state of a schedule stream at a version, one row per stream.

Retention (O1, :mod:`celery_durable.store.retention`) deletes the run events of a stream below
its snapshot's version, so a stream may have gaps. Every reader that folds a stream from an
older state goes through :func:`fold_stream` (one stream) or ``fold_stored`` of the index (many
streams): at a gap they take the snapshot, which covers every deleted event, and fold only the
events after it. ``fold(all events) == fold(snapshot) + later events`` is what makes that
correct; tests/store/test_snapshots.py proves it by property.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import case, insert, select, update
from sqlalchemy.engine import Connection

from celery_durable.core.codec import dumps
from celery_durable.core.ids import schedule_stream
from celery_durable.core.journal import StoredEvent
from celery_durable.core.schedule_aggregate import STATE_FORMAT, ScheduleState, fold
from celery_durable.core.schedule_events import from_stored
from celery_durable.errors import JournalError
from celery_durable.store.journal.errors import translating
from celery_durable.store.journal.schema import snapshots as snapshots_table
from celery_durable.store.journal.sql import SqlJournal

__all__ = ["Snapshot", "SnapshotLookup", "SnapshotStore", "fold_stream", "fold_with_snapshots"]

SnapshotLookup = Callable[[str], ScheduleState | None]
"""Schedule ID → its snapshot's state (``None`` when it has none)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """A stored snapshot: the state at ``state.version`` and what retention removed before it."""

    state: ScheduleState
    pruned_through: datetime | None = None


@translating
class SnapshotStore:
    """Reads and writes ``celery_durable_snapshots``."""

    def __init__(self, journal: SqlJournal) -> None:
        self.journal = journal

    def load(self, schedule_ids: Sequence[str] | None = None) -> dict[str, Snapshot]:
        """The snapshots of these schedules (of every schedule when ``None``), by ID."""
        self.journal.ensure_ready()
        table = snapshots_table
        query = select(table.c.stream, table.c.state, table.c.pruned_through)
        rows: list[Any] = []
        with self.journal.engine.connect() as conn:
            if schedule_ids is None:
                rows = list(conn.execute(query))
            else:
                streams = [schedule_stream(s) for s in schedule_ids]
                for start in range(0, len(streams), 1000):
                    where = self.journal.database.one_of(
                        table.c.stream, streams[start : start + 1000]
                    )
                    rows.extend(conn.execute(query.where(where)))
        found: dict[str, Snapshot] = {}
        for stream, text, pruned in rows:
            if not stream.startswith("schedule/"):
                continue
            sid = stream.split("/", 1)[1]
            try:
                state = ScheduleState.from_json(json.loads(text))
            except (ValueError, KeyError, TypeError) as exc:
                raise JournalError(
                    f"snapshot of schedule {sid!r} is unreadable: {exc}", schedule_id=sid
                ) from exc
            found[sid] = Snapshot(state=state, pruned_through=pruned)
        return found

    def state(self, schedule_id: str) -> ScheduleState | None:
        """The snapshot state of one schedule (a :data:`SnapshotLookup`)."""
        snap = self.load([schedule_id]).get(schedule_id)
        return None if snap is None else snap.state

    def pruned_through(self, schedule_id: str) -> datetime | None:
        """The latest due time whose records retention removed (``None``: nothing removed)."""
        snap = self.load([schedule_id]).get(schedule_id)
        return None if snap is None else snap.pruned_through

    @staticmethod
    def write(
        conn: Connection, state: ScheduleState, pruned_through: datetime | None, now: datetime
    ) -> None:
        """Store a snapshot in the caller's transaction; a stored one never goes back in version.

        ``pruned_through`` only grows. When a newer snapshot is already stored (another prune
        got there first) it is kept: it covers everything this one covers.
        """
        table = snapshots_table
        stream = schedule_stream(state.schedule_id)
        later = _max_pruned(pruned_through)
        done = conn.execute(
            update(table)
            .where(table.c.stream == stream, table.c.version <= state.version)
            .values(
                version=state.version,
                format=STATE_FORMAT,
                state=dumps(state.to_json()),
                pruned_through=later,
                taken_at=now,
            )
        ).rowcount
        if done:
            return
        found = conn.execute(select(table.c.version).where(table.c.stream == stream)).first()
        if found is None:
            conn.execute(
                insert(table).values(
                    stream=stream,
                    version=state.version,
                    format=STATE_FORMAT,
                    state=dumps(state.to_json()),
                    pruned_through=pruned_through,
                    taken_at=now,
                )
            )
        elif pruned_through is not None:
            conn.execute(update(table).where(table.c.stream == stream).values(pruned_through=later))


def _max_pruned(pruned_through: datetime | None) -> Any:
    """``max(stored pruned_through, pruned_through)`` as a SQL expression (NULL is the least)."""
    column = snapshots_table.c.pruned_through
    if pruned_through is None:
        return column
    return case(
        (column.is_(None), pruned_through),
        (column < pruned_through, pruned_through),
        else_=column,
    )


def fold_with_snapshots(
    states: dict[str, ScheduleState],
    sid: str,
    event: StoredEvent,
    lookup: SnapshotLookup | None,
) -> bool:
    """Fold one stored event of schedule ``sid`` into ``states``; at a gap, start from the
    snapshot. Returns whether the state changed. ``JournalError`` for a gap no snapshot covers.
    """
    state = states.get(sid) or ScheduleState(schedule_id=sid)
    if event.version <= state.version:
        return False
    if event.version != state.version + 1:
        snap = lookup(sid) if lookup is not None else None
        if snap is None or snap.version < event.version - 1:
            raise JournalError(
                f"schedule {sid!r}: event version {event.version} follows {state.version}",
                schedule_id=sid,
            )
        state = snap
        if event.version <= state.version:
            states[sid] = state
            return True
    states[sid] = fold(state, from_stored(event))
    return True


def fold_stream(
    state: ScheduleState, tail: Iterable[StoredEvent], lookup: SnapshotLookup
) -> ScheduleState:
    """``state`` after the events of its stream stored after it (a gap: from the snapshot)."""
    states = {state.schedule_id: state}
    for event in tail:
        fold_with_snapshots(states, state.schedule_id, event, lookup)
    return states[state.schedule_id]


def snapshot_map(found: Mapping[str, Snapshot]) -> SnapshotLookup:
    """A lookup over snapshots already read (a rebuild reads them all at once)."""

    def lookup(sid: str) -> ScheduleState | None:
        snap = found.get(sid)
        return None if snap is None else snap.state

    return lookup
