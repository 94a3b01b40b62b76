"""Celery's crontab fields, read as Celery 5.x reads them, and its AND day rule (SPEC B2).

Pure: no Celery import. :func:`expand` turns one field, in any form ``celery.schedules.crontab``
accepts (an int, a string, or any iterable of ints), into the set of values Celery expands it
to; :func:`spec` builds the look-up tables of :mod:`celery_durable.core.cron` with Celery's day
rule: a day matches only when its month, its day of month **and** its day of week are all in
their sets (classic cron's OR rule does not apply). The R7 mapping of local times to instants
is :mod:`celery_durable.core.rules`' job.

The string grammar is Celery's ``crontab_parser``, quirks included, so that a ``beat_schedule``
Celery accepts is accepted here and means the same (tests compare with Celery itself):

* items are separated by ``,``; an item is ``*``, ``*/S``, ``N``, ``A-B`` or ``A-B/S``;
* a range whose end is below its start wraps around (``22-2`` → 22, 23, 0, 1, 2;
  ``fri-mon``; ``nov-feb``), and a step then counts along the wrapped list;
* a name is read by its first three letters in any case, first as a month (``jan`` = 1) and then
  as a day of the week (``sun`` = 0), in whichever field it appears (``"January"``, ``"MONDAY"``);
* days of the week count from Sunday = 0 to Saturday = 6 (no 7).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import timedelta, timezone, tzinfo
from typing import Any

from celery_durable.core import cron
from celery_durable.errors import InvalidSchedule

__all__ = ["FIELDS", "compact", "expand", "own_zone", "spec", "zone_name"]

FIELDS = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")
"""The field names, in the order of ``crontab(minute, hour, day_of_week, ...)``."""

_LOW = {"minute": 0, "hour": 0, "day_of_week": 0, "day_of_month": 1, "month_of_year": 1}
_HIGH = {"minute": 59, "hour": 23, "day_of_week": 6, "day_of_month": 31, "month_of_year": 12}
_MONTH_NAMES = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_MONTHS = {name: number for number, name in enumerate(_MONTH_NAMES, start=1)}
_WEEKDAYS = {
    name: number for number, name in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])
}
# The longest each month can be: February 29 counts, as in Celery's CRON_DAYS_IN_MONTH.
_MAX_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)

# Celery matches these at the start of an item only (``re.match``), in this order.
_RANGE_STEP = re.compile(r"(\w+?)-(\w+)/(\w+)?")
_RANGE = re.compile(r"(\w+?)-(\w+)")
_STAR_STEP = re.compile(r"\*/(\w+)?")
_STAR = re.compile(r"\*\Z")


def _error(field: str, problem: str) -> InvalidSchedule:
    return InvalidSchedule(f"Crontab.{field}: {problem}", field=f"Crontab.{field}")


def _short(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "…")


def _number(field: str, text: str) -> int:
    if text.startswith("-"):
        raise _error(field, f"negative numbers are not allowed ({_short(text)})")
    try:
        value = int(text)  # as Celery: int() also takes " 5", "0_5" and non-ASCII digits
    except ValueError:
        key = text[:3].lower()
        found = _MONTHS.get(key, _WEEKDAYS.get(key))
        if found is None:
            raise _error(field, f"{_short(text)} is not a number or a name") from None
        value = found
    low, high = _LOW[field], _HIGH[field]
    if not low <= value <= high:
        raise _error(field, f"{value} is out of range {low}-{high}")
    return value


def _span(field: str, first: str, last: str) -> list[int]:
    start, end = _number(field, first), _number(field, last)
    if end < start:  # wraps around the end of the field's range
        return [*range(start, _HIGH[field] + 1), *range(_LOW[field], end + 1)]
    return list(range(start, end + 1))


def _step(field: str, text: str | None) -> int:
    if not text:
        raise _error(field, "a '/' needs a step after it")
    try:
        step = int(text)
    except ValueError:
        raise _error(field, f"step {_short(text)} is not a number") from None
    if step < 1:
        raise _error(field, "a step must be at least 1")
    return step


def _item(field: str, item: str) -> list[int]:
    match = _RANGE_STEP.match(item)
    if match:
        first, last, step = match.groups()
        return _span(field, first, last)[:: _step(field, step)]
    match = _RANGE.match(item)
    if match:
        return _span(field, *match.groups())
    match = _STAR_STEP.match(item)
    if match:
        return list(range(_LOW[field], _HIGH[field] + 1))[:: _step(field, match.group(1))]
    if _STAR.match(item):
        return list(range(_LOW[field], _HIGH[field] + 1))
    return [_number(field, item)]


def _parse(field: str, text: str) -> set[int]:
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise _error(field, f"empty list item in {_short(text)}")
        values.update(_item(field, item))
    return values


def expand(field: str, value: Any) -> frozenset[int]:
    """The set of values a crontab field means, as Celery expands it.

    ``value`` is an int, a string in Celery's grammar, or an iterable of ints
    (list, set, tuple, range …). Raises :class:`InvalidSchedule` naming the field for anything
    Celery refuses, and also for what Celery accepts but then fails on at run time (floats,
    strings inside a list).
    """
    if field not in _LOW:
        raise InvalidSchedule(f"Crontab: unknown field {field!r}; known: {', '.join(FIELDS)}")
    low, high = _LOW[field], _HIGH[field]
    if isinstance(value, int):
        items: Iterable[Any] = (value,)
    elif isinstance(value, str):
        items = _parse(field, value)
    elif isinstance(value, Iterable) and not isinstance(value, (bytes, bytearray, dict)):
        items = value
    else:
        raise _error(
            field,
            f"expected an int, a string such as '*/15' or 'mon-fri', or a list of ints, "
            f"got {type(value).__name__}",
        )
    values: set[int] = set()
    for item in items:
        if not isinstance(item, int):
            raise _error(field, f"expected ints in the list, got {type(item).__name__} {item!r}")
        if not low <= item <= high:
            raise _error(field, f"{item} is out of range {low}-{high}")
        values.add(int(item))
    return frozenset(values)


def spec(
    minute: frozenset[int],
    hour: frozenset[int],
    day_of_week: frozenset[int],
    day_of_month: frozenset[int],
    month_of_year: frozenset[int],
) -> cron.CronSpec:
    """Look-up tables for expanded fields, with Celery's AND day rule.

    Refuses, naming the field, a crontab that can never be due: an empty field, or days of the
    month that none of the months has (``day_of_month=31, month_of_year="feb,apr"``). Every
    other crontab is due some time: each calendar date falls on every weekday within 28 years.
    """
    for name, values in zip(
        FIELDS, (minute, hour, day_of_week, day_of_month, month_of_year), strict=True
    ):
        if not values:
            raise _error(name, "no value given, so the crontab would never be due")
    if not any(day <= _MAX_DAYS[month] for month in month_of_year for day in day_of_month):
        raise _error(
            "day_of_month",
            f"none of the days {sorted(day_of_month)} occurs in the months "
            f"{sorted(month_of_year)}, so the crontab would never be due",
        )
    return cron.spec_from_sets(minute, hour, day_of_month, month_of_year, day_of_week, day_and=True)


def compact(values: Iterable[int], field: str) -> str:
    """A short text for an expanded field: ``*`` when full, else items and ranges (``1-5,7``)."""
    ordered = sorted(values)
    if len(ordered) == _HIGH[field] - _LOW[field] + 1:
        return "*"
    parts: list[str] = []
    start = previous = ordered[0]
    for value in [*ordered[1:], None]:
        if value is not None and value == previous + 1:
            previous = value
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if value is not None:
            start = previous = value
    return ",".join(parts)


def zone_name(zone: str | tzinfo) -> str:
    """The IANA name of a time zone given as a name, a ``ZoneInfo``, a pytz zone or UTC.

    A fixed offset of whole hours maps to ``Etc/GMT±N``; any other zone without a name raises
    :class:`InvalidSchedule`.
    """
    if isinstance(zone, str):
        return zone
    name = getattr(zone, "key", None) or getattr(zone, "zone", None)  # zoneinfo, pytz
    if isinstance(name, str):
        return name
    if isinstance(zone, timezone):
        offset = zone.utcoffset(None)
        if offset == timedelta(0):
            return "UTC"
        hours, rest = divmod(offset, timedelta(hours=1))
        if not rest and -14 <= hours <= 12:
            # POSIX-style names: Etc/GMT-2 is two hours *ahead* of UTC.
            return f"Etc/GMT{-hours:+d}"
    raise InvalidSchedule(f"time zone {zone!r} has no IANA name (use a ZoneInfo)", field="zone")


def own_zone(schedule: Any) -> tzinfo | str | None:
    """The zone a Celery schedule object carries itself, else ``None`` (Celery then uses the
    app's zone).

    Its own: set on the object (``schedule.tz = ZoneInfo(…)``, as django-celery-beat's
    ``TzAwareCrontab`` does) or defined by a subclass (a ``tz`` property). The ``tz`` of
    ``celery.schedules.BaseSchedule`` itself is the app's zone. Read without importing Celery.
    """
    if "tz" not in getattr(schedule, "__dict__", {}):
        for klass in type(schedule).__mro__:
            if "tz" in vars(klass):
                if (klass.__module__, klass.__name__) == ("celery.schedules", "BaseSchedule"):
                    return None
                break
        else:
            return None
    found = schedule.tz
    return found if isinstance(found, (tzinfo, str)) else None
