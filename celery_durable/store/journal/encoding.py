"""Checking and encoding what goes into the events table, and decoding what comes out.

Everything is checked before any SQL runs, so a refused append stores nothing: stream and type
names (length, NUL, valid Unicode), versions, and data that survives a JSON round trip unchanged
(no NaN/Infinity, str keys only, no tuples or objects).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from celery_durable.core.codec import is_plain_json as _is_plain_json
from celery_durable.core.codec import plain_json_text
from celery_durable.core.journal import Append, NewEvent, StoredEvent, category_of
from celery_durable.errors import AppendConflict, JournalError

MAX_STREAM_LENGTH = 255
MAX_CATEGORY_LENGTH = 64
MAX_TYPE_LENGTH = 128


def _check_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, not {value!r}")


_CHECKED: dict[int, set[str]] = {}
"""Names already found good, per length limit: a run's steps append to one stream with a few
event types, so each name is checked once, not at every append."""
_CHECKED_MAX = 4096


def _check_name(what: str, value: object, limit: int) -> str:
    known = _CHECKED.get(limit)
    if known is not None and type(value) is str and value in known:
        return value
    name = _check_new_name(what, value, limit)
    if known is None:
        known = _CHECKED[limit] = set()
    elif len(known) >= _CHECKED_MAX:
        known.clear()
    known.add(name)
    return name


def _check_new_name(what: str, value: object, limit: int) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > limit:
        raise ValueError(f"{what} {value[:40]!r}… is longer than {limit} characters")
    if "\x00" in value:
        raise ValueError(f"{what} {value!r} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} {value!r} is not valid Unicode text") from None
    return value


def _json_problem(value: object, path: str) -> str | None:
    """The first thing in ``value`` that JSON would not round-trip, with its path (slow)."""
    if _is_plain_json(value):
        return None
    if isinstance(value, float):
        return f"{path} is {value!r}: JSON has no NaN or infinity"
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has the key {key!r}: JSON object keys are str"
            problem = _json_problem(item, f"{path}[{key!r}]")
            if problem:
                return problem
    if isinstance(value, list):
        for index, item in enumerate(value):
            problem = _json_problem(item, f"{path}[{index}]")
            if problem:
                return problem
    hint = " (use a list)" if isinstance(value, tuple) else ""
    return f"{path} is a {type(value).__name__}, which JSON does not round-trip{hint}"


# Built once: json.dumps() with non-default options constructs an encoder on every call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode_data(data: object, where: str = "data") -> str:
    """The compact JSON text stored for an event's data; ``ValueError`` if it cannot be.

    Refused: anything that would not come back unchanged (NaN, infinities, non-``str`` keys,
    tuples, sets, datetimes, other objects) and text that is not valid Unicode.
    """
    if not isinstance(data, dict):
        raise TypeError(f"{where} must be a dict, not {type(data).__name__}")
    if not _is_plain_json(data):
        raise ValueError(_json_problem(data, where))
    text = plain_json_text(data)
    if text is not None:
        return text
    text = _ENCODER.encode(data)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{where} holds text that is not valid Unicode") from None
    return text


def _sequence(value: object) -> bool:
    if type(value) in (list, tuple):  # the common case, without an ABC check
        return True
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _rows(
    appends: Sequence[Append], *, allow_empty: bool = False
) -> tuple[list[dict[str, Any]], list[int]]:
    """Check every append and build the statement parameters, in append order."""
    if not _sequence(appends):
        raise TypeError("appends must be a sequence of Append")
    if not appends and not allow_empty:
        raise ValueError("nothing to append")
    rows: list[dict[str, Any]] = []
    versions: list[int] = []
    for append in appends:
        if not isinstance(append, Append):
            raise TypeError(f"expected an Append, not {type(append).__name__}")
        stream = _check_name("stream", append.stream, MAX_STREAM_LENGTH)
        category = _check_name("category", category_of(stream), MAX_CATEGORY_LENGTH)
        _check_int("expected_version", append.expected_version)
        events = append.events
        if not _sequence(events) or not events:
            raise ValueError(f"append to {stream!r} needs a non-empty sequence of NewEvent")
        version = append.expected_version
        for new in events:
            if not isinstance(new, NewEvent):
                raise TypeError(f"expected a NewEvent, not {type(new).__name__}")
            type_name = _check_name("event type", new.type, MAX_TYPE_LENGTH)
            try:
                data = encode_data(new.data)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"event {type_name!r} for {stream!r}: {exc}") from None
            version += 1
            rows.append(
                {
                    "stream": stream,
                    "version": version,
                    "prev": version - 1,
                    "category": category,
                    "type": type_name,
                    "data": data,
                }
            )
        versions.append(version)
    return rows, versions


def first_misfit(
    appends: Sequence[Append], version_of: Callable[[str], int]
) -> AppendConflict | None:
    """The conflict of the first append that does not fit its stream's version (A8), counting
    the appends before it in the same batch; ``None`` when every one fits."""
    heads: dict[str, int] = {}
    for append in appends:
        actual = heads[append.stream] if append.stream in heads else version_of(append.stream)
        if append.expected_version != actual:
            return AppendConflict(
                f"stream {append.stream!r} is at version {actual}, not at the expected "
                f"version {append.expected_version}: read it again and decide again",
                stream=append.stream,
                expected_version=append.expected_version,
                actual_version=actual,
            )
        heads[append.stream] = actual + len(append.events)
    return None


_LONG_DIGITS = re.compile(r"[0-9]{19}")
"""Nineteen digits in a row: perhaps an int orjson would read as a float (beyond 64 bits)."""


def decode_data(text: str, position: Any) -> dict[str, Any]:
    """An event's stored JSON text as the dict ``json.loads`` gives.

    orjson reads it several times faster (a replay reads every event of its run). It would
    turn an int beyond 64 bits into a float, so text with a long run of digits (anywhere, even
    inside a string) is read by ``json``; so is text orjson refuses (lone surrogates)."""
    try:
        if _LONG_DIGITS.search(text) is None:
            try:
                data = orjson.loads(text)
            except orjson.JSONDecodeError:
                data = json.loads(text)
        else:
            data = json.loads(text)
    except ValueError:
        raise JournalError(
            f"event at position {position} holds data that is not JSON", position=position
        ) from None
    return data


_DIGITS_AS_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_NINETEEN_DIGITS = b"0" * 19


def decode_many(texts: list[str], positions: Sequence[Any]) -> list[Any]:
    """:func:`decode_data` of each text (a replay's read: its run's whole stream).

    One look for a long run of digits over all the texts at once (every ASCII digit mapped to
    ``0``, then a search for nineteen of them: ~15x faster than the regular expression; a line
    break between two texts is not a digit) and one pass of orjson; when some text has such a
    run, or one is not JSON orjson reads, each is read by :func:`decode_data` (the same values,
    the same error)."""
    try:
        joined = "\n".join(texts).encode("utf-8", "surrogatepass")
        if _NINETEEN_DIGITS not in joined.translate(_DIGITS_AS_ZERO):
            return list(map(orjson.loads, texts))
    except (TypeError, orjson.JSONDecodeError):
        pass
    return [decode_data(text, position) for text, position in zip(texts, positions, strict=True)]


def _event_maker() -> Callable[..., StoredEvent]:
    """A maker of :class:`StoredEvent` from its six fields in order, for the rows of a read.

    The frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` with
    keyword arguments (~1.5 µs); its slots set directly take ~0.6 µs. A class whose fields
    are not these slots gets its own constructor."""
    names = ("position", "stream", "version", "type", "data", "recorded_at")
    slots = getattr(StoredEvent, "__slots__", ())
    if tuple(f.name for f in dataclasses.fields(StoredEvent)) != names or set(slots) != set(names):
        return lambda p, s, v, t, d, r: StoredEvent(  # pragma: no cover - a changed class
            position=p, stream=s, version=v, type=t, data=d, recorded_at=r
        )
    setters = [vars(StoredEvent)[name].__set__ for name in names]
    set_p, set_s, set_v, set_t, set_d, set_r = setters
    new = object.__new__

    def make(p: int, s: str, v: int, t: str, d: Any, r: Any) -> StoredEvent:
        event = new(StoredEvent)
        set_p(event, p)
        set_s(event, s)
        set_v(event, v)
        set_t(event, t)
        set_d(event, d)
        set_r(event, r)
        return event

    return make


_make_event = _event_maker()


def stored_events(rows: Sequence[Any], recorded_at: Callable[[Any], Any]) -> list[StoredEvent]:
    """The events of the driver's rows of ``(position, stream, version, type, data,
    recorded_at)``, ``recorded_at`` read by the column type's result processor: what
    :func:`_stored` makes of SQLAlchemy's rows of the same columns."""
    datas = decode_many([row[4] for row in rows], [row[0] for row in rows])
    make = _make_event
    return [
        make(int(position), stream, int(version), type_, data, recorded_at(at))
        for (position, stream, version, type_, _, at), data in zip(rows, datas, strict=True)
    ]


def _stored(row: Any) -> StoredEvent:
    """The event of a row of ``(position, stream, version, type, data, recorded_at)``."""
    position, stream, version, type_, data, recorded_at = row
    return StoredEvent(
        position=int(position),
        stream=stream,
        version=int(version),
        type=type_,
        data=decode_data(data, position),
        recorded_at=recorded_at,
    )
