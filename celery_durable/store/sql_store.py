"""The store on SQL: the :class:`~celery_durable.core.unit_of_work.Store` the services use.

:class:`SqlStore` hands out the journal and opens units of work: one transaction of the
journal (``BEGIN IMMEDIATE`` on SQLite) in which events are appended with their expected
versions and the rows of the run table and of the schedule index are written with them. The
services never hold the connection; what leaves a unit of work is the library's own error
(:mod:`.journal.errors`): ``AppendConflict``, ``JournalUnavailable`` (its ``__cause__`` the
driver's error), ``JournalError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from celery_durable.core.journal import Append
from celery_durable.core.rules import LiveSchedules
from celery_durable.core.schedule_aggregate import ScheduleState
from celery_durable.core.unit_of_work import SentRun
from celery_durable.store.index import ScheduleIndex, entry_row, upsert
from celery_durable.store.journal.sql import SqlJournal
from celery_durable.store.partitions import PartitionLeases, resolve_partitions
from celery_durable.store.retention import Pruner
from celery_durable.store.runs import (
    RunStore,
    record_sent_rows,
    save_run_row,
    wait_for_rows,
    wake_row,
    write_run,
)

if TYPE_CHECKING:
    from celery_durable.core.unit_of_work import Store, UnitOfWork


class SqlUnitOfWork:
    """The writes of one journal transaction (a core ``UnitOfWork``)."""

    __slots__ = ("_conn", "_journal")

    def __init__(self, journal: SqlJournal, conn: Connection) -> None:
        self._journal = journal
        self._conn = conn

    def append(self, appends: Sequence[Append]) -> list[int]:
        """Append at the expected versions; each stream's new version (``AppendConflict``)."""
        return self._journal.append_in(self._conn, appends)

    def save_run(self, run_id: str, values: Mapping[str, Any], *, now: datetime) -> None:
        """Update (or create) the run's row."""
        save_run_row(self._conn, self._journal, run_id, values, now=now)

    def record_sent(self, sent: Sequence[SentRun], *, now: datetime, lease: float) -> None:
        """Queued rows for runs just sent; existing rows stay (D8)."""
        record_sent_rows(self._conn, self._journal.database, sent, now=now, lease=lease)

    def wake(
        self, run_id: str, *, now: datetime, lease: float, at_once: bool = False
    ) -> SentRun | None:
        """Mark a suspended run's row as being sent again (or count down its children's
        ends); its message, or ``None``."""
        return wake_row(self._conn, self._journal, run_id, now=now, lease=lease, at_once=at_once)

    def wait_for(
        self, run_id: str, children: Sequence[str], *, wake_after: int, now: datetime, lease: float
    ) -> SentRun | None:
        """The suspended run waits for ``wake_after`` of ``children`` to end (W11)."""
        return wait_for_rows(
            self._conn,
            self._journal,
            run_id,
            list(children),
            wake_after=wake_after,
            now=now,
            lease=lease,
        )

    def save_index(
        self, states: Sequence[ScheduleState], *, now: datetime, live: LiveSchedules | None = None
    ) -> None:
        """The index rows of these states; a row never goes back in version (D2)."""
        if states:
            upsert(self._conn, self._journal.database, [entry_row(s, now, live) for s in states])


class SqlStore:
    """The journal on SQLite, PostgreSQL or MySQL/MariaDB, and its units of work."""

    def __init__(self, journal: SqlJournal) -> None:
        self._journal = journal

    def __repr__(self) -> str:
        return f"SqlStore({self._journal.url!r})"

    @property
    def url(self) -> str:
        """The journal's URL, password masked."""
        return self._journal.url

    def schedule_index(
        self, live: LiveSchedules | None = None, partitions: int | None = None
    ) -> ScheduleIndex:
        """The schedule index (D2); ``live`` answers ``BeatEntry`` rules (B3)."""
        return ScheduleIndex(self._journal, live, partitions)

    def run_table(self) -> RunStore:
        """The run table (D8)."""
        return RunStore(self._journal)

    def resolve_partitions(self, configured: int | None, now: datetime) -> int:
        """The partition count a beat works with (D10, :func:`.partitions.resolve_partitions`)."""
        return resolve_partitions(self._journal, configured, now)

    def partition_leases(
        self, owner: str, ttl: float, count: int, poll_interval: float
    ) -> PartitionLeases:
        """A beat's partition leases (D6, D10)."""
        return PartitionLeases(self._journal, owner, ttl, count, poll_interval)

    def pruner(self, index: ScheduleIndex, *, batch: int, fault: Callable[[str], None]) -> Pruner:
        """Retention's passes over this journal (O1)."""
        return Pruner(self._journal, index, batch=batch, fault=fault)

    @property
    def journal(self) -> SqlJournal:
        """The SQL journal (its public methods raise the library's own errors)."""
        return self._journal

    def write_run(
        self,
        append: Append,
        run_id: str,
        values: Mapping[str, Any],
        *,
        now: datetime,
        lease: float,
        wake: str | None = None,
        at_once: bool = False,
    ) -> tuple[int, SentRun | None] | None:
        """A run's events, its row and its parent's wake-up in one statement where the
        database has one (PostgreSQL, :func:`.runs.write_run`); ``None`` otherwise."""
        return write_run(
            self._journal, append, run_id, values, now=now, lease=lease, wake=wake, at_once=at_once
        )

    @contextmanager
    def unit_of_work(self) -> Iterator[SqlUnitOfWork]:
        """One write transaction; committed when the ``with`` block ends without an exception.

        Inside, nothing else may write through this journal in the same thread (its lock
        would wait for this one: ``JournalError``).
        """
        with self._journal.writing() as conn:
            yield SqlUnitOfWork(self._journal, conn)

    def close(self) -> None:
        """Release the journal's connections."""
        self._journal.close()


if TYPE_CHECKING:
    # mypy proves the SQL store and its units of work keep the core's protocols.
    _implements_store: type[Store] = SqlStore
    _implements_unit: type[UnitOfWork] = SqlUnitOfWork

__all__ = ["SqlStore", "SqlUnitOfWork"]
