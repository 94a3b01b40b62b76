"""The stored form of rules: ``rule_from_json``, the inverse of ``Rule.to_json`` (§9)."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from celery_durable.core import crontab
from celery_durable.core.rules._base import _check_instant, _invalid, _short, _show
from celery_durable.core.rules._beat_entry import BeatEntry
from celery_durable.core.rules._calendar import Daily, Weekly
from celery_durable.core.rules._cron import Cron, Crontab
from celery_durable.core.rules._interval import Every, Once
from celery_durable.core.rules._solar import Solar

if TYPE_CHECKING:
    from celery_durable.core.rules import Rule


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
