"""Identifiers: S1 (schedule IDs), S2 (run IDs), S4 (idempotency keys)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_durable import MAX_ID_LENGTH, InvalidSchedule, parse_run_id, run_id
from celery_durable.core.ids import (
    check_schedule_id,
    escape,
    idempotency_key,
    schedule_id_for_name,
)

UTC = timezone.utc


def test_run_id_has_seven_fractional_digits_in_utc() -> None:
    due = datetime(2026, 11, 16, 2, 0, tzinfo=timezone(timedelta(hours=1)))
    assert run_id("nightly-backup", due) == "nightly-backup@2026-11-16T01:00:00.0000000Z"


def test_run_id_keeps_microseconds() -> None:
    due = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    assert run_id("s", due) == "s@2026-01-02T03:04:05.1234560Z"


def test_run_id_refuses_naive_due() -> None:
    with pytest.raises(InvalidSchedule, match="aware"):
        run_id("s", datetime(2026, 1, 1))


def test_parse_run_id_splits_at_the_last_at_sign() -> None:
    sid, due = parse_run_id("team@example@2026-11-16T01:00:00.0000000Z")
    assert sid == "team@example"
    assert due == datetime(2026, 11, 16, 1, tzinfo=UTC)
    assert due.tzinfo is UTC


@pytest.mark.parametrize(
    "text",
    [
        "no-at-sign",
        "s@2026-11-16T01:00:00Z",
        "s@2026-11-16T01:00:00.000000Z",
        "s@2026-13-16T01:00:00.0000000Z",
        "s@2026-11-16T01:00:00.0000001Z",
        "@2026-11-16T01:00:00.0000000Z",
        "a~b@2026-11-16T01:00:00.0000000Z",
    ],
)
def test_parse_run_id_refuses_malformed(text: str) -> None:
    with pytest.raises(InvalidSchedule):
        parse_run_id(text)


@given(
    st.text(min_size=1, max_size=50).filter(
        lambda s: s.strip() and "~" not in s and "\x00" not in s
    ),
    st.datetimes(
        min_value=datetime(1970, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    ),
)
def test_run_id_round_trip(sid: str, due: datetime) -> None:
    try:
        sid.encode()
    except UnicodeEncodeError:
        return
    assert parse_run_id(run_id(sid, due)) == (sid, due)


@pytest.mark.parametrize(
    ("sid", "message"),
    [
        ("", "blank"),
        ("   ", "blank"),
        ("a~b", "'~'"),
        ("x" * (MAX_ID_LENGTH + 1), "at most 200"),
        ("a\x00b", "NUL"),
        ("\ud800", "surrogate"),
    ],
)
def test_schedule_id_rules_name_the_broken_rule(sid: str, message: str) -> None:
    with pytest.raises(InvalidSchedule, match=message) as info:
        check_schedule_id(sid)
    assert info.value.rule == "S1"
    assert "S1" not in str(info.value)


def test_schedule_id_must_be_str() -> None:
    with pytest.raises(InvalidSchedule, match="str"):
        check_schedule_id(42)


def test_escaped_budget_counts_task_and_id_together() -> None:
    assert escape("a b/é") == "a%20b%2F%C3%A9"
    check_schedule_id("x" * 200, "t" * 5)
    with pytest.raises(InvalidSchedule, match="205"):
        check_schedule_id("x" * 200, "t" * 6)
    # 34 characters outside ASCII escape to 6 bytes each: 204, plus a 6-letter task name.
    with pytest.raises(InvalidSchedule, match="escaped"):
        check_schedule_id("é" * 34, "remind")
    check_schedule_id("é" * 33, "remind")


def test_idempotency_key_format() -> None:
    rid = run_id("nightly", datetime(2026, 11, 16, 1, tzinfo=UTC))
    assert idempotency_key("backup", rid, 2) == f"backup/{rid}/2"
    assert idempotency_key("backup", rid, "3.1") == f"backup/{rid}/3.1"


# B1/I1: entry names that break S1 map to schedule IDs by one rule ------------------------


@pytest.mark.parametrize("name", ["nightly-report", "team@example", "Ünïcode name", "a" * 200])
def test_a_valid_entry_name_is_its_own_schedule_id(name: str) -> None:
    assert schedule_id_for_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["report ~ weekly", " padded", "line\nbreak", "rtl\u202eoverride", "", "a" * 201, "~"],
)
def test_an_invalid_entry_name_maps_to_a_valid_stable_id(name: str) -> None:
    sid = schedule_id_for_name(name)
    assert sid != name
    assert check_schedule_id(sid, "t" * 140) == sid
    assert escape(sid) == sid
    assert len(sid) <= 57
    assert schedule_id_for_name(name) == sid


def test_the_mapping_is_the_documented_prefix_and_hash() -> None:
    # Written out by hand from the rule in docs/howto-migrate.md.
    import hashlib

    name = "Send report ~ weekly!"
    expected = "Send-report-weekly-" + hashlib.sha256(name.encode()).hexdigest()[:16]
    assert schedule_id_for_name(name) == expected
    assert schedule_id_for_name("\x00\x01").startswith("entry-")


def test_a_name_too_long_for_its_task_is_mapped() -> None:
    name = "n" * 120
    assert schedule_id_for_name(name) == name
    mapped = schedule_id_for_name(name, "t" * 100)
    assert mapped != name and check_schedule_id(mapped, "t" * 100) == mapped


@given(st.lists(st.text(max_size=230), min_size=2, max_size=2, unique=True))
def test_two_names_never_share_an_id(names: list[str]) -> None:
    one, two = (schedule_id_for_name(n) for n in names)
    assert one != two
    for sid in (one, two):
        assert check_schedule_id(sid) == sid
