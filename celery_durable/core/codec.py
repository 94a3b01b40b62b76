"""JSON helpers shared by everything that stores or sends data. JSON only, never pickle."""

from __future__ import annotations

import base64
import functools
import json
import math
import re
import sys
from collections.abc import Callable
from datetime import date, datetime, timezone
from datetime import time as dt_time
from decimal import Decimal
from functools import lru_cache
from typing import Any, cast
from uuid import UUID

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


_LEAVES = frozenset((str, int, bool, type(None)))
"""Exact types that always come back from JSON as they went in (ints beyond 64 bits too)."""


def is_plain_json(value: object) -> bool:
    """Fast check: would ``value`` come back unchanged from a JSON round trip?

    Every event a step stores passes here: exact types are told by one set lookup, and only
    subclasses (an ``IntEnum``, a ``str`` subclass) take :func:`_plain_by_isinstance`."""
    kind = type(value)
    if kind in _LEAVES:
        return True
    if kind is dict:
        for key, item in cast("dict[Any, Any]", value).items():
            if type(key) is not str and not isinstance(key, str):
                return False
            if type(item) not in _LEAVES and not is_plain_json(item):
                return False
        return True
    if kind is list:
        for item in cast("list[Any]", value):
            if type(item) not in _LEAVES and not is_plain_json(item):
                return False
        return True
    if kind is float:
        return math.isfinite(cast(float, value))
    return _plain_by_isinstance(value)


def _plain_by_isinstance(value: object) -> bool:
    """:func:`is_plain_json` for subclasses of the JSON types (and anything else: ``False``)."""
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


def loads_written(text: str | bytes) -> Any:
    """What ``json.loads(text)`` gives, for text :func:`dumps` wrote (an index row's state).

    orjson reads it several times faster, but it reads an int beyond 64 bits as a float and
    refuses what it cannot write (lone surrogates, NaN): the text is read by orjson only when
    writing back what it read gives the same text, which a float where the text had an int
    never does (orjson writes every float with a point or an exponent). Anything else, and
    text written by ``json`` (:func:`dumps`' own fallback), is read by ``json``."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
    if orjson.dumps(value) != (text if isinstance(text, bytes) else text.encode()):
        return json.loads(text)
    return value


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
    except ValueError as exc:
        if "digits" in str(exc):  # Python refuses to print an int of more than 4300 digits
            raise error(f"{what} holds an integer longer than 4300 digits") from None
        raise error(f"{what} must survive a JSON round trip: {exc}") from None
    except (TypeError, RecursionError) as exc:
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
    """The aware UTC datetime written by :func:`time_to_json` (also accepts ``+00:00`` forms).

    Parsed texts are remembered (datetimes are immutable): the index rows of schedules due
    together share their instants, read thousands of times in a burst."""
    return _time_parsed(text) if type(text) is str else _time_from_text(text)


def _time_from_text(text: str) -> datetime:
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


_time_parsed = lru_cache(maxsize=4096)(_time_from_text)


def optional_time_to_json(moment: datetime | None) -> str | None:
    return None if moment is None else time_to_json(moment)


def optional_time_from_json(text: str | None) -> datetime | None:
    return None if text is None else time_from_json(text)


# --- values as Celery's JSON serializer sends them (SPEC B5) --------------------------------
#
# kombu's JSON (``kombu.utils.json``, 5.x) sends datetime, date, time, Decimal, UUID and bytes as
# ``{"__type__": name, "__value__": text}`` and turns them back into objects on the worker;
# tuples travel as lists and dict keys as strings. The journal stores exactly that JSON form, so
# a stored value decodes to what the worker would have received from stock beat. One addition:
# NaN and ±Infinity (which kombu writes as bare ``NaN`` tokens, and the journal refuses) are
# stored as ``{"__type__": "float", "__value__": "NaN"}``. kombu knows no "float" type, so no
# value kombu could deliver is ever read as one.

_ENVELOPE = frozenset(("__type__", "__value__"))
_SURROGATE = re.compile("[\ud800-\udfff]")
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_KOMBU_DECODERS: dict[str, Callable[[Any], Any]] = {
    "datetime": datetime.fromisoformat,
    "date": lambda text: datetime.fromisoformat(text).date(),
    "time": dt_time.fromisoformat,
    "decimal": Decimal,
    "uuid": lambda fields: UUID(**fields),
    "bytes": lambda text: text.encode("utf-8"),
    "base64": lambda text: base64.b64decode(text.encode("utf-8")),
}
_DECODERS: dict[str, Callable[[Any], Any]] = {
    **_KOMBU_DECODERS,
    "float": lambda text: _NON_FINITE[text],
}


def _typed(name: str, value: Any) -> dict[str, Any]:
    return {"__type__": name, "__value__": value}


def _float_text(number: float) -> str:
    return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")


def _key(key: Any, path: str, error: type[Exception]) -> str:
    """A dict key as ``json.dumps`` writes it: str, int, float, bool and None only."""
    if isinstance(key, str):
        return str.__str__(key)
    if key is True or key is False or key is None:
        return {True: "true", False: "false", None: "null"}[key]
    if isinstance(key, int):
        return int.__repr__(key)
    if isinstance(key, float):
        return float.__repr__(key) if math.isfinite(key) else _float_text(key)
    raise error(
        f"{path}: a dict key of type {type(key).__name__} cannot be sent by Celery's JSON "
        "serializer (keys must be str, int, float, bool or None)"
    )


def _textual(value: object) -> bool:
    """Django's lazy strings, which kombu sends as ``str(value)`` when Django is loaded."""
    functional = sys.modules.get("django.utils.functional")
    promise = getattr(functional, "Promise", None)
    return promise is not None and isinstance(value, promise)


def _encode(value: Any, path: str, error: type[Exception], seen: set[int], depth: int) -> Any:
    if depth > MAX_NESTING:
        raise error(f"{path}: nested deeper than {MAX_NESTING} levels")
    if isinstance(value, str):
        text = str.__str__(value)
        if not text.isascii() and _SURROGATE.search(text):
            raise error(f"{path}: text with a lone surrogate cannot be stored (not UTF-8)")
        return text
    if value is None or value is True or value is False:
        return value
    if isinstance(value, int):
        return int(int.__repr__(value))
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else _typed("float", _float_text(value))
    if isinstance(value, (list, tuple, dict)):
        if id(value) in seen:
            raise error(f"{path}: refers to itself (a circular reference)")
        seen.add(id(value))
        try:
            if isinstance(value, dict):
                return _encode_dict(value, path, error, seen, depth)
            return [
                _encode(item, f"{path}[{i}]", error, seen, depth + 1)
                for i, item in enumerate(value)
            ]
        finally:
            seen.discard(id(value))
    return _encode_object(value, path, error, seen, depth)


def _encode_dict(
    value: dict[Any, Any], path: str, error: type[Exception], seen: set[int], depth: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        text = _key(key, path, error)
        out[text] = _encode(item, f"{path}[{text!r}]", error, seen, depth + 1)
    if out.keys() == _ENVELOPE:
        # The worker's decoder reads this dict as a typed value: it must be one it knows.
        kind = out["__type__"]
        decoder = _KOMBU_DECODERS.get(kind) if isinstance(kind, str) else None
        if decoder is None:
            raise error(
                f"{path}: a dict with exactly the keys '__type__' and '__value__' is read by "
                f"Celery's JSON decoder as a typed value, and {kind!r} is not a type it knows"
            )
        _decode(out, path, error)
    return out


def _encode_object(
    value: Any, path: str, error: type[Exception], seen: set[int], depth: int
) -> Any:
    reducer = getattr(value, "__json__", None)
    if reducer is not None:
        return _encode(reducer(), path, error, seen, depth + 1)
    if _textual(value):
        return str(value)
    # The order kombu registers its types in: a datetime is also a date.
    if isinstance(value, datetime):
        return _typed("datetime", datetime.isoformat(value))
    if isinstance(value, date):
        return _typed("date", date.isoformat(value))
    if isinstance(value, dt_time):
        return _typed("time", dt_time.isoformat(value))
    if isinstance(value, Decimal):
        return _typed("decimal", str(value))
    if isinstance(value, UUID):
        return _typed("uuid", {"hex": value.hex})
    if isinstance(value, bytes):
        try:
            return _typed("bytes", value.decode("utf-8"))
        except UnicodeDecodeError:
            return _typed("base64", base64.b64encode(value).decode("utf-8"))
    raise error(
        f"{path}: a {type(value).__name__} cannot be sent by Celery's JSON serializer "
        "(it sends str, int, float, bool, None, lists, tuples, dicts, datetime, date, time, "
        "Decimal, UUID and bytes)"
    )


def encode_celery_value(
    value: Any, what: str = "value", *, error: type[Exception] = InvalidSchedule
) -> Any:
    """The JSON form of ``value`` as Celery's JSON serializer (kombu) puts it on the wire.

    For args, kwargs and option values of ``beat_schedule`` entries and imported rows (B5):
    ``decode_celery_value(encode_celery_value(v))`` is what a worker receives from stock beat
    for ``v`` (kombu's ``loads(dumps(v))``): datetime, date, time, Decimal, UUID and bytes come
    back as themselves, tuples as lists, int/float/bool/None dict keys as strings. The result
    is plain JSON (str keys, finite numbers), ready for the journal. Raises ``error`` naming
    the place in ``what`` (``args[1]['when']``) for what Celery's JSON serializer refuses or
    its decoder cannot read back. Never pickles.
    """
    return _encode(value, what, error, set(), 0)


def _decode_envelope(data: dict[str, Any], path: str, error: type[Exception]) -> Any:
    kind = data["__type__"]
    decoder = _DECODERS.get(kind) if isinstance(kind, str) else None
    if decoder is None:
        raise error(f"{path}: unknown stored type {kind!r}")
    try:
        return decoder(data["__value__"])
    except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError) as exc:
        raise error(
            f"{path}: {kind} value {data['__value__']!r} cannot be read back by Celery's JSON "
            f"decoder ({exc})"
        ) from None


def _decode(data: Any, path: str, error: type[Exception]) -> Any:
    if isinstance(data, list):
        return [_decode(item, f"{path}[{i}]", error) for i, item in enumerate(data)]
    if isinstance(data, dict):
        out = {key: _decode(item, f"{path}[{key!r}]", error) for key, item in data.items()}
        return _decode_envelope(out, path, error) if out.keys() == _ENVELOPE else out
    return data


def decode_celery_value(
    data: Any, what: str = "value", *, error: type[Exception] = InvalidSchedule
) -> Any:
    """The value :func:`encode_celery_value` stored: what the worker would receive (B5).

    Plain JSON stored before this encoding existed reads back unchanged, except a dict with
    exactly the keys ``__type__`` and ``__value__``, which becomes the typed value — as the
    worker's JSON decoder would have read it anyway.
    """
    return _decode(data, what, error)
