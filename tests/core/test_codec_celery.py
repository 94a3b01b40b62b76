"""Values as Celery's JSON serializer sends them (SPEC B5), with kombu itself as the oracle.

For any value, ``decode_celery_value(encode_celery_value(v))`` must be exactly what a worker
gets from kombu's ``loads(dumps(v))`` — same types, same values, same key order — and the
stored form must be kombu's wire JSON (plus one marker for NaN/Infinity, which the journal
cannot hold bare). What kombu refuses to send, or its decoder cannot read back, is refused.
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu.utils import json as kombu_json

from celery_durable.core.codec import (
    check_json_value,
    decode_celery_value,
    encode_celery_value,
)
from celery_durable.errors import InvalidSchedule

CASES = settings(
    max_examples=max(1000, settings().max_examples),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def same(a: Any, b: Any) -> bool:
    """Equal in type and value all the way down (``1`` ≠ ``1.0`` ≠ ``True``, tuple ≠ list)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return repr(a) == repr(b)  # datetimes: tzinfo too; Decimal: exponent too


def kombu_round_trip(value: Any) -> Any:
    return kombu_json.loads(kombu_json.dumps(value))


text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers() | st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    text,
    st.datetimes(timezones=st.none() | st.timezones() | st.just(timezone.utc)),
    st.dates(),
    st.times(timezones=st.none() | st.just(timezone(timedelta(hours=-3, minutes=-30)))),
    st.decimals(allow_nan=True, allow_infinity=True) | st.decimals(places=3),
    st.uuids(),
    st.binary(max_size=8),
)
keys = st.one_of(
    text,
    st.integers(-1000, 1000),
    st.floats(allow_nan=False, width=32),
    st.booleans(),
    st.none(),
)


def envelope_like(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """User dicts that kombu's decoder reads as typed values (valid ones and broken ones)."""
    kinds = st.sampled_from(["decimal", "bytes", "date", "uuid", "float", "pickle", "datetime"])
    return st.fixed_dictionaries({"__type__": kinds, "__value__": inner})


values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(keys, inner, max_size=4),
        envelope_like(inner | st.sampled_from(["1.5", "2026-01-02", "abc"])),
    ),
    max_leaves=12,
)


@CASES
@given(values)
def test_round_trip_is_what_the_worker_gets_from_kombu(value: Any) -> None:
    try:
        expected = kombu_round_trip(value)
    except Exception:  # kombu refuses to send it, or its decoder cannot read it
        with pytest.raises(InvalidSchedule):
            encode_celery_value(value, "args")
        return
    stored = encode_celery_value(value, "args")
    check_json_value(stored, "stored args")  # plain JSON: survives the journal unchanged
    assert same(decode_celery_value(stored), expected)
    assert same(decode_celery_value(json.loads(json.dumps(stored))), expected)


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_non_finite(v) for v in value)
    return False


@CASES
@given(values)
def test_stored_form_is_kombus_wire_json(value: Any) -> None:
    """The same ``{"__type__", "__value__"}`` form, byte for byte once written as JSON."""
    try:
        kombu_round_trip(value)
    except Exception:
        return
    stored = encode_celery_value(value)
    if not _has_non_finite(value):
        assert json.dumps(stored) == wire_as_read(kombu_json.dumps(value))


def wire_as_read(wire: str) -> str:
    """kombu's wire JSON, or, when keys collide once written as JSON (``None`` and ``"null"``,
    ``1`` and ``"1"``), the form every reader of it gets: the first key's place, the last value."""
    duplicated = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal duplicated
        duplicated = duplicated or len({k for k, _ in items}) < len(items)
        return dict(items)

    read = json.loads(wire, object_pairs_hook=pairs)
    return json.dumps(read) if duplicated else wire


def test_colliding_keys_are_stored_as_a_worker_reads_them() -> None:
    value = {"null": 1, None: 2, 1: "a", "1": "b"}
    assert encode_celery_value(value) == {"null": 2, "1": "b"}
    assert kombu_round_trip(value) == decode_celery_value(encode_celery_value(value))


@CASES
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | text,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
        max_leaves=12,
    )
)
def test_plain_json_stored_before_reads_unchanged(value: Any) -> None:
    """Compatibility: input stored as plain JSON before this encoding decodes to itself."""
    assert same(decode_celery_value(value), value)
    assert same(encode_celery_value(value), value)


class Point(NamedTuple):
    x: int
    y: int


class Money:
    def __init__(self, amount: str) -> None:
        self.amount = Decimal(amount)

    def __json__(self) -> dict[str, Any]:
        return {"amount": self.amount, "currency": "NOK"}


@pytest.mark.parametrize(
    "value",
    [
        datetime(2026, 12, 3, 1, 30, tzinfo=timezone.utc),
        datetime(2026, 12, 3, 1, 30, 0, 5),
        date(2026, 12, 3),
        time(9, 30),
        Decimal("12.50"),
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        b"utf-8 text",
        b"\xff\x00",
        (1, (2, 3)),
        Point(1, 2),
        {1: "one", 2.5: "x", False: "f", None: "n"},
        Money("9.90"),
        float("nan"),
        [float("inf"), float("-inf")],
        {"__type__": "decimal", "__value__": "1.5"},
    ],
)
def test_examples_from_beat_schedules(value: Any) -> None:
    assert same(decode_celery_value(encode_celery_value(value)), kombu_round_trip(value))


def test_django_lazy_text_is_sent_as_its_text() -> None:
    from django.utils.functional import lazy

    # No settings.configure() here: settings can be configured once per process, and the
    # Django test project (tests/django_project/harness.py) must be the one that does it.
    value = {"greeting": lazy(lambda: "hei", str)()}
    assert decode_celery_value(encode_celery_value(value)) == kombu_round_trip(value)


@pytest.mark.parametrize(
    ("value", "place"),
    [
        ({"a": [1, {2}]}, "args['a'][1]"),
        ([object()], "args[0]"),
        ({(1, 2): "tuple key"}, "args"),
        ([1, 2j], "args[1]"),
        (bytearray(b"x"), "args"),
        ({"__type__": "pickle", "__value__": "gASV"}, "args"),
        ({"when": {"__type__": "decimal", "__value__": "abc"}}, "args['when']"),
        ("\ud800", "args"),
    ],
)
def test_refusals_name_the_place(value: Any, place: str) -> None:
    with pytest.raises(InvalidSchedule) as raised:
        encode_celery_value(value, "args")
    assert str(raised.value).startswith(f"{place}:")


def test_a_circular_value_is_refused() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    with pytest.raises(ValueError):
        kombu_json.dumps(loop)
    with pytest.raises(InvalidSchedule, match="circular"):
        encode_celery_value(loop, "kwargs")


def test_the_error_type_can_be_chosen() -> None:
    with pytest.raises(TypeError, match="set"):
        encode_celery_value({1, 2}, "options['x']", error=TypeError)
    with pytest.raises(LookupError, match="unknown stored type"):
        decode_celery_value({"__type__": "nope", "__value__": 1}, error=LookupError)
