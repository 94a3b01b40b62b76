"""The schedule index in memory: :class:`~celery_durable.store.index.ScheduleIndex` without SQL.

The rows live in the :class:`~celery_durable.store.memory.MemoryStore` (written by its units
of work and by :meth:`MemoryIndex.save`), with the SQL table's columns, so that what the
dispatcher and the schedule API read is what they would read from the table. A memory store
has one partition and no retention: no snapshots, no gaps in a stream.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from celery_durable.core.journal import StoredEvent
from celery_durable.core.partitions import PROJECTION
from celery_durable.core.rules import LiveSchedules
from celery_durable.core.schedule_aggregate import ScheduleState
from celery_durable.store.index import (
    entry_row,
    fold_stored,
    read_entry,
    schedule_events_after,
)

if TYPE_CHECKING:
    from celery_durable.store.memory import MemoryStore


class NoSnapshots:
    """The snapshots of a store without retention: none (O2)."""

    def state(self, schedule_id: str) -> ScheduleState | None:
        """No snapshot state (a :data:`~celery_durable.store.snapshots.SnapshotLookup`)."""
        return None

    def pruned_through(self, schedule_id: str) -> datetime | None:
        """Nothing was ever removed."""
        return None


class MemoryIndex:
    """Reads and writes the memory store's index rows and the projection position (D2)."""

    def __init__(self, store: MemoryStore, live: LiveSchedules | None = None) -> None:
        self._store = store
        self.live = live
        self.snapshots = NoSnapshots()

    @property
    def partitions(self) -> int:
        """One partition: a memory store belongs to one process (D10)."""
        return 1

    def use_partitions(self, count: int) -> None:
        """Only one partition is possible here (the dispatcher's count, D10)."""
        if count != 1:
            raise ValueError(f"a memory store has one partition, not {count}")

    def mine(self, schedule_id: str, held: Collection[int] | None) -> bool:
        """Whether a schedule is in one of the ``held`` partitions (``None``: all are)."""
        return held is None or 0 in held

    # Reads ------------------------------------------------------------------------------------

    def position(self, held: Collection[int] | None = None) -> int:
        """The last event position folded into the rows; 0 when none."""
        with self._store.lock:
            return self._store.progress.get(PROJECTION, 0)

    def attention_window(
        self, after: datetime | None, upto: datetime, held: Collection[int] | None = None
    ) -> tuple[list[tuple[str, datetime]], datetime | None]:
        """``(schedule_id, next_due)`` of the rows due after ``after`` (from the earliest when
        ``None``) up to ``upto``, and the earliest ``next_due`` after ``upto``."""
        rows: list[tuple[str, datetime]] = []
        later: datetime | None = None
        with self._store.lock:
            for sid, row in self._store.index_rows.items():
                when = row["next_due"]
                if when is None or (after is not None and when <= after):
                    continue
                if when <= upto:
                    rows.append((sid, when))
                elif later is None or when < later:
                    later = when
        return rows, later

    def waiting_rows(self, now: datetime, limit: int) -> list[tuple[str, datetime]]:
        """``(schedule_id, next_due)`` of up to ``limit`` rows due at or before ``now``."""
        with self._store.lock:
            rows = [
                (sid, row["next_due"])
                for sid, row in self._store.index_rows.items()
                if row["next_due"] is not None and row["next_due"] <= now
            ]
        rows.sort(key=lambda pair: pair[1])
        return rows[:limit]

    def waiting_at(self, now: datetime, limit: int) -> list[str]:
        """The IDs of up to ``limit`` schedules whose ``next_due`` is at or before ``now``."""
        return [sid for sid, _ in self.waiting_rows(now, limit)]

    def count(self) -> int:
        with self._store.lock:
            return len(self._store.index_rows)

    def load(self, schedule_ids: Sequence[str] | None = None) -> dict[str, ScheduleState]:
        """States from the rows (all of them when ``schedule_ids`` is None)."""
        with self._store.lock:
            rows = self._store.index_rows
            wanted = list(rows) if schedule_ids is None else schedule_ids
            texts = {sid: rows[sid]["state"] for sid in wanted if sid in rows}
        return {sid: read_entry(sid, text) for sid, text in texts.items()}

    def with_origin(self, origin: str) -> list[str]:
        """The IDs of the rows whose schedule came from ``origin`` (D13)."""
        with self._store.lock:
            return [sid for sid, row in self._store.index_rows.items() if row["origin"] == origin]

    def events_after(self, position: int) -> list[StoredEvent]:
        """Every schedule event stored after ``position``, oldest first."""
        return schedule_events_after(self._store.journal, position)

    # Writes -----------------------------------------------------------------------------------

    def save(
        self,
        states: Iterable[ScheduleState],
        position: int,
        now: datetime,
        held: Collection[int] | None = None,
    ) -> None:
        """Write rows and the read position together; rows never go back in version."""
        rows = [entry_row(s, now, self.live) for s in states]
        with self._store.lock:
            self._store.upsert_index(rows)
            if self._store.progress.get(PROJECTION, 0) <= position:
                self._store.progress[PROJECTION] = position

    def rebuild(self, now: datetime) -> dict[str, ScheduleState]:
        """Drop every row and fold the whole schedule history again."""
        states: dict[str, ScheduleState] = {}
        with self._store.lock:
            events = self.events_after(0)
            fold_stored(states, events)
            self._store.index_rows.clear()
            self._store.upsert_index([entry_row(s, now, self.live) for s in states.values()])
            self._store.progress.clear()
            self._store.progress[PROJECTION] = events[-1].position if events else 0
        return states

    def needs_rebuild(self) -> bool:
        """True when the rows cannot match the position."""
        return self.position() > 0 and self.count() == 0


__all__ = ["MemoryIndex", "NoSnapshots"]
