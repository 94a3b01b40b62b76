"""B3: ``BeatEntry``, due when the live schedule object of a ``beat_schedule`` entry says so."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from celery_durable.core.rules._base import LiveSchedules, _invalid, _Rule, _show


@dataclass(frozen=True, slots=True, init=False)
class BeatEntry(_Rule):
    """B3: due when the schedule object of ``beat_schedule`` entry ``entry`` says so.

    For schedule objects no stored rule can express: custom ``BaseSchedule`` subclasses,
    ``schedule`` subclasses with their own ``is_due``/``remaining_estimate``,
    ``schedule(..., relative=True)``. Only a beat process that holds the entry's object can
    evaluate it: ``next_after`` asks the :class:`LiveSchedules` passed as ``live``, and is
    ``None`` without one. ``schedule`` is the object's description, kept for reading and so that a
    changed object is a changed schedule.
    """

    tag: ClassVar[str] = "beat-entry"
    asks_live: ClassVar[bool] = True
    entry: str
    schedule: str
    end_at: datetime | None
    max_runs: int | None

    def __init__(
        self,
        entry: str,
        schedule: str = "",
        *,
        end_at: datetime | None = None,
        max_runs: int | None = None,
    ) -> None:
        if not isinstance(entry, str) or not entry:
            raise _invalid("BeatEntry.entry", f"expected an entry name, got {_show(entry)}")
        if not isinstance(schedule, str):
            raise _invalid("BeatEntry.schedule", f"expected a str, got {_show(schedule)}")
        self._set("BeatEntry", end_at, max_runs, entry=entry, schedule=schedule)

    def _next(self, after: datetime, anchor: datetime | None) -> datetime | None:
        return None  # only the live object knows (``_next_live``)

    def _next_live(
        self, after: datetime, anchor: datetime | None, live: LiveSchedules | None
    ) -> datetime | None:
        return None if live is None else live.next_due(self.entry, after)

    def _json_fields(self) -> dict[str, Any]:
        return {"entry": self.entry, "schedule": self.schedule}

    def _describe(self) -> str:
        return f"beat_schedule entry {self.entry!r} ({self.schedule or 'custom schedule'})"
