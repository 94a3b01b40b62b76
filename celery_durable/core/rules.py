"""When a schedule is due: the rules Daily, Weekly, Every, Cron and Once (SPEC R1-R8a).

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
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

from celery_durable.core import cron
from celery_durable.errors import InvalidSchedule

__all__ = [
    "FRIDAY",
    "MONDAY",
    "SATURDAY",
    "SUNDAY",
    "THURSDAY",
    "TUESDAY",
    "WEDNESDAY",
    "Cron",
    "Daily",
    "Every",
    "Once",
    "Rule",
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

    def next_after(self, after: datetime, *, anchor: datetime | None = None) -> datetime | None:
        """The first due time strictly after ``after`` (aware UTC), or ``None`` (R8a).

        ``after`` may carry any UTC offset; naive datetimes raise :class:`InvalidSchedule`.
        A due time equal to ``end_at`` is allowed, a later one is not. ``max_runs`` is not
        applied here: the schedule counts its runs. Only :class:`Every` uses ``anchor``.
        """
        # The usual caller passes a UTC datetime: skip the general check for it.
        if not (type(after) is datetime and after.tzinfo is UTC) and (
            not isinstance(after, datetime) or after.utcoffset() is None
        ):
            raise _invalid("next_after.after", f"must be an aware datetime, got {_show(after)}")
        try:
            due = self._next(after, anchor)
        except OverflowError:  # past the last representable datetime
            return None
        if due is None or (self.end_at is not None and due > self.end_at):
            return None
        return due

    def _next(self, after: datetime, anchor: datetime | None) -> datetime | None:
        raise NotImplementedError

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
class Cron(_Rule):
    """R4: a five-field cron expression evaluated on local time in ``zone`` (Vixie rules).

    >>> Cron(" 0  2 * * MON ") == Cron("0 2 * * mon")
    True
    """

    tag: ClassVar[str] = "cron"
    expr: str
    zone: str
    end_at: datetime | None
    max_runs: int | None
    _tz: tzinfo = field(init=False, compare=False, repr=False)
    _spec: cron.CronSpec = field(init=False, compare=False, repr=False)

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

    def _next(self, after: datetime, anchor: datetime | None) -> datetime | None:
        limit, local, zone = after.astimezone(UTC), after.astimezone(self._tz), self._tz
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

    def _json_fields(self) -> dict[str, Any]:
        return {"expr": self.expr, "zone": self.zone}

    def _describe(self) -> str:
        return f'cron "{self.expr}" {self.zone}'


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


Rule = Daily | Weekly | Every | Cron | Once

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
    "once": ("at",),
}


_PARSED: dict[tuple[Any, ...], Rule] = {}
_PARSED_MAX = 4096


def rule_from_json(data: object) -> Rule:
    """Rebuild a rule from its :meth:`to_json` form; ``rule_from_json(r.to_json()) == r``.

    Anything else (not a dict, unknown ``type``, missing or extra keys, wrong types) raises
    :class:`InvalidSchedule`. Rules are immutable, so one parsed rule serves every schedule
    with the same JSON (loading 10,000 index rows with a few distinct rules parses a few).
    """
    key = _rule_key(data)
    if key is not None:
        found = _PARSED.get(key)
        if found is not None:
            return found
    rule = _parse_rule(data)
    if key is not None and len(_PARSED) < _PARSED_MAX:
        _PARSED[key] = rule
    return rule


def _rule_key(data: object) -> tuple[Any, ...] | None:
    """A hashable key of rule JSON, types included (``1``, ``1.0`` and ``True`` differ)."""
    if type(data) is not dict:
        return None
    key: list[Any] = []
    for name, value in data.items():
        if type(value) is list:
            if not all(type(item) is str for item in value):
                return None
            value = tuple(value)
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
    at = _parse_instant(f"{where}.at", data["at"])
    if at is None:
        raise _invalid(f"{where}.at", "expected an ISO 8601 instant, got None")
    return Once(at, **bounds)
