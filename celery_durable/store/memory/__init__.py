"""The store in this process's memory: the journal, the run table, the schedule index, leases.

:class:`MemoryStore` keeps the promises of :class:`~celery_durable.store.sql_store.SqlStore`
for one process: a unit of work stores its events, run rows and index rows all together or
not at all (it holds the store's lock from start to end, as SQLite lets one writer in at a
time), appends keep their optimistic concurrency (A8) and the same checks of what is appended.
A :class:`~celery_durable.runtime.Runtime` built on it (``Durable(app, store=MemoryStore())``)
runs the schedule API, the dispatcher and durable tasks applied in the process, so that tests
of what the core and the dispatcher decide need no database (APScheduler's memory data store
plays the same part). Nothing is shared with another process and nothing survives this one:
it is no store for beat or workers, and it keeps everything (no retention).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery_durable.core.journal import Append
from celery_durable.core.partitions import PartitionsError
from celery_durable.core.rules import LiveSchedules
from celery_durable.core.schedule_aggregate import ScheduleState
from celery_durable.core.unit_of_work import SentRun, check_run_values, countdown_left
from celery_durable.errors import AppendConflict, JournalError
from celery_durable.store.journal.encoding import _rows
from celery_durable.store.journal.memory import MemoryJournal
from celery_durable.store.memory.index import MemoryIndex
from celery_durable.store.memory.leases import MemoryLeases
from celery_durable.store.memory.runs import MemoryRunTable

if TYPE_CHECKING:
    from celery_durable.core.unit_of_work import Store, UnitOfWork


class MemoryUnitOfWork:
    """The writes of one unit of work of a :class:`MemoryStore`, applied when it ends.

    Every check runs when a write is asked for (an ``AppendConflict`` at once, as the SQL
    statement would); the writes are applied in order at the end of the ``with`` block.
    """

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._staged: dict[str, int] = {}
        self._writes: list[Callable[[], None]] = []
        self._woken: set[str] = set()
        self.failed = False
        """Whether an append of this unit conflicted (then nothing of it is stored)."""

    def append(self, appends: Sequence[Append]) -> list[int]:
        """Append at the expected versions; each stream's new version (``AppendConflict``)."""
        rows, versions = _rows(appends)
        journal = self._store.journal
        try:
            journal.check(appends, self._staged)
        except AppendConflict:
            self.failed = True
            raise
        for append in appends:
            self._staged[append.stream] = append.expected_version + len(append.events)
        self._writes.append(lambda: journal.commit(rows))
        return versions

    def save_run(self, run_id: str, values: Mapping[str, Any], *, now: datetime) -> None:
        """Update (or create) the run's row."""
        check_run_values(values)
        changed = dict(values)
        self._writes.append(lambda: self._store.runs.save(run_id, changed, now))

    def record_sent(self, sent: Sequence[SentRun], *, now: datetime, lease: float) -> None:
        """Queued rows for runs just sent; existing rows stay (D8)."""
        runs = list(sent)
        self._writes.append(lambda: self._store.runs.add_sent(runs, now, lease))

    def wake(
        self, run_id: str, *, now: datetime, lease: float, at_once: bool = False
    ) -> SentRun | None:
        """Mark a suspended run's row as being sent again (or count down its children's
        ends); its message, or ``None``. The store's lock is held for the whole unit: the
        check and the write are one step."""
        runs = self._store.runs
        if run_id in self._woken:
            return None  # this unit marked it already
        row = runs.waiting_row(run_id, now, lease)
        if row is None:
            return None
        if not at_once and (row["wake_after"] or 0) > 1:
            self._writes.append(lambda: runs.count_down(run_id))
            return None
        self._woken.add(run_id)
        self._writes.append(lambda: runs.mark_woken(run_id, now, lease))
        return runs.message_of(run_id)

    def wait_for(
        self, run_id: str, children: Sequence[str], *, wake_after: int, now: datetime, lease: float
    ) -> SentRun | None:
        """The suspended run waits for ``wake_after`` of ``children`` to end (W11): its row
        is written by this unit's ``save_run`` when the unit is applied, so the countdown (or
        the mark) is applied after it."""
        runs = self._store.runs
        countdown = countdown_left(len(children), runs.ended_count(children), wake_after)
        if countdown is None:
            self._woken.add(run_id)
            self._writes.append(lambda: runs.mark_woken(run_id, now, lease))
            return runs.message_of(run_id)
        self._writes.append(lambda: runs.set_countdown(run_id, countdown))
        return None

    def save_index(
        self, states: Sequence[ScheduleState], *, now: datetime, live: LiveSchedules | None = None
    ) -> None:
        """The index rows of these states; a row never goes back in version (D2)."""
        from celery_durable.store.index import entry_row

        rows = [entry_row(state, now, live) for state in states]
        self._writes.append(lambda: self._store.upsert_index(rows))

    def apply(self) -> None:
        for write in self._writes:
            write()


class MemoryStore:
    """A journal, a run table and a schedule index in memory (see the module's doc)."""

    def __init__(self) -> None:
        self._journal = MemoryJournal()
        self.lock = self._journal.lock
        self.runs = MemoryRunTable(self.lock)
        """The run table (``RunStore``'s reads)."""
        self.index_rows: dict[str, dict[str, Any]] = {}
        """The schedule index's rows by schedule ID, with the SQL table's columns."""
        self.progress: dict[str, int] = {}
        """The index projection's read positions by name (``celery_durable_progress``)."""
        self.leases: dict[str, tuple[str, datetime]] = {}
        """The stored leases by name: ``(owner, expires_at)`` (D6)."""

    def __repr__(self) -> str:
        return f"MemoryStore({self._journal!r})"

    url = "(memory)"
    """What names this store in messages (it has no URL)."""

    def run_table(self) -> MemoryRunTable:
        """The run table (D8)."""
        return self.runs

    def schedule_index(
        self, live: LiveSchedules | None = None, partitions: int | None = None
    ) -> MemoryIndex:
        """The schedule index (D2); ``live`` answers ``BeatEntry`` rules (B3)."""
        index = MemoryIndex(self, live)
        if partitions is not None:
            index.use_partitions(partitions)
        return index

    def resolve_partitions(self, configured: int | None, now: datetime) -> int:
        """One partition: a memory store belongs to one process (D10)."""
        if configured is not None and configured != 1:
            raise PartitionsError(
                f"durable_partitions = {configured} needs PostgreSQL or MySQL: a memory store "
                "belongs to one process, so it keeps one partition"
            )
        return 1

    def partition_leases(
        self, owner: str, ttl: float, count: int, poll_interval: float
    ) -> MemoryLeases:
        """A dispatcher's lease (D6; one partition)."""
        return MemoryLeases(self, owner, ttl)

    def pruner(self, index: Any, *, batch: int, fault: Callable[[str], None]) -> None:
        """No retention in memory (O1): everything is kept until the process ends."""
        return None

    @property
    def journal(self) -> MemoryJournal:
        """The memory journal."""
        return self._journal

    def write_run(self, append: Append, run_id: str, values: Mapping[str, Any], **_: Any) -> None:
        """No cheaper way than a unit of work here (the ``Store`` protocol): ``None``."""
        return None

    @contextmanager
    def unit_of_work(self) -> Iterator[MemoryUnitOfWork]:
        """Write together: applied when the ``with`` block ends without an exception."""
        with self.lock:
            unit = MemoryUnitOfWork(self)
            yield unit
            if unit.failed:  # the caller went on after the conflict: as the SQL store does
                raise JournalError(
                    "an append in this transaction failed; the transaction was rolled back"
                )
            unit.apply()

    def upsert_index(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Write index rows, keeping the one with the higher version (hold :attr:`lock`)."""
        with self.lock:
            for row in rows:
                sid = row["schedule_id"]
                found = self.index_rows.get(sid)
                if found is None or found["version"] <= row["version"]:
                    self.index_rows[sid] = dict(row)

    def close(self) -> None:
        """Refuse every later use of the journal. Calling it twice is harmless."""
        self._journal.close()


if TYPE_CHECKING:
    # mypy proves the memory store and its units of work keep the core's protocols.
    _implements_store: type[Store] = MemoryStore
    _implements_unit: type[UnitOfWork] = MemoryUnitOfWork

__all__ = ["MemoryStore", "MemoryUnitOfWork"]
