"""The text form of a blackout window (P4): what ``--blackout``, ``celery durable blackouts``
and the admin's field read and show. Pure.

:func:`describe_window` and :func:`parse_window` are exact inverses:
``parse_window(describe_window(w)) == w`` for every window (a Hypothesis test holds it), so a
window shown in the admin form is saved back unchanged. Forms::

    NAME;daily HH:MM[:SS[.ffffff]];DURATION;ZONE
    NAME;weekly DAYS@HH:MM[:SS[.ffffff]];DURATION;ZONE
    NAME;cron EXPR;DURATION;ZONE            (R4: cron's OR rule for the two day fields)
    NAME;crontab M H DOM MON DOW;DURATION;ZONE   (B2: Celery's AND rule)
    NAME;FROM;UNTIL                         (ISO 8601 instants with Z or an offset)

The zone may be left out (UTC). A duration is written ``1h30m``, ``2d``, ``1m30.5s``. A name
cannot hold ``;``: :class:`~.blackouts.Blackout` refuses one.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from celery_durable.core import crontab
from celery_durable.core.blackouts import Blackout, StartRule
from celery_durable.core.rules import Cron, Crontab, Daily, Weekly
from celery_durable.core.rules._base import UTC, _check_instant
from celery_durable.errors import InvalidSchedule

FORMS = (
    "NAME;daily HH:MM|weekly DAYS@HH:MM|cron EXPR|crontab M H DOM MON DOW;DURATION[;ZONE] "
    "or NAME;FROM;UNTIL"
)
_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_KINDS = ("daily", "weekly", "cron", "crontab")
_CRON_ORDER = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "…"


def describe_window(window: Blackout) -> str:
    """The text form of a window (the inverse of :func:`parse_window`)."""
    start = window.start
    if isinstance(start, datetime):
        return f"{window.name};{_instant_text(start)};{_instant_text(start + window.duration)}"
    return f"{window.name};{_start_text(start)};{span_text(window.duration)};{start.zone}"


def parse_window(text: str, what: str = "blackout") -> Blackout:
    """A window from its text form (the CLI's ``--blackout``, the admin's field);
    ``InvalidSchedule`` naming what is wrong."""
    from celery_durable.core.limits import parse_duration

    parts = [part.strip() for part in text.split(";")] if isinstance(text, str) else []
    if len(parts) not in (3, 4):
        raise InvalidSchedule(f"{what}: {_shown(text)} is not {FORMS}", field="blackouts")
    name, start, rest = parts[0], parts[1], parts[2:]
    kind, _, spec = start.partition(" ")
    kind, spec = kind.lower(), spec.strip()
    if kind not in _KINDS:
        if len(rest) != 1:
            raise InvalidSchedule(
                f"{what}: a fixed range is NAME;FROM;UNTIL (no zone: give offsets)",
                field="blackouts",
            )
        return Blackout.between(name, _instant(start, what), _instant(rest[0], what))
    zone = rest[1] if len(rest) == 2 else "UTC"
    try:
        span = parse_duration(rest[0])
    except ValueError as exc:
        raise InvalidSchedule(f"{what} duration: {exc}", field="blackouts") from None
    rule: StartRule
    if kind == "daily":
        rule = Daily(spec, zone)
    elif kind == "weekly":
        days, sep, at = spec.partition("@")
        if not sep:
            raise InvalidSchedule(f"{what}: {_shown(spec)} is not DAYS@HH:MM", field="blackouts")
        rule = Weekly(_days(days, what), at.strip(), zone)
    elif kind == "cron":
        rule = Cron(spec, zone)
    else:
        fields = spec.split()
        if len(fields) != 5:
            raise InvalidSchedule(
                f"{what}: crontab takes five fields, minute hour day-of-month month "
                f"day-of-week, not {_shown(spec)}",
                field="blackouts",
            )
        minute, hour, day_of_month, month_of_year, day_of_week = fields
        rule = Crontab(minute, hour, day_of_week, day_of_month, month_of_year, zone)
    return Blackout(name, start=rule, duration=span)


def _instant(text: str, what: str) -> datetime:
    value = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidSchedule(
            f"{what}: {_shown(text)} is not an ISO 8601 instant (e.g. 2026-12-24T18:00Z)",
            field="blackouts",
        ) from None
    return _check_instant(what, moment)


def _days(text: str, what: str) -> list[str]:
    days: list[str] = []
    for item in text.split(","):
        first, dash, last = item.strip().lower().partition("-")
        if not dash:
            days.append(first)
            continue
        if first[:3] not in _DAYS or last[:3] not in _DAYS:
            raise InvalidSchedule(
                f"{what}: {_shown(item)} is not a range of days (mon-fri)", field="blackouts"
            )
        days.extend(_DAYS[_DAYS.index(first[:3]) : _DAYS.index(last[:3]) + 1])
    return days


def _instant_text(moment: datetime) -> str:
    """An instant in UTC with ``Z``, to the microsecond when it has one."""
    utc = moment.astimezone(UTC).replace(tzinfo=None)
    return utc.isoformat(timespec="microseconds" if utc.microsecond else "seconds") + "Z"


def _clock(rule: Daily | Weekly) -> str:
    at = rule.at
    if at.microsecond:
        return at.isoformat(timespec="microseconds")
    return at.isoformat(timespec="seconds" if at.second else "minutes")


def _start_text(rule: StartRule) -> str:
    if isinstance(rule, Daily):
        return f"daily {_clock(rule)}"
    if isinstance(rule, Weekly):
        days = ",".join(day.name[:3].lower() for day in rule.days)
        return f"weekly {days}@{_clock(rule)}"
    if isinstance(rule, Cron):
        return f"cron {rule.expr}"
    fields = " ".join(crontab.compact(getattr(rule, name), name) for name in _CRON_ORDER)
    return f"crontab {fields}"


def span_text(span: timedelta) -> str:
    """A duration as ``2d``, ``1h30m``, ``1m30.5s`` (exact to the microsecond)."""
    micros = (span.days * 86400 + span.seconds) * 1_000_000 + span.microseconds
    seconds, fraction = divmod(micros, 1_000_000)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    if fraction:
        parts.append(f"{seconds}.{fraction:06d}".rstrip("0") + "s")
    elif seconds or not parts:
        parts.append(f"{seconds}s")
    return "".join(parts)


__all__ = ["FORMS", "describe_window", "parse_window", "span_text"]
