"""How schedules, runs and times are written for people: the words and texts the command line
and the Django admin share, and the reading of the times and durations they are given.

What we print is an interface: text made from stored data or a user's input goes through
:func:`short` (control characters escaped, bounded length) before it is shown. Pure: no I/O,
no Click, no Django; each adapter turns :class:`NotATime` and ``InvalidSchedule`` into its own
error (an ``Error:`` line, a form field's message).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from celery_durable.core import limits
from celery_durable.core.codec import time_to_json
from celery_durable.core.ids import printable
from celery_durable.core.outcomes import Faulted, Finished, Outcome
from celery_durable.core.read_models import RunStatus, ScheduleView
from celery_durable.errors import InvalidSchedule

STATUSES = ("active", "paused", "complete", "deleted")
"""The words :func:`status_of` gives a schedule."""


def status_of(view: ScheduleView) -> str:
    """One word for a schedule: ``deleted``, ``paused``, ``complete`` or ``active``."""
    if view.deleted:
        return "deleted"
    if view.paused:
        return "paused"
    return "complete" if view.complete else "active"


# -- stored values as text -----------------------------------------------------------------


def short(value: Any, limit: int = 80) -> str:
    """A value as one line of JSON, control and format characters escaped, cut to ``limit``
    characters (the last one ``…``) so that no stored value is echoed unbounded."""
    text = printable(json.dumps(value, ensure_ascii=False, default=str))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def ending_text(ending: Outcome | None, limit: int = 80) -> str:
    """What goes with a durable run's ending: a finished run's value (nothing for ``None``),
    a faulted or parked run's ``ErrorType: message``, nothing for a cancelled one."""
    if isinstance(ending, Finished):
        # A task that returns nothing finished without a value: no JSON "null" to puzzle over.
        return "" if ending.value is None else short(ending.value, limit)
    if isinstance(ending, Faulted):
        return f"{ending.error_type}: {ending.error}"
    return ""


def run_detail(status: RunStatus, limit: int = 80) -> str:
    """What goes with a run's outcome: :func:`ending_text` once its durable run ended, else
    why it did not start (or failed to)."""
    if status.ending is not None:
        return ending_text(status.ending, limit)
    return status.error or ""


# -- times ----------------------------------------------------------------------------------


def zone_of(name: str) -> tzinfo:
    """The time zone named ``name`` (``UTC`` as :data:`datetime.timezone.utc`); an unknown
    name is ``InvalidSchedule`` ("unknown time zone 'Mars/Olympus'")."""
    if name in ("UTC", "Etc/UTC"):
        return timezone.utc
    try:
        return ZoneInfo(name)
    except (ValueError, OSError, KeyError) as exc:  # KeyError: ZoneInfoNotFoundError
        raise InvalidSchedule(f"unknown time zone {name!r}") from exc


def utc_json(moment: datetime | None) -> str | None:
    """ISO 8601 UTC with microseconds and ``Z`` (the JSON form of every time)."""
    return None if moment is None else time_to_json(moment)


def utc_text(moment: datetime | None) -> str:
    """A time for the command line's tables: UTC to the second, ``Z``; ``-`` for none."""
    if moment is None:
        return "-"
    return moment.astimezone(timezone.utc).replace(tzinfo=None, microsecond=0).isoformat() + "Z"


def local_text(moment: datetime | None, zone: str | None) -> str:
    """A time for tables in ``zone``: ``2026-11-16 02:00:00+01:00 Europe/Oslo``."""
    if moment is None or zone is None:
        return "-"
    local = limits.to_zone(moment, zone_of(zone))
    if local is None:
        return f"(beyond the dates of {zone})"
    return f"{local.replace(microsecond=0).isoformat(sep=' ')} {zone}"


def local_json(moment: datetime | None, zone: str | None) -> str | None:
    """The local time as ISO text; ``None`` also when it is beyond ``datetime``'s range."""
    if moment is None or zone is None:
        return None
    local = limits.to_zone(moment, zone_of(zone))
    return None if local is None else local.isoformat()


def utc_label(moment: datetime | None) -> str:
    """A time for a web page: ``2026-11-02 12:00:00 UTC``; ``—`` for none."""
    if moment is None:
        return "—"
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def local_label(moment: datetime | None, zone: tzinfo) -> str:
    """A time for a web page in ``zone``: ``2026-11-02 13:00:00 CET``; ``—`` for none."""
    if moment is None:
        return "—"
    local = limits.to_zone(moment, zone)
    if local is None:
        return "beyond the dates of this time zone"
    return local.strftime("%Y-%m-%d %H:%M:%S %Z")


class NotATime(ValueError):
    """Text that :func:`parse_instant` cannot read as a time. ``reason``: ``syntax`` (no ISO
    8601 time) or ``offset`` (a local time, and no zone to read it in)."""

    def __init__(self, text: str, reason: str) -> None:
        super().__init__(f"{text!r}: {reason}")
        self.text = text
        self.reason = reason


def parse_instant(text: str, zone: str | None) -> datetime:
    """An ISO 8601 time (``T`` or a space between date and time); with ``Z`` or an offset as
    written, else a local time read in ``zone`` (an unknown zone: ``InvalidSchedule``)."""
    value = text.strip().replace(" ", "T", 1)
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise NotATime(text, "syntax") from None
    if moment.tzinfo is None:
        if not zone:
            raise NotATime(text, "offset")
        moment = moment.replace(tzinfo=zone_of(zone))
    return moment


def format_duration(interval: timedelta) -> str:
    """A duration as it is typed (:func:`celery_durable.core.limits.parse_duration` reads it
    back): whole seconds as ``1h30m``, others as ``2.5s``."""
    seconds = interval.total_seconds()
    if seconds != int(seconds):
        return f"{seconds:g}s"
    left, text = int(seconds), ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, left = divmod(left, size)
        text += f"{count}{unit}" if count else ""
    return text or "0s"


__all__ = [
    "STATUSES",
    "NotATime",
    "ending_text",
    "format_duration",
    "local_json",
    "local_label",
    "local_text",
    "parse_instant",
    "run_detail",
    "short",
    "status_of",
    "utc_json",
    "utc_label",
    "utc_text",
    "zone_of",
]
