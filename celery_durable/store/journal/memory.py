"""A journal in this process's memory: the journal contract without a database.

:class:`MemoryJournal` keeps the same promises as :class:`~.sql.SqlJournal` for one process:
versions per stream with optimistic concurrency (A8), global positions in append order, an
all-or-nothing ``append_many``, and the same checks of what is appended (``encoding.py``), so a
refused append stores nothing. Data is kept as the JSON text the SQL journal would store and
parsed on every read, so a reader never shares objects with a writer or with another reader.

It serves unit tests of code written against :class:`~celery_durable.core.journal.Journal`
(APScheduler's memory data store plays the same part), and is the journal of
:class:`~celery_durable.store.memory.MemoryStore`, whose units of work hold its :attr:`lock`.
It is not shared between processes and nothing survives the process: it is no journal for
beat or workers.
"""

from __future__ import annotations

import bisect
import json
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from celery_durable.core.journal import Append, Journal, NewEvent, StoredEvent
from celery_durable.errors import JournalError
from celery_durable.store.journal.encoding import _check_int, _rows, first_misfit

UTC = timezone.utc


@dataclass(frozen=True, slots=True)
class _Row:
    position: int
    stream: str
    version: int
    category: str
    type: str
    data: str
    recorded_at: datetime

    def stored(self) -> StoredEvent:
        return StoredEvent(
            position=self.position,
            stream=self.stream,
            version=self.version,
            type=self.type,
            data=json.loads(self.data),
            recorded_at=self.recorded_at,
        )


class MemoryJournal:
    """Append-only event streams in memory, safe across the threads of one process."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        """Held by every read and write, and for the whole of a memory store's unit of work
        (:class:`~celery_durable.store.memory.MemoryStore`), as one SQLite writer at a time."""
        self._rows: list[_Row] = []  # in position order; position = index + 1
        self._streams: dict[str, list[_Row]] = {}
        self._categories: dict[str, list[_Row]] = {}
        self._closed = False

    def in_transaction(self) -> bool:
        """Never blocking: the store's lock is re-entrant, so a nested unit of work in the
        same thread (a signal handler's) does not wait for it."""
        return False

    # -- writing -----------------------------------------------------------------------------

    def append(self, stream: str, expected_version: int, events: Sequence[NewEvent]) -> int:
        """Append events to one stream; return its new version."""
        appends = [Append(stream=stream, expected_version=expected_version, events=events)]
        rows, versions = _rows(appends)
        self._store(appends, rows)
        return versions[0]

    def append_many(self, appends: Sequence[Append]) -> None:
        """Append to several streams at once: all are stored or none.

        Raises :class:`AppendConflict` naming the first append that does not fit, counting the
        appends before it in the same call (two appends at one version: the second conflicts).
        """
        rows, _ = _rows(appends, allow_empty=True)
        if rows:
            self._store(appends, rows)

    def _store(self, appends: Sequence[Append], rows: list[dict[str, object]]) -> None:
        with self.lock:
            self.check(appends, {})
            self.commit(rows)

    def check(self, appends: Sequence[Append], staged: dict[str, int]) -> None:
        """Raise the ``AppendConflict`` of the first append that does not fit, counting the
        versions ``staged`` in an open unit of work (hold :attr:`lock`)."""
        self._check_open()
        conflict = first_misfit(
            appends, lambda stream: staged[stream] if stream in staged else self._version(stream)
        )
        if conflict is not None:
            raise conflict

    def commit(self, rows: Sequence[dict[str, object]]) -> None:
        """Store checked rows (from ``encoding._rows``) in order (hold :attr:`lock`)."""
        now = datetime.now(UTC)
        for values in rows:
            row = _Row(
                position=len(self._rows) + 1,
                stream=str(values["stream"]),
                version=int(str(values["version"])),
                category=str(values["category"]),
                type=str(values["type"]),
                data=str(values["data"]),
                recorded_at=now,
            )
            self._rows.append(row)
            self._streams.setdefault(row.stream, []).append(row)
            self._categories.setdefault(row.category, []).append(row)

    def _version(self, stream: str) -> int:
        found = self._streams.get(stream)
        return found[-1].version if found else 0

    # -- reading -----------------------------------------------------------------------------

    def read_stream(self, stream: str, after_version: int = 0) -> list[StoredEvent]:
        """Events of one stream with version > ``after_version``, oldest first."""
        _check_int("after_version", after_version)
        with self.lock:
            self._check_open()
            rows = self._streams.get(stream, [])[after_version:]  # version n is at index n - 1
        return [row.stored() for row in rows]

    def read_streams(
        self, streams: Sequence[str], *, types: Collection[str] | None = None
    ) -> dict[str, list[StoredEvent]]:
        """The events of several streams (only those of ``types`` when given), oldest first,
        by stream; a stream without such events is left out."""
        with self.lock:
            self._check_open()
            rows = {s: self._streams.get(s, []) for s in dict.fromkeys(streams)}
            found = {
                stream: [r.stored() for r in kept if types is None or r.type in types]
                for stream, kept in rows.items()
            }
        return {stream: events for stream, events in found.items() if events}

    def read_all(
        self, after_position: int, *, category: str | None = None, limit: int = 1000
    ) -> list[StoredEvent]:
        """Up to ``limit`` events with position > ``after_position``, in position order."""
        _check_int("after_position", after_position)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit must be a positive int, not {limit!r}")
        with self.lock:
            self._check_open()
            if category is None:
                rows = self._rows[after_position : after_position + limit]
            else:
                found = self._categories.get(category, [])
                start = bisect.bisect_right(found, after_position, key=lambda r: r.position)
                rows = found[start : start + limit]
        return [row.stored() for row in rows]

    def head(self, category: str | None = None) -> int:
        """The highest stored position (of the category), 0 when there is none."""
        with self.lock:
            self._check_open()
            rows = self._rows if category is None else self._categories.get(category, [])
            return rows[-1].position if rows else 0

    # -- life cycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Refuse every later use. Calling it twice is harmless."""
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise JournalError("the memory journal is closed")

    def __repr__(self) -> str:
        return f"MemoryJournal({len(self._rows)} events)"


if TYPE_CHECKING:
    # mypy proves the memory journal satisfies the Journal protocol.
    _implements_journal: type[Journal] = MemoryJournal

__all__ = ["MemoryJournal"]
