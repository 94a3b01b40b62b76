"""The global blackout windows' stream in the journal (P4): its one event and its fold. Pure.

Every schedule honours these windows besides its own; ``celery_durable/blackouts.py`` reads
and writes the stream, and the dispatcher passes the list to the aggregate, as the time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery_durable.core.blackouts import Blackout, windows_from_json, windows_to_json
from celery_durable.core.codec import time_from_json, time_to_json
from celery_durable.core.journal import NewEvent, StoredEvent

GLOBAL_STREAM = "settings/blackouts"
"""The journal stream of the global windows (a persistent contract, §9)."""

SET_EVENT = "BlackoutsSet"
"""Its one event type: the whole list as it is from then on (format ``"v": 1``)."""


def set_event(
    windows: Sequence[Blackout], at: datetime, by: str | None, reason: str | None
) -> NewEvent:
    """The event that makes ``windows`` the global list."""
    data: dict[str, Any] = {"v": 1, "at": time_to_json(at), "blackouts": windows_to_json(windows)}
    data.update({k: v for k, v in (("by", by), ("reason", reason)) if v is not None})
    return NewEvent(type=SET_EVENT, data=data)


@dataclass(frozen=True, slots=True, kw_only=True)
class BlackoutsChange:
    """One change of the global windows: when, who and why (O5), and the list from then on."""

    at: datetime
    by: str | None
    reason: str | None
    windows: tuple[Blackout, ...]


def changes_of(events: Sequence[StoredEvent]) -> list[BlackoutsChange]:
    """The changes the ``BlackoutsSet`` events among ``events`` record, oldest first."""
    return [
        BlackoutsChange(
            at=time_from_json(event.data["at"]),
            by=event.data.get("by"),
            reason=event.data.get("reason"),
            windows=windows_from_json(event.data.get("blackouts")),
        )
        for event in events
        if event.type == SET_EVENT
    ]


def global_windows(events: Sequence[StoredEvent]) -> tuple[Blackout, ...] | None:
    """The list the newest ``BlackoutsSet`` among ``events`` holds; ``None`` when there is none."""
    for event in reversed(events):
        if event.type == SET_EVENT:
            return windows_from_json(event.data.get("blackouts"))
    return None


__all__ = [
    "GLOBAL_STREAM",
    "SET_EVENT",
    "BlackoutsChange",
    "changes_of",
    "global_windows",
    "set_event",
]
