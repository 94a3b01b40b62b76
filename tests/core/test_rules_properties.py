"""Property tests for celery_durable.core.rules (R1-R8a, R7 in every zone).

The R7 oracle used below does not share code or reasoning with the implementation: it walks UTC
minute by minute and makes a matching local time due at the first instant whose local wall
clock reaches it. That single sentence is R7: an ordinary time is due when it is shown, a
repeated time when it is first shown, a skipped time when the clock jumps past it.

Example counts follow the Hypothesis profile (``HYPOTHESIS_PROFILE=long`` for 10,000).
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import pickle
import zoneinfo
from collections.abc import Callable
from datetime import date, datetime, time, timedelta, timezone, tzinfo
from functools import cache, lru_cache
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from celery_durable.core.rules import (
    SOLAR_EVENTS,
    Cron,
    Crontab,
    Daily,
    Every,
    Once,
    Rule,
    Solar,
    Weekly,
    rule_from_json,
)
from celery_durable.errors import InvalidSchedule

cronsim = pytest.importorskip("cronsim")

UTC = timezone.utc
MINUTE = timedelta(minutes=1)
TINY = timedelta(microseconds=1)


def _accepted(name: str) -> bool:
    try:
        Daily("00:00", name)
    except InvalidSchedule:
        return False
    return True


ZONE_NAMES = sorted(name for name in zoneinfo.available_timezones() if _accepted(name))
# Zones with DST or odd offsets, whose transitions since 1971 fall on whole minutes.
DST_ZONES = [
    "Europe/Oslo",
    "America/New_York",
    "Australia/Sydney",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "Asia/Kathmandu",
    "UTC",
    "America/Sao_Paulo",
    "America/St_Johns",
    "Pacific/Chatham",
    "Africa/Casablanca",
    "Europe/London",
    "Pacific/Apia",
]

_N = settings().max_examples  # the profile chosen in conftest.py
FAST = settings(max_examples=_N, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(
    max_examples=max(10, _N // 3), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

zones = st.sampled_from(ZONE_NAMES)
instants = st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
times = st.times()
day_sets = st.sets(st.integers(0, 6), min_size=1)


@cache
def tz(name: str) -> tzinfo:
    """The zone as the rules read it: from the tzdata package, not the host's zone files."""
    node = importlib.resources.files("tzdata").joinpath("zoneinfo")
    for part in name.split("/"):
        node = node.joinpath(part)
    with node.open("rb") as data:
        return zoneinfo.ZoneInfo.from_file(data, key=name)


def iterate(rule: Rule, after: datetime, count: int) -> list[datetime]:
    out = []
    for _ in range(count):
        due = rule.next_after(after)
        if due is None:
            break
        out.append(due)
        after = due
    return out


# --- Daily and Weekly in any zone -----------------------------------------------------------


def check_local_rule(
    rule: Daily | Weekly, days: set[int], after: datetime, got: list[datetime]
) -> None:
    zone = tz(rule.zone)
    at = rule.at
    # Strictly increasing, aware UTC.
    assert all(d.tzinfo is UTC for d in got)
    assert all(a < b for a, b in pairwise([after, *got]))
    found = set(got)
    # Every due time is the requested local time (its first occurrence) or a gap end.
    for due in got:
        local = due.astimezone(zone)
        if local.time() == at and local.weekday() in days:
            assert local.fold == 0, f"{due} is the second occurrence of {at}"
            continue
        before = (due - TINY).astimezone(zone)
        assert before.utcoffset() < local.utcoffset(), f"{due} is neither {at} nor a gap end"  # type: ignore[operator]
        low, high = before.replace(tzinfo=None), local.replace(tzinfo=None)
        span = (high.date() - low.date()).days
        walls = [datetime.combine(low.date() + timedelta(days=i), at) for i in range(span + 1)]
        assert any(low < w < high and w.weekday() in days for w in walls), f"{due}: no {at} skipped"
    # Never skips: every requested local time in the window has its due time.
    if not got:
        return
    last = got[-1]
    first_day = after.astimezone(zone).date() - timedelta(days=1)
    for i in range((last.astimezone(zone).date() - first_day).days + 2):
        day = first_day + timedelta(days=i)
        if day.weekday() not in days:
            continue
        wall = datetime.combine(day, at)
        first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
        second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
        exists = first.astimezone(zone).replace(tzinfo=None) == wall
        if exists:
            if after < first <= last:
                assert first in found, f"{wall} local ({first}) was skipped"
            if second != first:
                assert second not in found, f"{wall} local ran twice"
        else:
            low, high = sorted((first, second))  # the gap end lies in (low, high]
            if after < low and high <= last:
                assert any(low < d <= high for d in found), f"skipped {wall} never ran"


@FAST
@given(zones, times, instants)
def test_daily_in_any_zone(zone: str, at: time, after: datetime) -> None:
    rule = Daily(at, zone)
    got = iterate(rule, after, 6)
    check_local_rule(rule, set(range(7)), after, got)


@FAST
@given(zones, day_sets, times, instants)
def test_weekly_in_any_zone(zone: str, days: set[int], at: time, after: datetime) -> None:
    rule = Weekly(days, at, zone)
    got = iterate(rule, after, 4)
    check_local_rule(rule, days, after, got)


@FAST
@given(zones, times, instants, st.timezones())
def test_due_times_are_fixed_points_and_ignore_the_offset_of_after(
    zone: str, at: time, after: datetime, other: tzinfo
) -> None:
    rule = Daily(at, zone)
    due = rule.next_after(after)
    assume(due is not None)
    assert due is not None
    assert rule.next_after(due - TINY) == due
    try:
        shifted = after.astimezone(other)
    except OverflowError:
        return
    assert rule.next_after(shifted) == due


# --- R7 against the brute-force oracle, around real transitions -----------------------------


@lru_cache(maxsize=512)
def transitions(zone: str, year: int) -> tuple[datetime, ...]:
    """Instants (to the hour) where ``zone`` changes its UTC offset during ``year``."""
    place = tz(zone)
    hour, moment = timedelta(hours=1), datetime(year, 1, 1, tzinfo=UTC)
    found, offset = [], moment.astimezone(place).utcoffset()
    while moment.year == year:
        moment += hour
        now = moment.astimezone(place).utcoffset()
        if now != offset:
            found.append(moment)
            offset = now
    return tuple(found)


def oracle(
    matches: Callable[[datetime], bool], zone: str, start: datetime, end: datetime
) -> list[datetime]:
    place, due = tz(zone), []
    shown = start.astimezone(place).replace(tzinfo=None)  # the latest wall time seen so far
    moment = start + MINUTE
    while moment <= end:
        wall = moment.astimezone(place).replace(tzinfo=None)
        if wall > shown:
            candidate, fired = shown + MINUTE, False
            while candidate <= wall and not fired:
                fired = matches(candidate)
                candidate += MINUTE
            if fired:
                due.append(moment)
            shown = wall
        moment += MINUTE
    return due


def window(zone: str, year: int, pick: int, offset_minutes: int) -> tuple[datetime, datetime]:
    found = transitions(zone, year)
    centre = found[pick % len(found)] if found else datetime(year, 6, 1, tzinfo=UTC)
    start = centre - timedelta(hours=6) + timedelta(minutes=offset_minutes)
    return start, start + timedelta(hours=10)


def rule_dues(rule: Rule, start: datetime, end: datetime) -> list[datetime]:
    out: list[datetime] = []
    after = start
    while True:
        due = rule.next_after(after)
        if due is None or due > end:
            return out
        out.append(due)
        after = due


def _field(low: int, high: int) -> st.SearchStrategy[str]:
    single = st.integers(low, high).map(str)
    return st.one_of(
        st.just("*"),
        st.integers(1, (high - low) // 2 + 1).map(lambda n: f"*/{n}"),
        single,
        st.lists(single, min_size=1, max_size=4).map(",".join),
        st.tuples(st.integers(low, high), st.integers(low, high), st.integers(1, 9)).map(
            lambda t: f"{min(t[:2])}-{max(t[:2])}/{t[2]}"
        ),
    )


cron_exprs = st.tuples(
    _field(0, 59),
    _field(0, 23),
    st.one_of(st.just("*"), st.just("*"), _field(1, 28)),
    st.one_of(st.just("*"), st.just("*"), _field(1, 12)),
    st.one_of(
        st.just("*"), st.just("*"), _field(0, 7), st.sampled_from(["mon-fri", "sat,sun", "SUN"])
    ),
).map(" ".join)


_LOW = (0, 0, 1, 1, 0)
_HIGH = (59, 23, 31, 12, 7)
_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_WEEKDAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


def _number(text: str, index: int) -> int:
    if index == 3 and text in _MONTHS:
        return _MONTHS.index(text) + 1
    if index == 4 and text in _WEEKDAYS:
        return _WEEKDAYS.index(text)
    return int(text)


def _term_has(term: str, value: int, index: int) -> bool:
    """Whether one list item of a field admits ``value``: a predicate, not a set expansion."""
    span, slash, step_text = term.partition("/")
    step = int(step_text) if slash else 1
    if span == "*":
        first, last = _LOW[index], _HIGH[index]
    elif "-" in span:
        first_text, _, last_text = span.partition("-")
        first, last = _number(first_text, index), _number(last_text, index)
    else:
        first = _number(span, index)
        last = _HIGH[index] if slash else first
    return first <= value <= last and (value - first) % step == 0


def _field_has(text: str, value: int, index: int) -> bool:
    values = (0, 7) if index == 4 and value == 0 else (value,)  # Sunday is 0 or 7
    return any(_term_has(term, v, index) for term in text.split(",") for v in values)


def cron_matcher(expr: str) -> Callable[[datetime], bool]:
    """A second, deliberately plain reading of a five-field expression (Vixie day rule)."""
    fields = expr.lower().split()
    either = not (fields[2].startswith("*") or fields[4].startswith("*"))

    def matches(wall: datetime) -> bool:
        if not (_field_has(fields[0], wall.minute, 0) and _field_has(fields[1], wall.hour, 1)):
            return False
        if not _field_has(fields[3], wall.month, 3):
            return False
        by_dom = _field_has(fields[2], wall.day, 2)
        by_dow = _field_has(fields[4], (wall.weekday() + 1) % 7, 4)
        return (by_dom or by_dow) if either else (by_dom and by_dow)

    return matches


def cronsim_quirk(expr: str) -> bool:
    """cronsim 2.8 reads a one-value range with a step ("0-0/1") as "0/1", i.e. to the end."""
    for term in expr.replace(" ", ",").split(","):
        span, slash, _ = term.partition("/")
        first, dash, last = span.partition("-")
        if slash and dash and first == last:
            return True
    return False


@SLOW
@given(
    cron_exprs,
    st.sampled_from(DST_ZONES),
    st.integers(1971, 2099),
    st.integers(0, 3),
    st.integers(0, 59),
)
def test_cron_matches_the_r7_oracle(expr: str, zone: str, year: int, pick: int, shift: int) -> None:
    rule = Cron(expr, zone)
    start, end = window(zone, year, pick, shift)
    assert rule_dues(rule, start, end) == oracle(cron_matcher(expr), zone, start, end)


@SLOW
@given(
    st.sampled_from(DST_ZONES),
    day_sets,
    st.times().map(lambda t: t.replace(second=0, microsecond=0)),
    st.integers(1971, 2099),
    st.integers(0, 3),
    st.integers(0, 59),
)
def test_daily_and_weekly_match_the_r7_oracle(
    zone: str, days: set[int], at: time, year: int, pick: int, shift: int
) -> None:
    start, end = window(zone, year, pick, shift)
    daily = oracle(lambda w: w.time() == at, zone, start, end)
    assert rule_dues(Daily(at, zone), start, end) == daily
    weekly = oracle(lambda w: w.time() == at and w.weekday() in days, zone, start, end)
    assert rule_dues(Weekly(days, at, zone), start, end) == weekly


@FAST
@given(cron_exprs, instants)
def test_cron_in_utc_agrees_with_cronsim(expr: str, after: datetime) -> None:
    assume(not cronsim_quirk(expr))
    peer = cronsim.CronSim(expr, after)
    try:
        expected = [next(peer) for _ in range(5)]
    except StopIteration:  # cronsim gives up after 50 years without a match
        return
    assert iterate(Cron(expr), after, 5) == expected


@FAST
@given(cron_exprs, st.sampled_from(ZONE_NAMES), instants)
def test_cron_in_any_zone_is_increasing(expr: str, zone: str, after: datetime) -> None:
    rule = Cron(expr, zone)
    got = iterate(rule, after, 5)
    assert all(a < b for a, b in pairwise([after, *got]))
    assert all(d.tzinfo is UTC and rule.next_after(d - TINY) == d for d in got)


# --- Every ----------------------------------------------------------------------------------

intervals = st.timedeltas(min_value=timedelta(seconds=1), max_value=timedelta(days=366))


@FAST
@given(intervals, instants, instants, st.timezones())
def test_every_is_anchor_plus_k_intervals(
    interval: timedelta, anchor: datetime, after: datetime, other: tzinfo
) -> None:
    due = Every(interval).next_after(after.astimezone(other), anchor=anchor.astimezone(other))
    assert due is not None and due.tzinfo is UTC
    k, rest = divmod(due - anchor, interval)
    assert rest == timedelta(0) and k >= 1
    assert due > after
    assert k == 1 or due - interval <= after


# --- JSON and garbage -----------------------------------------------------------------------

rules: st.SearchStrategy[Rule] = st.one_of(
    st.builds(
        Daily, times, zones, end_at=st.none() | instants, max_runs=st.none() | st.integers(1)
    ),
    st.builds(Weekly, day_sets, times, zones, end_at=st.none() | instants),
    st.builds(Every, intervals, max_runs=st.none() | st.integers(1, 99)),
    st.builds(Cron, cron_exprs, zones, end_at=st.none() | instants),
    st.builds(Once, instants, end_at=st.none() | instants),
    st.builds(
        Crontab,
        st.integers(0, 59) | st.just("*/15"),
        st.sets(st.integers(0, 23), min_size=1) | st.just("22-2"),
        st.sampled_from(["*", "mon-fri", "Sunday", "fri-mon"]),
        st.sampled_from(["*", "1-7", "13", "*/2"]),
        st.sampled_from(["*", "nov-feb", "JANUARY"]),
        zones,
        end_at=st.none() | instants,
    ),
    st.builds(
        Solar,
        st.sampled_from(SOLAR_EVENTS),
        st.floats(-90, 90),
        st.floats(-180, 180),
        max_runs=st.none() | st.integers(1, 9),
    ),
)


@FAST
@given(rules)
def test_json_round_trip(rule: Rule) -> None:
    data = json.loads(json.dumps(rule.to_json(), allow_nan=False))
    again = rule_from_json(data)
    assert again == rule and hash(again) == hash(rule)
    assert again.to_json() == rule.to_json()
    assert pickle.loads(pickle.dumps(rule)) == rule


garbage = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=30),
    st.binary(max_size=10),
    st.lists(st.one_of(st.integers(-2, 9), st.text(max_size=10)), max_size=4),
    st.datetimes(timezones=st.none() | st.just(UTC) | st.timezones()),
    st.times(timezones=st.none() | st.just(UTC)),
    st.timedeltas(),
    st.dates(),
    st.sampled_from(["02:00", "Europe/Oslo", "mon", "0 2 * * *", "", "../x", "a\x00b", "@daily"]),
)
constructors: list[Callable[..., Rule]] = [
    lambda a, b, c, d: Daily(a, b, end_at=c, max_runs=d),
    lambda a, b, c, d: Weekly(a, b, c, max_runs=d),
    lambda a, b, c, d: Every(a, end_at=b, max_runs=c),
    lambda a, b, c, d: Cron(a, b, end_at=c, max_runs=d),
    lambda a, b, c, d: Once(a, end_at=b, max_runs=c),
    lambda a, b, c, d: Crontab(a, b, c, d, zone="UTC"),
    lambda a, b, c, d: Crontab("0", "*", "*", a, b, end_at=c, max_runs=d),
    lambda a, b, c, d: Solar(a, b, c, max_runs=d),
]


@FAST
@given(st.sampled_from(constructors), garbage, garbage, garbage, garbage)
def test_garbage_into_constructors_raises_only_invalid_schedule(
    make: Callable[..., Rule], a: object, b: object, c: object, d: object
) -> None:
    try:
        rule = make(a, b, c, d)
    except InvalidSchedule:
        return
    assert rule_from_json(rule.to_json()) == rule


def _containers(inner: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    _containers,
    max_leaves=8,
)


@FAST
@given(rules, st.data())
def test_damaged_json_raises_only_invalid_schedule(rule: Rule, data: st.DataObject) -> None:
    damaged = dict(rule.to_json())
    key = data.draw(st.sampled_from([*damaged, "extra"]))
    damaged[key] = data.draw(json_values | garbage)
    with contextlib.suppress(InvalidSchedule):
        rule_from_json(damaged)
    with contextlib.suppress(InvalidSchedule):
        rule_from_json(data.draw(json_values))


@FAST
@given(rules, garbage)
def test_next_after_with_garbage_raises_only_invalid_schedule(rule: Rule, after: object) -> None:
    try:
        due = rule.next_after(after, anchor=date(2026, 1, 1) if isinstance(after, date) else None)  # type: ignore[arg-type]
    except InvalidSchedule:
        return
    assert due is None or due.tzinfo is UTC
