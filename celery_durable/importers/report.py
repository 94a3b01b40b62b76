"""The report of an import (SPEC I1, I2): what is done with each entry, and why. Pure."""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from celery_durable.core.schedule_events import Content

UTC = timezone.utc

CREATE, CHANGE, UNCHANGED, PAUSE, RESUME, SKIP, REFUSED = (
    "create",
    "change",
    "unchanged",
    "pause",
    "resume",
    "skip",
    "refused",
)
"""What an import does with one entry (the report's ``action``)."""


@dataclass(slots=True, kw_only=True)
class Item:
    """One entry of the report."""

    name: str
    schedule_id: str | None = None
    action: str = REFUSED
    rule: str = ""
    next_due: datetime | None = None
    zone: str = "UTC"
    notes: list[str] = field(default_factory=list)
    """What the import changes or keeps in words (the name mapping, start time, one-off …)."""
    changes: list[str] = field(default_factory=list)
    """What differs from the schedule an earlier import stored."""
    error: str | None = None
    content: Content | None = None
    since: datetime | None = None
    paused: str | None = None
    """The reason the schedule is (to be) paused, or ``None``."""
    source_since: datetime | None = None
    """Where the source's own timing runs from (``since`` before an overdue interval is
    moved to the import)."""

    def to_json(self) -> dict[str, Any]:
        due = self.next_due
        return {
            "name": self.name,
            "schedule_id": self.schedule_id,
            "action": self.action,
            "rule": self.rule or None,
            "next_due": None if due is None else due.astimezone(UTC).isoformat(),
            "next_due_local": None if due is None else _local(due, self.zone),
            "zone": self.zone,
            "paused": self.paused,
            "notes": list(self.notes),
            "changes": list(self.changes),
            "error": self.error,
        }


@dataclass(slots=True, kw_only=True)
class ImportPlan:
    """What an import will do (``dry_run``) or did."""

    source: str
    items: list[Item] = field(default_factory=list)
    removed: list[Item] = field(default_factory=list)
    """Schedules an earlier import stored whose entry is gone: paused."""
    applied: bool = False

    @property
    def refused(self) -> builtins.list[Item]:
        return [i for i in self.items if i.action == REFUSED]

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for item in [*self.items, *self.removed]:
            found[item.action] = found.get(item.action, 0) + 1
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "applied": self.applied,
            "counts": self.counts(),
            "entries": [i.to_json() for i in self.items],
            "removed": [i.to_json() for i in self.removed],
        }


def _local(moment: datetime, zone: str) -> str:
    from zoneinfo import ZoneInfo

    try:
        return moment.astimezone(ZoneInfo(zone)).isoformat()
    except Exception:
        return moment.astimezone(UTC).isoformat()


__all__ = [
    "CHANGE",
    "CREATE",
    "PAUSE",
    "REFUSED",
    "RESUME",
    "SKIP",
    "UNCHANGED",
    "ImportPlan",
    "Item",
]
