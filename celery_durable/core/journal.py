"""The journal contract: append-only event streams with optimistic concurrency.

A stream is a sequence of events numbered 1, 2, 3 … (its *version*). Every stored event also
gets a global *position* that increases across all streams. The category of a stream is the
text before its first ``/`` (``schedule/nightly`` → ``schedule``, ``run/x@…`` → ``run``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol


@dataclass(frozen=True, slots=True, kw_only=True)
class NewEvent:
    """An event to append: its type name and JSON-ready data."""

    type: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredEvent:
    """An event as read back from the journal."""

    position: int
    stream: str
    version: int
    type: str
    data: dict[str, Any]
    recorded_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Append:
    """One stream's part of an atomic multi-stream append."""

    stream: str
    expected_version: int
    events: Sequence[NewEvent]


def category_of(stream: str) -> str:
    """The category of a stream: the text before its first ``/``."""
    return stream.split("/", 1)[0]


class Journal(Protocol):
    """Append-only event store. Implementations must be safe across processes.

    ``expected_version`` is the version the caller last saw (0 for a stream that does not
    exist yet). An append whose expected version is not the stream's current version stores
    nothing and raises :class:`~celery_durable.errors.AppendConflict`.
    """

    def append(self, stream: str, expected_version: int, events: Sequence[NewEvent]) -> int:
        """Append events atomically; return the stream's new version."""
        ...

    def append_many(self, appends: Sequence[Append]) -> None:
        """Append to several streams in one transaction: all are stored or none.

        Raises ``AppendConflict`` (with ``stream`` set to the first conflicting stream).
        """
        ...

    def read_stream(self, stream: str, after_version: int = 0) -> list[StoredEvent]:
        """Events of one stream with version > ``after_version``, oldest first."""
        ...

    def read_all(
        self, after_position: int, *, category: str | None = None, limit: int = 1000
    ) -> list[StoredEvent]:
        """Events with position > ``after_position`` (optionally of one category), in order."""
        ...

    def head(self, category: str | None = None) -> int:
        """The highest stored position (of the category), 0 when empty."""
        ...

    def close(self) -> None:
        """Release connections. Calling it twice is harmless."""
        ...
