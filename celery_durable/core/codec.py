"""JSON helpers shared by everything that stores or sends data. JSON only, never pickle."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

import orjson

from celery_durable.errors import InvalidSchedule

DEFAULT_MAX_INPUT_BYTES = 256 * 1024
"""Inputs larger than this as JSON are refused (setting ``durable_max_input_bytes``)."""

MAX_NESTING = 100
"""Deeper structures are refused before encoding: they would overflow parsers elsewhere."""


def dumps(value: Any) -> str:
    """Compact JSON as stored in the journal; NaN and Infinity are refused."""
    if is_plain_json(value):
        text = plain_json_text(value)
        if text is not None:
            return text
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def is_plain_json(value: object) -> bool:
    """Fast check: would ``value`` come back unchanged from a JSON round trip?"""
    if value is None or isinstance(value, (str, int)):  # bool is an int
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain_json(v) for k, v in value.items())
    if isinstance(value, list):
        return all(is_plain_json(item) for item in value)
    return False


def plain_json_text(value: Any) -> str | None:
    """Compact JSON of a value :func:`is_plain_json` accepted, or ``None`` to use ``json``.

    For plain JSON, orjson writes what ``json.dumps(separators=(",", ":"),
    ensure_ascii=False)`` writes, several times faster. It refuses ints beyond 64 bits, lone
    surrogates and very deep nesting: those take the standard library's path, which keeps big
    ints exact and names bad text.
    """
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return None


def canonical(value: Any) -> str:
    """JSON with sorted keys: equal content gives equal text (used for content digests)."""
    return json.dumps(
        value, separators=(",", ":"), sort_keys=True, ensure_ascii=True, allow_nan=False
    )


def _depth_ok(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return False
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1) for v in item)
    return True


def check_json_value(
    value: Any,
    what: str,
    *,
    max_bytes: int = DEFAULT_MAX_INPUT_BYTES,
    error: type = InvalidSchedule,
) -> Any:
    """Return ``value`` when it survives a JSON round trip unchanged and fits ``max_bytes``.

    Tuples, non-string keys, NaN/Infinity, sets and objects do not survive and are refused with
    ``error`` (``InvalidSchedule`` by default) naming ``what``.
    """
    if not _depth_ok(value, MAX_NESTING):
        raise error(f"{what} is nested deeper than {MAX_NESTING} levels")
    try:
        text = dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise error(f"{what} must survive a JSON round trip: {exc}") from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise error(f"{what} contains text that is not valid Unicode (lone surrogate)") from None
    if size > max_bytes:
        raise error(f"{what} takes {size} bytes as JSON; at most {max_bytes} allowed")
    if "\x00" in text:  # json escapes NUL as \u0000, so this is only a guard
        raise error(f"{what} contains a NUL character")
    if not _same(json.loads(text), value):
        raise error(
            f"{what} must survive a JSON round trip unchanged "
            "(tuples, non-str keys, sets and custom objects do not)"
        )
    return value


def _same(a: Any, b: Any) -> bool:
    """Equality that also tells ``1`` from ``1.0`` and ``True`` and lists from tuples."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return False
    return bool(a == b)


def cached_for_datetimes(format_: Callable[[datetime], str]) -> Callable[[datetime], str]:
    """Cache a formatter of instants: a burst writes the same few (its "now", shared due
    times) thousands of times. Only exact ``datetime`` values are cached; anything else goes
    to the formatter itself and fails as it always did."""
    cached = lru_cache(maxsize=4096)(format_)

    @functools.wraps(format_)
    def format_moment(moment: datetime) -> str:
        return cached(moment) if type(moment) is datetime else format_(moment)

    return format_moment


@cached_for_datetimes
def time_to_json(moment: datetime) -> str:
    """An aware datetime as ISO 8601 UTC with microseconds and ``Z``."""
    if moment.tzinfo is not timezone.utc:
        moment = moment.astimezone(timezone.utc)
    # isoformat is several times faster than strftime; this runs for every stored time.
    return moment.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def time_from_json(text: str) -> datetime:
    """The aware UTC datetime written by :func:`time_to_json` (also accepts ``+00:00`` forms)."""
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def optional_time_to_json(moment: datetime | None) -> str | None:
    return None if moment is None else time_to_json(moment)


def optional_time_from_json(text: str | None) -> datetime | None:
    return None if text is None else time_from_json(text)
