"""When a schedule is due: Daily, Weekly, Every, Cron, Crontab, Solar, Once (R1-R8a, B2, B3).

Rules are immutable values compared by their normalised content. ``next_after`` is pure: the
caller passes the instant to look after (and, for :class:`Every`, the anchor). Due times are
aware UTC datetimes. Local times follow R7: a time skipped by a clock change is due at the
first instant after the gap; a time that occurs twice is due once, at its first occurrence.

>>> rule = Daily("02:00", "Europe/Oslo")
>>> rule.next_after(datetime(2027, 3, 27, 12, tzinfo=timezone.utc))
datetime.datetime(2027, 3, 28, 1, 0, tzinfo=datetime.timezone.utc)

Zones are read from the ``tzdata`` package first, so due times do not depend on the host's
zone files.
"""

from __future__ import annotations

import importlib.resources
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta, timezone, tzinfo
from enum import IntEnum
from functools import lru_cache
from typing import Any, ClassVar, Protocol
from zoneinfo import ZoneInfo

from celery_durable.core import cron, crontab, sun
from celery_durable.errors import InvalidSchedule

__all__ = [
    "FRIDAY",
    "MONDAY",
    "SATURDAY",
    "SOLAR_EVENTS",
    "SUNDAY",
    "THURSDAY",
    "TUESDAY",
    "WEDNESDAY",
    "BeatEntry",
    "Cron",
    "Crontab",
    "Daily",
    "Every",
    "LiveSchedules",
    "Once",
    "Rule",
    "Solar",
    "Weekday",
    "Weekly",
    "rule_from_json",
]

UTC = timezone.utc
_MINUTE = timedelta(minutes=1)
_DAY = timedelta(days=1)
_SECOND = timedelta(seconds=1)
_MIN_INTERVAL, _MAX_INTERVAL = _SECOND, timedelta(days=366)


class Weekday(IntEnum):
    """Days of the week, numbered as :meth:`datetime.date.weekday` numbers them."""

    MONDAY = 0
    TUESDAY = 1
    WEDNESDAY = 2
    THURSDAY = 3
    FRIDAY = 4
    SATURDAY = 5
    SUNDAY = 6

    @property
    def short(self) -> str:
        return self.name[:3].lower()


MONDAY, TUESDAY, WEDNESDAY, THURSDAY, FRIDAY, SATURDAY, SUNDAY = Weekday
_DAY_NAMES = {day.short: day for day in Weekday} | {day.name.lower(): day for day in Weekday}


def _show(value: object) -> str:
    text = value[:40] + "…" if isinstance(value, str) and len(value) > 40 else value
    return f"{type(value).__name__} {text!r}"


def _invalid(where: str, problem: str) -> InvalidSchedule:
    return InvalidSchedule(f"{where}: {problem}", field=where)


# --- checks shared by the rules -------------------------------------------------------------

_ZONE_NAME = re.compile(r"[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+)*\Z")


@lru_cache(maxsize=256)
def _zone(name: str) -> tzinfo:
    if name in ("UTC", "Etc/UTC"):
        return UTC
    try:
        node = importlib.resources.files("tzdata").joinpath("zoneinfo")
    except ModuleNotFoundError:  # pragma: no cover - tzdata is a dependency
        return ZoneInfo(name)
    for part in name.split("/"):
        node = node.joinpath(part)
    if not node.is_file():
        raise LookupError(name)
    with node.open("rb") as data:
        return ZoneInfo.from_file(data, key=name)


def _check_zone(where: str, name: object) -> tzinfo:
    if not isinstance(name, str):
        raise _invalid(where, f"expected an IANA time zone name, got {_show(name)}")
    if len(name) <= 100 and _ZONE_NAME.match(name):
        try:
            return _zone(name)
        except Exception:  # unreadable or missing file: reported as unknown below
            pass
    raise _invalid(where, f"unknown time zone {_short(name)}")


def _short(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "…")


_TIME = re.compile(r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{6}))?)?\Z")


def _check_time(where: str, value: object) -> time:
    if isinstance(value, str):
        match = _TIME.match(value) if len(value) <= 20 else None
        if match is None:
            raise _invalid(where, f"expected 'HH:MM' or 'HH:MM:SS', got {_short(value)}")
        hour, minute, second, micro = (int(part or 0) for part in match.groups())
        try:
            return time(hour, minute, second, micro)
        except ValueError as exc:
            raise _invalid(where, f"{_short(value)} is not a time of day ({exc})") from None
    if not isinstance(value, time):
        raise _invalid(where, f"expected a datetime.time or 'HH:MM', got {_show(value)}")
    if value.tzinfo is not None:
        raise _invalid(where, "must be a naive time (the zone says where it is)")
    return value.replace(fold=0)


def _check_instant(where: str, value: object) -> datetime:
    """An aware datetime, returned as a plain ``datetime`` in UTC."""
    if type(value) is datetime and value.tzinfo is UTC:
        return value  # already what is returned below: the common case, without a copy
    if not isinstance(value, datetime):
        raise _invalid(where, f"expected an aware datetime, got {_show(value)}")
    try:
        offset = value.utcoffset()
        utc = value.astimezone(UTC) if offset is not None else None
    except OverflowError:
        from celery_durable.core.limits import RANGE_TEXT

        raise _invalid(where, f"{value.isoformat()} is outside {RANGE_TEXT}") from None
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise _invalid(where, f"cannot be read as an instant ({exc})") from None
    if utc is None:
        raise _invalid(where, "must be an aware datetime (naive datetimes have no instant)")
    return datetime(*utc.timetuple()[:6], utc.microsecond, tzinfo=UTC)


def _text_instant(value: datetime) -> str:
    return value.replace(tzinfo=None).isoformat() + "Z"


# --- R7: from a local wall-clock time to an instant ------------------------------------------


def _resolve(local: datetime, zone: tzinfo) -> datetime:
    """The instant (aware UTC) at which ``local`` (aware in ``zone``, fold 0) is due under R7.

    Fold 0 already picks the first of two occurrences. A local time exists exactly when the
    round trip through UTC gives it back; otherwise it lies in a gap.
    """
    due = local.astimezone(UTC)
    if due.astimezone(zone) == local:  # same tzinfo: compares the wall-clock fields
        return due
    return _gap_end(due, zone, local.utcoffset())


def _gap_end(inside: datetime, zone: tzinfo, before: timedelta | None) -> datetime:
    """The first instant after the gap that skips a local time.

    Fold 0 reads a skipped time with ``before``, the offset from before the clock change, which
    puts ``inside`` after the change by less than the jump. Bisect on whole seconds (zone
    transitions fall on whole seconds) between ``inside - jump`` and ``inside``.
    """
    after = inside.astimezone(zone).utcoffset()
    if after is None or before is None:  # pragma: no cover - zoneinfo always answers
        raise InvalidSchedule(f"time zone {zone} has no UTC offset at {inside}")
    low, high = inside - (after - before), inside
    low -= timedelta(microseconds=low.microsecond)
    while high - low > _SECOND:
        middle = low + (high - low) // 2
        middle -= timedelta(microseconds=middle.microsecond)
        if middle.astimezone(zone).utcoffset() == after:
            high = middle
        else:
            low = middle
    return high


# --- the rules ------------------------------------------------------------------------------


class _Rule:
    """What every rule shares: bounds, ``next_after``, JSON, a human form, pickling as JSON."""

    __slots__ = ()
    tag: ClassVar[str]
    end_at: datetime | None
    max_runs: int | None

    def _set(self, owner: str, end_at: object, max_runs: object, **values: object) -> None:
        """Store checked values on the frozen instance, plus the bounds every rule has (R6)."""
        if end_at is not None:
            end_at = _check_instant(f"{owner}.end_at", end_at)
        if max_runs is not None and (type(max_runs) is not int or max_runs < 1):
            raise _invalid(
                f"{owner}.max_runs", f"expected an int >= 1 or None, got {_show(max_runs)}"
            )
        for name, value in (*values.items(), ("end_at", end_at), ("max_runs", max_runs)):
            object.__setattr__(self, name, value)

    def next_after(
        self,
        after: datetime,
        *,
        anchor: datetime | None = None,
        live: LiveSchedules | None = None,
    ) -> datetime | None:
        """The first due time strictly after ``after`` (aware UTC), or ``None`` (R8a).

        ``after`` may carry any UTC offset; naive datetimes raise :class:`InvalidSchedule`.
        A due time equal to ``end_at`` is allowed, a later one is not. ``max_runs`` is not
        applied here: the schedule counts its runs. Only :class:`Every` uses ``anchor``, only
        :class:`BeatEntry` uses ``live``.
        """
        # The usual caller passes a UTC datetime: skip the general check for it.
        if not (type(after) is datetime and after.tzinfo is UTC) and (
            not isinstance(after, datetime) or after.utcoffset() is None
        ):
            raise _invalid("next_after.after", f"must be an aware datetime, got {_show(after)}")
        try:
            due = self._next_live(after, anchor, live)
        except OverflowError:  # past the last representable datetime
            return None
        if due is None or (self.end_at is not None and due > self.end_at):
            return None
        return due

    def _next(self, after: datetime, anchor: datetime | None) -> datetime | None:
        raise NotImplementedError

    def _next_live(
        self, after: datetime, anchor: datetime | None, live: LiveSchedules | None
    ) -> datetime | None:
        return self._next(after, anchor)

    def to_json(self) -> dict[str, Any]:
        """The stored form: a ``type`` tag, the rule's fields, ``end_at`` and ``max_runs``."""
        end = None if self.end_at is None else _text_instant(self.end_at)
        return {"type": self.tag, **self._json_fields(), "end_at": end, "max_runs": self.max_runs}

    def _json_fields(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_json(cls, data: object) -> Rule:
        """Rebuild a rule of this class from :meth:`to_json` output (see :func:`rule_from_json`)."""
        rule = rule_from_json(data)
        if not isinstance(rule, cls):
            raise _invalid("rule JSON", f"expected type {cls.tag!r}, got {rule.tag!r}")
        return rule

    def describe(self) -> str:
        """A short human form, e.g. ``daily at 02:00 Europe/Oslo``."""
        text = self._describe()
        if self.end_at is not None:
            text += f", until {_text_instant(self.end_at)}"
        if self.max_runs is not None:
            text += f", at most {self.max_runs} run{'s' if self.max_runs != 1 else ''}"
        return text

    def _describe(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.describe()

    def __reduce__(self) -> tuple[Any, ...]:
        return (rule_from_json, (self.to_json(),))


def _clock(at: time) -> str:
    return at.isoformat(timespec="minutes") if not (at.second or at.microsecond) else str(at)


@dataclass(frozen=True, slots=True, init=False)
class Daily(_Rule):
    """R1: every day at the local time ``at`` in ``zone``.

    >>> str(Daily("02:00", "Europe/Oslo"))
    'daily at 02:00 Europe/Oslo'
    """

    tag: ClassVar[str] = "daily"
    at: time
    zone: str
    end_at: datetime | None
    max_runs: int | None
    _tz: tzinfo = field(init=False, compare=False, repr=False)

    def __init__(
        self,
        at: time | str,
        zone: str,
        *,
        end_at: datetime | None = None,
        max_runs: int | None = None,
    ) -> None:
        at = _check_time("Daily.at", at)
        self._set("Daily", end_at, max_runs, at=at, _tz=_check_zone("Daily.zone", zone), zone=zone)

    def _next(self, after: datetime, anchor: datetime | None) -> datetime | None:
        return _next_local(after, self.at, self._tz, _EVERY_DAY)

    def _json_fields(self) -> dict[str, Any]:
        return {"at": self.at.isoformat(), "zone": self.zone}

    def _describe(self) -> str:
        return f"daily at {_clock(self.at)} {self.zone}"


_EVERY_DAY = (0,) * 7


def _next_local(after: datetime, at: time, zone: tzinfo, skip: tuple[int, ...]) -> datetime:
    """Daily and Weekly: try the local day of ``after``, then the following allowed days.

    ``skip[weekday]`` is how many days to move forward to reach an allowed weekday. More than
    one try is needed only when today's time has passed or occurred earlier (a repeated hour).
    """
    limit, local = after.astimezone(UTC), after.astimezone(zone)
    day = local.date()
    if local.time() >= at:  # today's time is not later than ``after`` on the wall clock
        day += _DAY
    while True:
        if skip[day.weekday()]:
            day += timedelta(days=skip[day.weekday()])
        due = _resolve(datetime.combine(day, at, zone), zone)
        if due > limit:
            return due
        day += _DAY


def _check_days(value: object) -> tuple[Weekday, ...]:
    items: Iterable[object]
    if isinstance(value, (str, int)):
        items = (value,)  # a single day is accepted as a one-day list
    elif isinstance(value, Iterable):
        items = value
    else:
        raise _invalid("Weekly.days", f"expected days, got {_show(value)}")
    days: set[Weekday] = set()
    for item in items:
        day = None
        if isinstance(item, str) and len(item) <= 20:
            day = _DAY_NAMES.get(item.strip().lower())
        elif isinstance(item, int) and not isinstance(item, bool) and 0 <= item <= 6:
            day = Weekday(item)
        if day is None:
            raise _invalid("Weekly.days", f"{_show(item)} is not a day (MONDAY…SUNDAY, 'mon')")
        days.add(day)
        if len(days) == 7:
            break
    if not days:
        raise _invalid("Weekly.days", "at least one day is needed")
    return tuple(sorted(days))


@dataclass(frozen=True, slots=True, init=False)
class Weekly(_Rule):
    """R2: on the listed days at the local time ``at`` in ``zone``.

    >>> Weekly(["thu", MONDAY, "Monday"], "08:00", "Europe/Oslo").days
    (<Weekday.MONDAY: 0>, <Weekday.THURSDAY: 3>)
    """

    tag: ClassVar[str] = "weekly"
    days: tuple[Weekday, ...]
    at: time
    zone: str
    end_at: datetime | None
    max_runs: int | None
    _tz: tzinfo = field(init=False, compare=False, repr=False)
    _skip: tuple[int, ...] = field(init=False, compare=False, repr=False)

    def __init__(
        self,
        days: Iterable[int | str] | int | str,
        at: time | str,
        zone: str,
        *,
        end_at: datetime | None = None,
        max_runs: int | None = None,
    ) -> None:
        normal = _check_days(days)
        self._set(
            "Weekly",
            end_at,
            max_runs,
            days=normal,
            at=_check_time("Weekly.at", at),
            _tz=_check_zone("Weekly.zone", zone),
            zone=zone,
            _skip=tuple(min((day - weekday) % 7 for day in normal) for weekday in range(7)),
        )

    def _next(self, after: datetime, anchor: datetime | None) -> datetime | None:
        return _next_local(after, self.at, self._tz, self._skip)

    def _json_fields(self) -> dict[str, Any]:
        days = [day.short for day in self.days]
        return {"days": days, "at": self.at.isoformat(), "zone": self.zone}

    def _describe(self) -> str:
        days = ",".join(day.short for day in self.days)
        return f"weekly on {days} at {_clock(self.at)} {self.zone}"


@dataclass(frozen=True, slots=True, init=False)
class Every(_Rule):
    """R3: due at ``anchor + k·interval`` for k = 1, 2, …; 1 s ≤ interval ≤ 366 days.

    >>> str(Every(timedelta(seconds=90)))
    'every 1m30s'
    """

    tag: ClassVar[str] = "every"
    interval: timedelta
    end_at: datetime | None
    max_runs: int | None

    def __init__(
        self,
        interval: timedelta,
        *,
        end_at: datetime | None = None,
        max_runs: int | None = None,
    ) -> None:
        if not isinstance(interval, timedelta):
            raise _invalid("Every.interval", f"expected a timedelta, got {_show(interval)}")
        if not _MIN_INTERVAL <= interval <= _MAX_INTERVAL:
            raise _invalid(
                "Every.interval", f"must be between 1 second and 366 days, got {interval}"
            )
        self._set("Every", end_at, max_runs, interval=interval)

    def _next(self, after: datetime, anchor: datetime | None) -> datetime | None:
        if anchor is None:
            raise _invalid("Every.next_after", "needs the anchor (creation or last change)")
        start = _check_instant("next_after.anchor", anchor)
        # Whole intervals already elapsed, counted exactly on microseconds: no loop.
        k = 1 if after < start else (after - start) // self.interval + 1
        return start + k * self.interval

    def _json_fields(self) -> dict[str, Any]:
        whole, part = divmod(self.interval, _SECOND)
        return {"seconds": whole if not part else self.interval / _SECOND}

    def _describe(self) -> str:
        left, text = self.interval, ""
        for unit, size in (("d", _DAY), ("h", timedelta(hours=1)), ("m", _MINUTE)):
            count, left = divmod(left, size)
            text += f"{count}{unit}" if count else ""
        if left:
            seconds = left / _SECOND
            text += f"{seconds:g}s" if left % _SECOND else f"{int(seconds)}s"
        return f"every {text}"


@dataclass(frozen=True, slots=True, init=False)
class _LocalMinutes(_Rule):
    """Cron and Crontab: matching local minutes, found by look-up tables, due under R7."""

    _tz: tzinfo = field(init=False, compare=False, repr=False)
    _spec: cron.CronSpec = field(init=False, compare=False, repr=False)

    def _next(self, after: datetime, anchor: datetime | None) -> datetime | None:
        limit, zone = after.astimezone(UTC), self._tz
        local = after.astimezone(zone)
        # Start at the minute after the local time of ``after``; next_match carries minute 60.
        fields = (local.year, local.month, local.day, local.hour, local.minute + 1)
        while True:
            match = self._spec.next_match(*fields, zone)
            if match is None:
                return None
            due = _resolve(match, zone)
            # Only inside the second pass of a repeated hour can a later wall time be due
            # earlier than ``after``: its first occurrence has already gone by.
            if due > limit:
                return due
            fields = (match.year, match.month, match.day, match.hour, match.minute + 1)


@dataclass(frozen=True, slots=True, init=False)
class Cron(_LocalMinutes):
    """R4: a five-field cron expression evaluated on local time in ``zone`` (Vixie rules).

    >>> Cron(" 0  2 * * MON ") == Cron("0 2 * * mon")
    True
    """

    tag: ClassVar[str] = "cron"
    expr: str
    zone: str
    end_at: datetime | None
    max_runs: int | None

    def __init__(
        self,
        expr: str,
        zone: str = "UTC",
        *,
        end_at: datetime | None = None,
        max_runs: int | None = None,
    ) -> None:
        text = cron.normalise(expr)
        spec, tz = cron.parse(text), _check_zone("Cron.zone", zone)
        self._set("Cron", end_at, max_runs, expr=text, _spec=spec, _tz=tz, zone=zone)

    def _json_fields(self) -> dict[str, Any]:
        return {"expr": self.expr, "zone": self.zone}

    def _describe(self) -> str:
        return f'cron "{self.expr}" {self.zone}'


@dataclass(frozen=True, slots=True, init=False)
class Crontab(_LocalMinutes):
    """B2: Celery's ``crontab`` on local time in ``zone``, with Celery's day rule (AND).

    Fields take every form ``celery.schedules.crontab`` takes (see
    :mod:`celery_durable.core.crontab`) and are kept as sorted tuples of the values they expand
    to. A day matches only when its month, day of month **and** day of week all match — unlike
    :class:`Cron`, which follows cron's OR rule (R4). Local times follow R7.

    >>> Crontab(minute=0, hour=[2, 14], day_of_week="Monday-wed") == Crontab(0, "2,14", "1-3")
    True
    """

    tag: ClassVar[str] = "crontab"
    minute: tuple[int, ...]
    hour: tuple[int, ...]
    day_of_week: tuple[int, ...]
    day_of_month: tuple[int, ...]
    month_of_year: tuple[int, ...]
    zone: str
    end_at: datetime | None
    max_runs: int | None

    def __init__(
        self,
        minute: Any = "*",
        hour: Any = "*",
        day_of_week: Any = "*",
        day_of_month: Any = "*",
        month_of_year: Any = "*",
        zone: str = "UTC",
        *,
        end_at: datetime | None = None,
        max_runs: int | None = None,
    ) -> None:
        given = (minute, hour, day_of_week, day_of_month, month_of_year)
        sets = [
            crontab.expand(name, value) for name, value in zip(crontab.FIELDS, given, strict=True)
        ]
        spec = crontab.spec(*sets)
        values = {
            name: tuple(sorted(found)) for name, found in zip(crontab.FIELDS, sets, strict=True)
        }
        tz = _check_zone("Crontab.zone", zone)
        self._set("Crontab", end_at, max_runs, **values, zone=zone, _tz=tz, _spec=spec)

    @classmethod
    def from_celery(cls, schedule: Any, zone: str | tzinfo = "UTC") -> Crontab:
        """The rule of a ``celery.schedules.crontab``: its own ``tz`` if it has one, else ``zone``.

        Reads the field sets Celery's own parser expanded (``schedule.minute`` …), so the rule
        means what Celery means. Pass the app's zone (``app.timezone``) as ``zone``. Only reads
        attributes: this module does not import Celery.
        """
        return cls(
            schedule.minute,
            schedule.hour,
            schedule.day_of_week,
            schedule.day_of_month,
            schedule.month_of_year,
            crontab.zone_name(crontab.own_zone(schedule) or zone),
        )

    def _json_fields(self) -> dict[str, Any]:
        return {name: list(getattr(self, name)) for name in crontab.FIELDS} | {"zone": self.zone}

    def _describe(self) -> str:
        fields = (self.minute, self.hour, self.day_of_month, self.month_of_year, self.day_of_week)
        text = " ".join(
            crontab.compact(values, name) for values, name in zip(fields, _CRON_ORDER, strict=True)
        )
        return f'crontab "{text}" {self.zone}'


_CRON_ORDER = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")


SOLAR_EVENTS = tuple(sun.EVENTS)
"""The sun events a Solar rule takes, as Celery's ``solar`` names them."""


def _check_degrees(where: str, value: object, limit: int) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _invalid(where, f"expected a number of degrees, got {_show(value)}")
    degrees = float(value)
    if not -limit <= degrees <= limit:  # NaN fails too
        raise _invalid(where, f"must be between -{limit} and {limit} degrees, got {value}")
    return degrees


@dataclass(frozen=True, slots=True, init=False)
class Solar(_Rule):
    """B3: each day's sun ``event`` at ``latitude``/``longitude``, as Celery's ``solar``.

    Events: ``sunrise``, ``sunset``, ``solar_noon``, and ``dawn_``/``dusk_`` ``civil``,
    ``nautical``, ``astronomical``. Days without the event (polar day or night) are skipped.
    Computing needs ``ephem`` (the ``solar`` extra); the value itself does not.

    >>> Solar("sunrise", 59.91, 10.75)
    Solar(event='sunrise', latitude=59.91, longitude=10.75, end_at=None, max_runs=None)
    """

    tag: ClassVar[str] = "solar"
    event: str
    latitude: float
    longitude: float
    end_at: datetime | None
    max_runs: int | None

    def __init__(
        self,
        event: str,
        latitude: float,
        longitude: float,
        *,
        end_at: datetime | None = None,
        max_runs: int | None = None,
    ) -> None:
        if not isinstance(event, str) or event not in SOLAR_EVENTS:
            raise _invalid("Solar.event", f"{_show(event)} is not one of {', '.join(SOLAR_EVENTS)}")
        self._set(
            "Solar",
            end_at,
            max_runs,
            event=event,
            latitude=_check_degrees("Solar.latitude", latitude, 90),
            longitude=_check_degrees("Solar.longitude", longitude, 180),
        )

    @classmethod
    def from_celery(cls, schedule: Any) -> Solar:
        """The rule of a ``celery.schedules.solar``: the same event and place."""
        return cls(schedule.event, schedule.lat, schedule.lon)

    def _next(self, after: datetime, anchor: datetime | None) -> datetime | None:
        # ephem is imported on the first computation, not with this module.
        return sun.next_event(self.event, self.latitude, self.longitude, after)

    def _json_fields(self) -> dict[str, Any]:
        return {"event": self.event, "latitude": self.latitude, "longitude": self.longitude}

    def _describe(self) -> str:
        return f"solar {self.event} at {self.latitude:g}, {self.longitude:g}"


@dataclass(frozen=True, slots=True, init=False)
class Once(_Rule):
    """R5: a single due time ``at`` (aware; kept in UTC)."""

    tag: ClassVar[str] = "once"
    at: datetime
    end_at: datetime | None
    max_runs: int | None

    def __init__(
        self,
        at: datetime,
        *,
        end_at: datetime | None = None,
        max_runs: int | None = None,
    ) -> None:
        self._set("Once", end_at, max_runs, at=_check_instant("Once.at", at))

    def _next(self, after: datetime, anchor: datetime | None) -> datetime | None:
        return self.at if self.at > after else None

    def _json_fields(self) -> dict[str, Any]:
        return {"at": _text_instant(self.at)}

    def _describe(self) -> str:
        return f"once at {_text_instant(self.at)}"


# --- schedule objects of a beat_schedule entry (B3) ------------------------------------------


class LiveSchedules(Protocol):
    """The schedule objects of ``beat_schedule`` entries, as a beat process holds them (B3).

    The core keeps no live objects: whoever holds them (the beat's runtime) passes this in,
    as it passes the clock. ``next_due`` is ``None`` for an entry it does not hold.
    """

    def next_due(self, entry: str, after: datetime) -> datetime | None:
        """The entry's next due time after its last run at ``after``, asked of its object."""
        ...

    def as_of(self, now: datetime) -> LiveSchedules:
        """The same objects asked as of ``now``, the moment a decision is made."""
        ...


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


Rule = Daily | Weekly | Every | Cron | Crontab | Solar | Once | BeatEntry

# --- JSON -----------------------------------------------------------------------------------


def _parse_instant(where: str, value: object) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 40:
        raise _invalid(
            where,
            f"expected an ISO 8601 instant such as '2026-01-01T00:00:00Z', got {_show(value)}",
        )
    try:
        parsed = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
    except ValueError:
        raise _invalid(where, f"{_short(value)} is not an ISO 8601 instant") from None
    return _check_instant(where, parsed)


def _json_time(where: str, value: object) -> str:
    if not isinstance(value, str):
        raise _invalid(where, f"expected 'HH:MM:SS', got {_show(value)}")
    return value


def _json_ints(where: str, value: object) -> list[int]:
    if not isinstance(value, list) or not all(type(item) is int for item in value):
        raise _invalid(where, f"expected a list of ints, got {_show(value)}")
    return value


def _json_seconds(value: object) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _invalid("rule JSON (every).seconds", f"expected a number, got {_show(value)}")
    try:
        return timedelta(seconds=value)
    except (OverflowError, ValueError):
        raise _invalid(
            "Every.interval", f"must be between 1 second and 366 days, got {value}"
        ) from None


_FIELDS = {
    "daily": ("at", "zone"),
    "weekly": ("days", "at", "zone"),
    "every": ("seconds",),
    "cron": ("expr", "zone"),
    "crontab": (*crontab.FIELDS, "zone"),
    "solar": ("event", "latitude", "longitude"),
    "once": ("at",),
    "beat-entry": ("entry", "schedule"),
}


def rule_from_json(data: object) -> Rule:
    """Rebuild a rule from its :meth:`to_json` form; ``rule_from_json(r.to_json()) == r``.

    Anything else (not a dict, unknown ``type``, missing or extra keys, wrong types) raises
    :class:`InvalidSchedule`. Rules are immutable, so one parsed rule serves every schedule
    with the same JSON (loading 10,000 index rows with a few distinct rules parses a few).
    """
    key = _rule_key(data)
    return _parse_rule(data) if key is None else _parsed(key)


@lru_cache(maxsize=4096)
def _parsed(key: tuple[Any, ...]) -> Rule:
    """The rule of a :func:`_rule_key` (a pure memo: equal JSON, one shared rule)."""
    return _parse_rule(
        {name: list(value[1:]) if kind is tuple else value for name, kind, value in key}
    )


def _rule_key(data: object) -> tuple[Any, ...] | None:
    """A hashable key of rule JSON, types included (``1``, ``1.0`` and ``True`` differ)."""
    if type(data) is not dict:
        return None
    key: list[Any] = []
    for name, value in data.items():
        if type(value) is list:
            kind = type(value[0]) if value else str
            if kind not in (str, int) or not all(type(item) is kind for item in value):
                return None
            value = (kind, *value)
        elif type(value) not in (str, int, float, type(None)):
            return None
        key.append((name, type(value), value))
    return tuple(key)


def _parse_rule(data: object) -> Rule:
    if not isinstance(data, dict):
        raise _invalid("rule JSON", f"expected an object, got {_show(data)}")
    tag = data.get("type")
    names = _FIELDS.get(tag) if isinstance(tag, str) else None
    if names is None:
        raise _invalid(
            "rule JSON.type", f"unknown rule type {_show(tag)}; known: {', '.join(_FIELDS)}"
        )
    where = f"rule JSON ({tag})"
    expected = {"type", *names, "end_at", "max_runs"}
    missing = sorted(expected - data.keys())
    if missing:
        raise _invalid(where, f"missing key {missing[0]!r}")
    extra = [key for key in data if key not in expected]
    if extra:
        raise _invalid(where, f"unknown key {_show(extra[0])}")
    bounds = {
        "end_at": _parse_instant(f"{where}.end_at", data["end_at"]),
        "max_runs": data["max_runs"],
    }
    if tag == "daily":
        return Daily(_json_time(f"{where}.at", data["at"]), data["zone"], **bounds)
    if tag == "weekly":
        days = data["days"]
        if not isinstance(days, list):
            raise _invalid(f"{where}.days", f"expected a list of day names, got {_show(days)}")
        return Weekly(days, _json_time(f"{where}.at", data["at"]), data["zone"], **bounds)
    if tag == "every":
        return Every(_json_seconds(data["seconds"]), **bounds)
    if tag == "cron":
        return Cron(data["expr"], data["zone"], **bounds)
    if tag == "crontab":
        m, h, dow, dom, moy = (_json_ints(f"{where}.{name}", data[name]) for name in crontab.FIELDS)
        return Crontab(m, h, dow, dom, moy, data["zone"], **bounds)
    if tag == "solar":
        return Solar(data["event"], data["latitude"], data["longitude"], **bounds)
    if tag == "beat-entry":
        return BeatEntry(data["entry"], data["schedule"], **bounds)
    at = _parse_instant(f"{where}.at", data["at"])
    if at is None:
        raise _invalid(f"{where}.at", "expected an ISO 8601 instant, got None")
    return Once(at, **bounds)
