"""Command-line syntax for rules, instants, durations and JSON values.

``--daily 02:00 --zone Europe/Oslo``, ``--weekly mon,thu@08:00``, ``--every 1h30m``,
``--cron "0 2 * * *"``, ``--once 2026-12-24T18:00Z``. A time without an offset is read in
``--zone``; without ``--zone`` it is refused, so that no schedule depends on the host's zone.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from celery_durable.cli.common import invalid
from celery_durable.core import limits
from celery_durable.core.secrets import decode_secrets
from celery_durable.errors import InvalidSchedule
from celery_durable.presentation import NotATime, parse_instant

RULE_OPTIONS = ("daily", "weekly", "every", "cron", "once")

_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def duration(text: str, what: str = "--every") -> timedelta:
    """``30s``, ``5m``, ``1h30m``, ``2d``, ``1.5h``; a bare number is seconds."""
    try:
        return limits.parse_duration(text)
    except ValueError as exc:
        raise invalid(f"{what}: {exc}") from None


def instant(text: str, what: str, zone: str | None) -> datetime:
    """An ISO 8601 instant; ``Z`` or an offset, or a local time read in ``zone``."""
    try:
        return parse_instant(text, zone)
    except NotATime as exc:
        if exc.reason == "offset":
            raise invalid(
                f"{what}: {text!r} has no UTC offset; add Z or +01:00, or give --zone"
            ) from None
        raise invalid(
            f"{what}: {text!r} is not an ISO 8601 time (e.g. 2026-12-24T18:00Z)"
        ) from None
    except InvalidSchedule as exc:  # an unknown --zone
        raise invalid(str(exc)) from None


def weekly(text: str) -> tuple[list[str], str]:
    """``mon,thu@08:00`` or ``mon-fri@08:00`` → (day names, time)."""
    days_text, sep, at = text.partition("@")
    if not sep or not days_text.strip() or not at.strip():
        raise invalid(f"--weekly: {text!r} is not DAYS@HH:MM (e.g. mon,thu@08:00)")
    days: list[str] = []
    for item in days_text.split(","):
        item = item.strip().lower()
        first, dash, last = item.partition("-")
        if dash:
            if first[:3] not in _DAYS or last[:3] not in _DAYS:
                raise invalid(f"--weekly: {item!r} is not a range of days (e.g. mon-fri)")
            start, end = _DAYS.index(first[:3]), _DAYS.index(last[:3])
            if end < start:
                raise invalid(f"--weekly: the range {item!r} runs backwards")
            days.extend(_DAYS[start : end + 1])
        else:
            days.append(item)
    return days, at.strip()


def blackout(text: str, what: str = "--blackout") -> Any:
    """A blackout window (P4) in the form :func:`celery_durable.core.blackout_text.parse_window`
    reads (``InvalidSchedule`` names what is wrong)."""
    from celery_durable.core.blackout_text import parse_window

    return parse_window(text, what)


def json_value(text: str, what: str) -> Any:
    """The JSON of an option; ``{"$secret": "env:NAME"}`` in it is a Secret (P5)."""
    try:
        return decode_secrets(limits.parse_json(text, what))
    except ValueError as exc:
        raise invalid(str(exc)) from None


def chosen_rule(values: dict[str, Any]) -> str | None:
    """The one rule option given; ``None`` when none was; an error for several."""
    given = [name for name in RULE_OPTIONS if values.get(name) is not None]
    if len(given) > 1:
        raise invalid("give only one rule option, not " + " and ".join(f"--{n}" for n in given))
    return given[0] if given else None


def make_rule(
    kind: str,
    text: str,
    *,
    zone: str | None,
    end_at: datetime | None,
    max_runs: int | None,
) -> Any:
    """The rule for one of :data:`RULE_OPTIONS` (``InvalidSchedule`` comes from the rules)."""
    from celery_durable.core.rules import Cron, Daily, Every, Once, Weekly

    bounds: dict[str, Any] = {"end_at": end_at, "max_runs": max_runs}
    if kind in ("daily", "weekly") and zone is None:
        raise invalid(f"--{kind} needs --zone (an IANA zone such as Europe/Oslo, or UTC)")
    if kind == "daily":
        return Daily(text.strip(), str(zone), **bounds)
    if kind == "weekly":
        days, at = weekly(text)
        return Weekly(days, at, str(zone), **bounds)
    if kind == "every":
        return Every(duration(text), **bounds)
    if kind == "cron":
        return Cron(text, zone or "UTC", **bounds)
    return Once(instant(text, "--once", zone), **bounds)


def with_bounds(rule: Any, *, zone: str | None, end_at: Any, max_runs: Any) -> Any:
    """The current rule with a new zone or new bounds (``schedules change`` without a rule).

    ``end_at``/``max_runs``: ``...`` keeps the current value, ``None`` removes it.
    """
    from celery_durable.core.codec import time_to_json
    from celery_durable.core.rules import rule_from_json

    data = dict(rule.to_json())
    if zone is not None:
        if "zone" not in data:
            raise invalid(f"--zone: a {data['type']} rule has no zone; give a new rule too")
        data["zone"] = zone
    if end_at is not ...:
        data["end_at"] = None if end_at is None else time_to_json(end_at)
    if max_runs is not ...:
        data["max_runs"] = max_runs
    return rule_from_json(data)
