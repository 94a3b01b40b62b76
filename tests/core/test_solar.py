"""Solar (SPEC B3) against Celery's own ``solar`` as the oracle, near the poles, and stored.

Celery is driven as stock beat drives it: a fixed ``nowfun`` and ``now + remaining_estimate``.
ephem's answer for one event moves by up to ~0.1 s with the instant its search starts from;
our rule solves every event again from a canonical start (so one sunrise has one run ID, S2),
hence "equal" below means the same event, within one second.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from celery.schedules import solar
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from celery_durable import InvalidSchedule, Solar
from celery_durable.core.rules import SOLAR_EVENTS, rule_from_json

UTC = timezone.utc
SECOND = timedelta(seconds=1)
CASES = settings(
    max_examples=max(300, settings().max_examples),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def celery_next(event: str, lat: float, lon: float, after: datetime) -> datetime:
    schedule = solar(event, lat, lon)
    schedule.nowfun = lambda: after
    return after + schedule.remaining_estimate(after)


events = st.sampled_from(SOLAR_EVENTS)
latitudes = st.floats(-65, 65)
daily_latitudes = st.floats(-48, 48)  # every event, astronomical twilight too, every day
GRAZING = timedelta(minutes=1)  # see test_polar_latitudes_agree_with_celery
longitudes = st.floats(-180, 180)
instants = st.datetimes(
    min_value=datetime(1990, 1, 1), max_value=datetime(2080, 1, 1), timezones=st.just(UTC)
)


@CASES
@given(events, latitudes, longitudes, instants)
def test_next_event_is_celerys(event: str, lat: float, lon: float, after: datetime) -> None:
    ours = Solar(event, lat, lon).next_after(after)
    assert ours is not None and ours > after
    assert abs(ours - celery_next(event, lat, lon, after)) < SECOND


@settings(CASES, max_examples=max(100, settings().max_examples))
@given(events, daily_latitudes, longitudes, instants)
def test_one_event_has_one_due_time_whatever_the_search_starts_from(
    event: str, lat: float, lon: float, after: datetime
) -> None:
    """S2 needs it: the same sunrise found from anywhere before it is the same instant."""
    rule = Solar(event, lat, lon)
    due = rule.next_after(after)
    assert due is not None
    for back in (timedelta(microseconds=1), timedelta(minutes=7), timedelta(hours=5)):
        start = max(after, due - back)
        assert rule.next_after(start) == due
    following = rule.next_after(due)
    assert following is not None and timedelta(hours=20) < following - due < timedelta(hours=28)


@pytest.mark.parametrize("event", SOLAR_EVENTS)
def test_a_twenty_day_chain_matches_celery(event: str) -> None:
    rule, lat, lon = Solar(event, 59.91, 10.75), 59.91, 10.75
    after = datetime(2026, 3, 20, 13, 17, tzinfo=UTC)
    for _ in range(20):
        due = rule.next_after(after)
        assert due is not None
        # Stock beat's last_run_at is a little after the due time.
        assert abs(due - celery_next(event, lat, lon, after)) < SECOND
        after = due + timedelta(seconds=2)


# --- near the poles: days without the event are skipped, never an endless search --------------


@pytest.mark.parametrize(
    ("event", "after", "expected_day"),
    [
        # Longyearbyen (78.2 N): polar night from late October; the sun is back mid-February.
        ("sunrise", datetime(2026, 11, 15, tzinfo=UTC), datetime(2027, 2, 15, tzinfo=UTC)),
        ("sunset", datetime(2026, 11, 15, tzinfo=UTC), datetime(2027, 2, 15, tzinfo=UTC)),
        # Midnight sun from April: the next sunset is in late August.
        ("sunset", datetime(2026, 5, 1, tzinfo=UTC), datetime(2026, 8, 24, tzinfo=UTC)),
        # No astronomical dusk in summer either.
        ("dusk_astronomical", datetime(2026, 4, 1, tzinfo=UTC), None),
    ],
)
def test_days_without_the_event_are_skipped_near_the_pole(
    event: str, after: datetime, expected_day: datetime | None
) -> None:
    due = Solar(event, 78.22, 15.65).next_after(after)
    assert due is not None
    assert abs(due - celery_next(event, 78.22, 15.65, after)) < GRAZING
    assert due - after > timedelta(days=2)  # whole days without the event were skipped
    if expected_day is not None:
        assert abs(due - expected_day) < timedelta(days=2)


@settings(CASES, max_examples=max(60, settings().max_examples))
@given(events, st.floats(49, 80) | st.floats(-80, -49), longitudes, instants)
@example("sunset", -69.4910534139662, -114.6875, datetime(2043, 1, 1, tzinfo=UTC))
@example("dawn_civil", -64.0, 0.0, datetime(2000, 11, 20, 1, tzinfo=UTC))
@example("dawn_astronomical", 60.0, 60.0, datetime(2019, 5, 1, tzinfo=UTC))
def test_polar_latitudes_agree_with_celery(
    event: str, lat: float, lon: float, after: datetime
) -> None:
    """The same event as Celery's. Near the edges of polar day and night the sun skims the
    horizon and ephem's own answer moves by seconds with the search start (-69.49, -114.69,
    sunset 2043-01-22: 07:49:41.5 from Jan 1, 07:49:45.7 from 07:00 that day), so a minute."""
    rule = Solar(event, lat, lon)
    ours = rule.next_after(after)
    assert ours is not None and ours > after
    theirs = celery_next(event, lat, lon, after)
    if abs(ours - theirs) >= GRAZING:
        # Only on the first or last day an event happens at all, where ephem reports it from
        # some starts and not from others — Celery itself does not see it from 3 h before.
        assert theirs < ours
        assert celery_next(event, lat, lon, theirs - timedelta(hours=3)) - theirs > GRAZING
    # Still one due time per event, wherever the search starts.
    assert rule.next_after(max(after, ours - timedelta(hours=3))) == ours
    assert rule.next_after(ours - timedelta(microseconds=1)) == ours


@pytest.mark.parametrize("event", [e for e in SOLAR_EVENTS if e != "solar_noon"])
def test_at_the_pole_a_search_that_finds_nothing_ends(event: str) -> None:
    """ephem finds no rising or setting at 90 N: the answer is None, in bounded time."""
    started = time.perf_counter()
    assert Solar(event, 90, 0).next_after(datetime(2026, 1, 1, tzinfo=UTC)) is None
    assert time.perf_counter() - started < 10


def test_solar_noon_happens_every_day_even_at_the_pole() -> None:
    rule, after = Solar("solar_noon", -90, 0), datetime(2026, 6, 1, tzinfo=UTC)
    due = rule.next_after(after)
    assert due is not None and due - after < timedelta(days=1)


# --- the value: validation, JSON, API ---------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("moonrise", 0, 0), "Solar.event"),
        ((None, 0, 0), "Solar.event"),
        (("sunrise", 91, 0), "Solar.latitude"),
        (("sunrise", float("nan"), 0), "Solar.latitude"),
        (("sunrise", True, 0), "Solar.latitude"),
        (("sunrise", "59.9", 0), "Solar.latitude"),
        (("sunrise", 0, -180.5), "Solar.longitude"),
    ],
)
def test_bad_values_are_refused_naming_the_field(args: tuple[object, ...], field: str) -> None:
    with pytest.raises(InvalidSchedule, match=field):
        Solar(*args)  # type: ignore[arg-type]


def test_json_round_trip_and_form() -> None:
    rule = Solar("dusk_civil", 59.91, 10.75, max_runs=3)
    assert rule.to_json() == {
        "type": "solar",
        "event": "dusk_civil",
        "latitude": 59.91,
        "longitude": 10.75,
        "end_at": None,
        "max_runs": 3,
    }
    assert rule_from_json(rule.to_json()) == rule
    assert Solar("sunrise", 60, 10) == Solar("sunrise", 60.0, 10.0)
    assert str(rule) == "solar dusk_civil at 59.91, 10.75, at most 3 runs"


def test_from_celery() -> None:
    assert Solar.from_celery(solar("sunset", -33.87, 151.21)) == Solar("sunset", -33.87, 151.21)
