"""The text form of blackout windows (SPEC P4): ``describe`` and ``parse_window`` are exact
inverses for every window the API accepts, so the CLI and the admin show a window in a form
that reads back unchanged."""

from __future__ import annotations

from datetime import datetime, time, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_durable import Blackout, Cron, Daily, InvalidSchedule, Weekly
from celery_durable.core.blackout_text import parse_window, span_text
from celery_durable.core.rules import Crontab

UTC = timezone.utc
ZONES = ("UTC", "Europe/Oslo", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe")

names = st.text(
    st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Zl", "Zp"), blacklist_characters=";"),
    min_size=1,
    max_size=40,
).filter(lambda s: s == s.strip() and s.strip() != "")
durations = st.timedeltas(min_value=timedelta(microseconds=1), max_value=timedelta(days=366))
clock_times = st.one_of(
    st.builds(time, st.integers(0, 23), st.sampled_from([0, 15, 59])),
    st.times(),  # seconds and microseconds too
)
zones = st.sampled_from(ZONES)


def _subset(low: int, high: int) -> Any:
    return st.one_of(
        st.just("*"), st.sets(st.integers(low, high), min_size=1, max_size=6).map(sorted)
    )


crontabs = st.builds(
    Crontab,
    _subset(0, 59),
    _subset(0, 23),
    _subset(0, 6),
    _subset(1, 28),
    _subset(1, 12),
    zones,
)
starts = st.one_of(
    st.builds(Daily, clock_times, zones),
    st.builds(
        Weekly,
        st.sets(st.sampled_from(["mon", "tue", "sat", "sun"]), min_size=1),
        clock_times,
        zones,
    ),
    st.builds(
        Cron,
        st.sampled_from(
            ["0 2 * * *", "*/15 8-18 * * mon-fri", "@daily", "30 1 1,15 * *", "5 4 * * 7"]
        ),
        zones,
    ),
    crontabs,
)
recurring = st.builds(lambda n, s, d: Blackout(n, start=s, duration=d), names, starts, durations)
fixed = st.builds(
    lambda n, a, d: Blackout.between(n, a, a + d),
    names,
    st.datetimes(
        min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    ),
    durations,
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(recurring, fixed))
def test_parse_window_is_the_exact_inverse_of_describe(window: Blackout) -> None:
    text = window.describe()
    assert "\n" not in text
    again = parse_window(text)
    assert again == window
    assert again.describe() == text


@settings(max_examples=200, deadline=None)
@given(durations)
def test_durations_are_written_exactly(span: timedelta) -> None:
    from celery_durable.core.limits import parse_duration

    assert parse_duration(span_text(span)) == span


@pytest.mark.parametrize(
    ("window", "text"),
    [
        (Blackout("b", start=Crontab(0, 2, zone="Europe/Oslo"), duration=timedelta(hours=1)),
         "b;crontab 0 2 * * *;1h;Europe/Oslo"),
        (Blackout("a", start=Daily("02:00:30", "Europe/Oslo"), duration=timedelta(hours=1)),
         "a;daily 02:00:30;1h;Europe/Oslo"),
        (Blackout("c", start=Weekly(["sat", "sun"], "08:00", "UTC"), duration=90.5),
         "c;weekly sat,sun@08:00;1m30.5s;UTC"),
        (Blackout.between(
            "d", datetime(2030, 1, 1, 0, 0, 0, 500000, tzinfo=UTC), datetime(2030, 1, 2, tzinfo=UTC)
        ), "d;2030-01-01T00:00:00.500000Z;2030-01-02T00:00:00Z"),
    ],
)  # fmt: skip
def test_the_forms_that_did_not_read_back(window: Blackout, text: str) -> None:
    """A Crontab start, a daily time with seconds, a fractional duration and a sub-second
    range each read back unchanged (they did not: the admin could not save such a schedule)."""
    assert window.describe() == text
    assert parse_window(text) == window


def test_a_name_with_a_semicolon_or_a_line_break_is_refused_when_the_window_is_made() -> None:
    for name in ("a;b", "a\u2028b"):
        with pytest.raises(InvalidSchedule) as refused:
            Blackout(name, start=Daily("02:00", "UTC"), duration=timedelta(hours=1))
        assert refused.value.field == "blackout.name"  # type: ignore[attr-defined]


def test_a_range_longer_than_366_days_is_called_a_range() -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    with pytest.raises(InvalidSchedule, match="a fixed range must end after it starts and span"):
        Blackout.between("long", start, start + timedelta(days=367))
    with pytest.raises(InvalidSchedule, match="duration must be more than 0 s and at most 366"):
        Blackout("long", start=Daily("02:00", "UTC"), duration=timedelta(days=367))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("x;crontab 0 2 * *;1h", "crontab takes five fields"),
        ("x;weekly sat 08:00;1h", "is not DAYS@HH:MM"),
        ("x;weekly sat-xyz@08:00;1h", "is not a range of days"),
        ("x;daily 02:00;soon", "duration"),
        ("x;2030-01-01;2030-01-02;UTC", "a fixed range is NAME;FROM;UNTIL"),
        ("x;yesterday;today", "is not an ISO 8601 instant"),
        ("x", "is not NAME;"),
    ],
)
def test_bad_texts_are_refused_naming_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(InvalidSchedule, match=words):
        parse_window(text)
