"""Stored JSON text: the fast path writes what the standard library writes."""

from __future__ import annotations

import enum
import json
import math
from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_durable.core.codec import dumps, is_plain_json, loads_written
from celery_durable.store.journal.encoding import decode_data, encode_data

plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)  # beyond orjson's 64 bits too
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),  # lone surrogates included
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _standard(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@given(plain)
def test_dumps_reads_back_as_the_standard_library_text_does(value: object) -> None:
    assert json.loads(dumps(value)) == json.loads(_standard(value))


@given(st.dictionaries(st.text(), plain, max_size=5))
def test_event_data_reads_back_unchanged_or_is_refused(value: dict[str, object]) -> None:
    try:
        text = encode_data(value)
    except ValueError as exc:  # only text that is not valid Unicode is refused here
        assert "not valid Unicode" in str(exc)
        return
    assert json.loads(text) == value


def test_big_ints_stay_exact() -> None:
    assert dumps({"n": 2**70}) == '{"n":1180591620717411303424}'
    assert encode_data({"n": -(2**65)}) == '{"n":-36893488147419103232}'


@pytest.mark.parametrize("bad", [math.nan, math.inf, [1.0, -math.inf]])
def test_nan_and_infinity_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        dumps({"x": bad})


@pytest.mark.parametrize(
    "value", [(1, 2), {"at": datetime(2026, 1, 1, tzinfo=timezone.utc)}, {1: "a"}]
)
def test_values_outside_plain_json_keep_the_standard_behaviour(value: object) -> None:
    """Tuples become lists, int keys become text, datetimes are refused, as json.dumps does."""
    try:
        expected: str | type[Exception] = _standard(value)
    except TypeError:
        expected = TypeError
    if expected is TypeError:
        with pytest.raises(TypeError):
            dumps(value)
    else:
        assert dumps(value) == expected


@given(st.dictionaries(st.text(), plain, max_size=5))
def test_stored_event_data_decodes_as_the_standard_library_does(value: dict[str, object]) -> None:
    """What a replay reads (orjson where it is exact) equals ``json.loads``, type for type:
    an int beyond 64 bits stays an int (orjson alone would give a float)."""
    try:
        text = encode_data(value)
    except ValueError:
        return
    decoded = decode_data(text, 1)
    assert decoded == json.loads(text) == value
    assert _types(decoded) == _types(value)


def test_stored_big_ints_and_long_digit_strings_decode_exactly() -> None:
    text = encode_data({"n": 2**70, "m": -(2**64), "s": "12345678901234567890123", "f": 1.5})
    decoded = decode_data(text, 1)
    assert decoded == {"n": 2**70, "m": -(2**64), "s": "12345678901234567890123", "f": 1.5}
    assert type(decoded["n"]) is int and type(decoded["m"]) is int


@given(plain)
def test_written_text_reads_back_as_the_standard_library_does(value: object) -> None:
    """An index row's state (written by ``dumps``, read by orjson where that is exact) reads
    as ``json.loads`` reads it, type for type: big ints, floats, text orjson refuses."""
    try:
        text = dumps(value)
    except ValueError:
        return
    decoded = loads_written(text)
    assert decoded == json.loads(text)
    assert _types(decoded) == _types(json.loads(text))


@pytest.mark.parametrize(
    "text", ['{"n":1180591620717411303424}', "[-36893488147419103232,1.0]", '{"a": 1, "a": 2}']
)
def test_written_text_with_ints_beyond_64_bits_reads_exactly(text: str) -> None:
    assert loads_written(text) == json.loads(text)
    assert _types(loads_written(text)) == _types(json.loads(text))


def _types(value: object) -> object:
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value)


class _Level(enum.IntEnum):
    LOW = 1


class _Text(str):
    pass


@pytest.mark.parametrize(
    "value, plain_json",
    [
        (None, True), (True, True), (2**70, True), ("é", True), (1.5, True),
        (math.nan, False), ([1, [2, {"a": -math.inf}]], False), ({"a": [1, "b", None]}, True),
        ({1: "a"}, False), ((1, 2), False), ({"a": (1,)}, False), (set(), False),
        (_Level.LOW, True), (_Text("x"), True), ({_Text("k"): _Level.LOW}, True),
        ({"at": datetime(2026, 1, 1, tzinfo=timezone.utc)}, False),
    ],
)  # fmt: skip
def test_is_plain_json_tells_exact_types_and_subclasses_as_isinstance_does(
    value: object, plain_json: bool
) -> None:
    assert is_plain_json(value) is plain_json
