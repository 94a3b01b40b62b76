"""The accepted ranges of what people type: instants, intervals, JSON text (docs/reference.md).

One place for the limits that the API, the CLI and the Django admin share, so that a value out
of range gets the same one-line error everywhere instead of an ``OverflowError``,
``RecursionError`` or ``ValueError`` from deep inside Python. Pure: no Celery, no SQLAlchemy.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

from celery_durable.core.codec import MAX_NESTING
from celery_durable.errors import InvalidSchedule

UTC = timezone.utc

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
"""The earliest instant a rule, ``end_at`` or backfill may name (inclusive)."""
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
"""The end of the accepted range (exclusive): 8999-12-31T23:59:59.999999Z is the last instant.
It stays a thousand years short of ``datetime.max`` so that every computation on an accepted
instant (the next due time, a local time in any zone) stays representable."""
MAX_PERIOD_SECONDS = 100 * 365.25 * 86400
"""The longest period a setting or an option may give, in seconds (100 years): it is added to
the current time, which must stay a date."""

MAX_INTERVAL = timedelta(days=366)
"""The longest ``Every`` interval (R3)."""
MAX_RUNS = 2**31 - 1
"""The largest ``max_runs`` (R6): 2,147,483,647, a count no schedule reaches (68 years of a
run every second) that fits a signed 32-bit integer wherever the number travels (SQL
``INTEGER``, the admin's number field, other languages reading the rule JSON). A larger one
is a typing mistake or "no limit" written as a number: leave ``max_runs`` out for that."""
MAX_INT_DIGITS = 4300
"""Longest integer in JSON text (Python's default ``sys.get_int_max_str_digits()``)."""
MAX_SHOWN = 40
"""Characters of a refused value repeated in an error message."""

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def shown(text: str) -> str:
    """``repr`` of a refused value, cut to ``MAX_SHOWN`` characters (one short line)."""
    return repr(text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…")


RANGE_TEXT = "the accepted range 1970-01-01T00:00:00Z to 8999-12-31T23:59:59Z"
"""How errors name the range of :data:`EARLIEST` and :data:`LATEST`."""


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def check_instant(moment: datetime, what: str, *, field: str | None = None) -> datetime:
    """``moment`` when it lies in ``[EARLIEST, LATEST)``; else ``InvalidSchedule``."""
    if not EARLIEST <= moment < LATEST:
        raise InvalidSchedule(
            f"{what} {_iso(moment)} is outside {RANGE_TEXT}",
            field=field or what,
        )
    return moment


def check_rule_limits(rule: Any) -> None:
    """Refuse a rule whose ``at`` (``Once``) or ``end_at`` lies outside the accepted range, or
    whose ``max_runs`` exceeds :data:`MAX_RUNS`.

    Checked when a schedule is created or changed, not when a stored rule is read: a journal
    written before the limits existed still loads (and displays, see :func:`to_zone`).
    """
    owner = type(rule).__name__
    at = getattr(rule, "at", None)
    if isinstance(at, datetime):
        check_instant(at, f"{owner} at", field=f"{owner}.at")
    end_at = getattr(rule, "end_at", None)
    if isinstance(end_at, datetime):
        check_instant(end_at, "end_at", field=f"{owner}.end_at")
    max_runs = getattr(rule, "max_runs", None)
    if isinstance(max_runs, int) and max_runs > MAX_RUNS:
        try:
            text = str(max_runs)
        except ValueError:  # longer than MAX_INT_DIGITS
            text = f"a number of more than {MAX_INT_DIGITS} digits"
        if len(text) > MAX_SHOWN:
            text = text[: MAX_SHOWN - 1] + "…"
        raise InvalidSchedule(
            f"max_runs must be at most {MAX_RUNS:,} (MAX_RUNS, 2**31 - 1), got {text}; "
            "for no limit leave max_runs out",
            field=f"{owner}.max_runs",
            rule="R6",
        )


def to_zone(moment: datetime, zone: tzinfo) -> datetime | None:
    """``moment`` in ``zone``, or ``None`` when that local time is beyond ``datetime``'s range
    (a stored instant near year 1 or 9999 shown in a zone east or west of UTC)."""
    try:
        return moment.astimezone(zone)
    except (OverflowError, ValueError):
        return None


def parse_duration(text: str) -> timedelta:
    """``30s``, ``5m``, ``1h30m``, ``2d``, ``1.5h``; a bare number is seconds.

    Raises ``ValueError`` with a one-line message: not a duration, a unit twice, or longer
    than ``MAX_INTERVAL`` (checked before ``timedelta`` could overflow).
    """
    value = text.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        parts = [(value, "s")]
    else:
        parts = _DURATION_PART.findall(value)
        if not parts or "".join(n + u for n, u in parts) != value:
            raise ValueError(f"{shown(text)} is not a duration (e.g. 30s, 5m, 1h30m, 2d)")
        units = [u for _, u in parts]
        if len(set(units)) != len(units):
            raise ValueError(f"{shown(text)} repeats a unit")
    seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
    if not math.isfinite(seconds) or seconds > MAX_INTERVAL.total_seconds():
        raise ValueError(
            f"{shown(text)} is longer than 366 days; an interval is between 1 second and 366 days"
        )
    return timedelta(seconds=seconds)


def parse_json(text: str, what: str) -> Any:
    """JSON text to a value; ``ValueError`` with a one-line message naming ``what`` when it is
    not JSON, nested deeper than ``MAX_NESTING`` levels, or holds an integer longer than
    ``MAX_INT_DIGITS`` digits."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"{what} is nested deeper than {MAX_NESTING} levels") from None
    except ValueError as exc:
        if "digits" not in str(exc):  # pragma: no cover - json raises nothing else
            raise
        raise ValueError(f"{what} holds an integer longer than {MAX_INT_DIGITS} digits") from None
