"""Five-field cron expressions: parsing, and matching on local wall-clock time (R4).

This module knows calendars, not time zones: :meth:`CronSpec.next_match` walks naive wall-clock
minutes. Mapping a wall-clock time to an instant, with the DST rules of R7, is done by
:mod:`celery_durable.core.rules`. We do not use cronsim or croniter for evaluation because both map
local times to instants differently from R7 (see docs/rules.md for the measured cases).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, tzinfo
from functools import lru_cache

from celery_durable.errors import InvalidSchedule

__all__ = ["FIELD_NAMES", "MACROS", "MAX_EXPR_LENGTH", "CronSpec", "normalise", "parse"]

MAX_EXPR_LENGTH = 1000
FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# Day-of-week accepts 0-7 (both 0 and 7 are Sunday), as Vixie cron does.
_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_MONTH_NAMES = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAY_NAMES = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
_NAMES: tuple[dict[str, int], ...] = (
    {},
    {},
    {},
    {name: number for number, name in enumerate(_MONTH_NAMES, start=1)},
    {name: number for number, name in enumerate(_DAY_NAMES)},
)
# The longest each month can be (February 29 exists in leap years).
_MAX_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_DAYS = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _error(field: str, problem: str) -> InvalidSchedule:
    return InvalidSchedule(f"Cron field '{field}': {problem}", field=f"Cron.{field}")


def _short(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "…")


def normalise(expr: object) -> str:
    """Return the canonical text of a cron expression: lower case, single spaces.

    Raises :class:`InvalidSchedule` for a non-string, an empty or an over-long expression;
    the fields themselves are checked by :func:`parse`.
    """
    if not isinstance(expr, str):
        raise InvalidSchedule(
            f"Cron.expr: expected a string, got {type(expr).__name__}", field="Cron.expr"
        )
    if len(expr) > MAX_EXPR_LENGTH:
        raise InvalidSchedule(
            f"Cron.expr: longer than {MAX_EXPR_LENGTH} characters", field="Cron.expr"
        )
    text = " ".join(expr.split()).lower()
    if not text:
        raise InvalidSchedule("Cron.expr: the expression is empty", field="Cron.expr")
    return text


def _value(text: str, index: int) -> int:
    field = FIELD_NAMES[index]
    named = _NAMES[index].get(text)
    if named is not None:
        return named
    if not (text.isascii() and text.isdigit()) or len(text) > 4:
        raise _error(field, f"{_short(text)} is not a number or a name")
    number = int(text)
    low, high = _BOUNDS[index]
    if not low <= number <= high:
        raise _error(field, f"{number} is out of range {low}-{high}")
    return number


def _field(text: str, index: int) -> frozenset[int]:
    field = FIELD_NAMES[index]
    low, high = _BOUNDS[index]
    values: set[int] = set()
    for term in text.split(","):
        if not term:
            raise _error(field, f"empty list item in {_short(text)}")
        span, slash, step_text = term.partition("/")
        step = 1
        if slash:
            if not (step_text.isascii() and step_text.isdigit()) or len(step_text) > 4:
                raise _error(field, f"step {_short(step_text)} is not a number")
            step = int(step_text)
            if step < 1:
                raise _error(field, "a step must be at least 1")
        if span == "*":
            first, last = low, high
        elif "-" in span:
            first_text, _, last_text = span.partition("-")
            first, last = _value(first_text, index), _value(last_text, index)
            if last < first:
                raise _error(field, f"range {_short(span)} runs backwards")
        else:
            # "5/15" means 5, 20, 35, 50: from the value to the end of the field's range.
            first = _value(span, index)
            last = high if slash else first
        values.update(range(first, last + 1, step))
    if index == 4 and 7 in values:
        values.discard(7)
        values.add(0)
    return frozenset(values)


def _next_table(values: frozenset[int], size: int) -> tuple[int, ...]:
    """``table[x]`` is the smallest value >= x in ``values``, or -1 when there is none."""
    table = [-1] * (size + 1)
    following = -1
    for x in range(size, -1, -1):
        if x in values:
            following = x
        table[x] = following
    return tuple(table)


@dataclass(frozen=True, slots=True)
class CronSpec:
    """A parsed expression: look-up tables for the next allowed minute, hour and month."""

    minute_next: tuple[int, ...]
    hour_next: tuple[int, ...]
    month_next: tuple[int, ...]
    first_month: int
    dom: tuple[bool, ...]  # indexed by day of month 1-31
    dow: tuple[bool, ...]  # indexed by Python weekday (Monday = 0)
    day_and: bool
    every_day: bool

    def day_matches(self, year: int, month: int, day: int) -> bool:
        """Vixie cron: if either day field starts with ``*`` both must match, else either."""
        if self.every_day:
            return True
        by_dom = self.dom[day]
        by_dow = self.dow[date(year, month, day).weekday()]
        return (by_dom and by_dow) if self.day_and else (by_dom or by_dow)

    def next_match(
        self, year: int, month: int, day: int, hour: int, minute: int, zone: tzinfo | None = None
    ) -> datetime | None:
        """The first matching wall-clock minute at or after the one given, or ``None``.

        ``minute`` may be 60 (the next hour). The result carries ``zone`` as its tzinfo with
        fold 0, unconverted: it is a local time. ``None`` when nothing matches before 10000.
        """
        while True:
            if minute > 59:
                minute, hour = 0, hour + 1
            if hour > 23:
                hour, day = 0, day + 1
            if day > 28 and day > _days_in(year, month):
                day, month = 1, month + 1
            if month > 12:
                month, year = 1, year + 1
            if year > 9999:
                return None
            allowed = self.month_next[month]
            if allowed != month:
                if allowed < 0:
                    year, allowed = year + 1, self.first_month
                    if year > 9999:
                        return None
                month, day, hour, minute = allowed, 1, 0, 0
            if not self.day_matches(year, month, day):
                day, hour, minute = day + 1, 0, 0
                continue
            allowed = self.hour_next[hour]
            if allowed < 0:
                day, hour, minute = day + 1, 0, 0
                continue
            if allowed != hour:
                hour, minute = allowed, 0
            allowed = self.minute_next[minute]
            if allowed < 0:
                hour, minute = hour + 1, 0
                continue
            return datetime(year, month, day, hour, allowed, tzinfo=zone)


def _days_in(year: int, month: int) -> int:
    if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
        return 29
    return _DAYS[month]


@lru_cache(maxsize=512)
def parse(text: str) -> CronSpec:
    """Parse a normalised expression (see :func:`normalise`) into a :class:`CronSpec`.

    Raises :class:`InvalidSchedule` naming the offending field, and refuses an expression
    that can never match (``0 0 30 2 *``).
    """
    if text.startswith("@"):
        expanded = MACROS.get(text)
        if expanded is None:
            raise InvalidSchedule(
                f"Cron.expr: unknown macro {_short(text)}; known: {', '.join(MACROS)}",
                field="Cron.expr",
            )
        text = expanded
    parts = text.split(" ")
    if len(parts) != 5:
        raise InvalidSchedule(
            "Cron.expr: expected 5 fields (minute hour day-of-month month day-of-week), "
            f"got {len(parts)}",
            field="Cron.expr",
        )
    minutes, hours, doms, months, dows = (_field(part, i) for i, part in enumerate(parts))
    dom_star, dow_star = parts[2].startswith("*"), parts[4].startswith("*")
    day_and = dom_star or dow_star
    if day_and and not any(day <= _MAX_DAYS[month] for month in months for day in doms):
        raise _error(
            "day-of-month",
            f"{parts[2]} never occurs in month {parts[3]}, so {_short(text)} never matches",
        )
    return CronSpec(
        minute_next=_next_table(minutes, 59),
        hour_next=_next_table(hours, 23),
        month_next=_next_table(months, 12),
        first_month=min(months),
        dom=tuple(day in doms for day in range(32)),
        dow=tuple((weekday + 1) % 7 in dows for weekday in range(7)),
        day_and=day_and,
        every_day=len(doms) == 31 and len(dows) == 7,
    )
