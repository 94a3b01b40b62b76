"""Stored JSON text: the fast path writes what the standard library writes."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_durable.core.codec import dumps
from celery_durable.store.journal.encoding import encode_data

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
