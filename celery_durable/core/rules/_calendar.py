"""R1, R2: ``Daily`` and ``Weekly``, at a local time of day in a zone (R7 across clock changes)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta, tzinfo
from enum import IntEnum
from typing import Any, ClassVar

from celery_durable.core.rules._base import (
    _DAY,
    UTC,
    _check_time,
    _check_zone,
    _invalid,
    _resolve,
    _Rule,
    _show,
)


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


_DAY_NAMES = {day.short: day for day in Weekday} | {day.name.lower(): day for day in Weekday}


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
