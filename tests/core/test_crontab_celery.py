"""Crontab (SPEC B2) against Celery's own crontab as the oracle, and R7 across DST.

Celery is driven as stock beat drives it: with a fixed ``nowfun``, the next due time after a
last run is ``now + remaining_estimate(last_run_at)`` (celery-facts §3). Our rule's
``next_after`` chain must give the same 20 due times — zero differences — for thousands of
crontabs in every field form Celery takes. Near clock changes the two differ on purpose (R7 vs
stock beat's shift of a skipped time); there the R7 oracle of test_rules_properties decides.
"""

from __future__ import annotations

import ast
import pickle
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from celery_durable import Crontab as PublicCrontab
from celery_durable.core.crontab import zone_name
from celery_durable.core.rules import Cron, Crontab, rule_from_json
from celery_durable.errors import InvalidSchedule
from celery_durable.importers.celery_schedules import crontab_rule
from tests.core.test_rules import dues
from tests.core.test_rules_properties import oracle, tz, window

UTC = timezone.utc
COUNT = 20
ORACLE = settings(
    max_examples=max(2000, settings().max_examples),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

FIELDS = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")
LOW = {"minute": 0, "hour": 0, "day_of_week": 0, "day_of_month": 1, "month_of_year": 1}
HIGH = {"minute": 59, "hour": 23, "day_of_week": 6, "day_of_month": 31, "month_of_year": 12}
DAY_NAMES = ["sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday"]
MONTH_NAMES = [
    "january", "february", "march", "april", "may", "june",
    "july", "august", "september", "october", "november", "december",
]  # fmt: skip
CASES = [str.lower, str.upper, str.title, str.swapcase]


# --- every field form Celery accepts --------------------------------------------------------


def _name(field: str, value: int) -> st.SearchStrategy[str]:
    """A value written as a name (short or full, any case) where the field has names."""
    if field == "day_of_week":
        full = DAY_NAMES[value]
    elif field == "month_of_year":
        full = MONTH_NAMES[value - 1]
    else:
        return st.just(str(value))
    return st.tuples(st.sampled_from([full, full[:3]]), st.sampled_from(CASES)).map(
        lambda pair: pair[1](pair[0])
    )


def _value_text(field: str) -> st.SearchStrategy[str]:
    numbers = st.integers(LOW[field], HIGH[field])
    plain = numbers.map(str)
    padded = numbers.map(lambda n: f"{n:02d}")
    named = numbers.flatmap(lambda n: _name(field, n))
    return st.one_of(plain, padded, named)


def _item(field: str) -> st.SearchStrategy[str]:
    value = _value_text(field)
    step = st.integers(1, HIGH[field] - LOW[field] + 3).map(str)
    return st.one_of(
        st.just("*"),
        step.map(lambda s: f"*/{s}"),
        value,
        st.tuples(value, value).map("-".join),  # may wrap: "22-2", "fri-mon", "nov-feb"
        st.tuples(value, value, step).map(lambda t: f"{t[0]}-{t[1]}/{t[2]}"),
    )


def field_values(field: str) -> st.SearchStrategy[Any]:
    numbers = st.integers(LOW[field], HIGH[field])
    text = st.lists(_item(field), min_size=1, max_size=4).map(",".join)
    ranges = st.tuples(numbers, st.integers(1, 60), st.integers(1, 12)).map(
        lambda t: range(t[0], min(t[0] + t[1], HIGH[field] + 1), t[2])
    )
    return st.one_of(
        st.just("*"),
        numbers,
        text,
        text,
        st.lists(numbers, min_size=1, max_size=6),
        st.sets(numbers, min_size=1, max_size=6),
        st.lists(numbers, min_size=1, max_size=6).map(tuple),
        ranges,
    )


crontab_kwargs = st.fixed_dictionaries({name: field_values(name) for name in FIELDS})


def _random_text(rng: random.Random, field: str) -> str:
    def value() -> str:
        number = rng.randint(LOW[field], HIGH[field])
        form = rng.randrange(4)
        if form == 0 and field in ("day_of_week", "month_of_year"):
            full = DAY_NAMES[number] if field == "day_of_week" else MONTH_NAMES[number - 1]
            return rng.choice(CASES)(rng.choice([full, full[:3]]))
        return f"{number:02d}" if form == 1 else str(number)

    def item() -> str:
        step = rng.randint(1, HIGH[field] - LOW[field] + 3)
        return rng.choice(
            ["*", f"*/{step}", value(), f"{value()}-{value()}", f"{value()}-{value()}/{step}"]
        )

    return ",".join(item() for _ in range(rng.randint(1, 4)))


def random_crontab(rng: random.Random) -> dict[str, Any]:
    """Crontab arguments in every form Celery takes (the fast generator of the oracle tests)."""
    kwargs: dict[str, Any] = {}
    for name in FIELDS:
        low, high = LOW[name], HIGH[name]
        numbers = [rng.randint(low, high) for _ in range(rng.randint(1, 6))]
        form = rng.randrange(8)
        if form == 0:
            kwargs[name] = "*"
        elif form == 1:
            kwargs[name] = numbers[0]
        elif form in (2, 3):
            kwargs[name] = _random_text(rng, name)
        elif form == 4:
            kwargs[name] = numbers
        elif form == 5:
            kwargs[name] = set(numbers)
        elif form == 6:
            kwargs[name] = tuple(numbers)
        else:
            kwargs[name] = range(numbers[0], high + 1, rng.randint(1, 12))
    return kwargs


# Hypothesis draws the seed; the arguments come from it. Drawing every field through
# strategies costs ten times more than checking it, and the checks are what count here.
seeded_crontabs = st.randoms(use_true_random=False).map(random_crontab)


def _build_celery(kwargs: dict[str, Any]) -> crontab | None:
    try:
        return crontab(**kwargs)
    except Exception:  # Celery refuses: ValueError, ParseException, TypeError
        return None


def celery_dues(schedule: crontab, zone: str, start: datetime, count: int) -> list[datetime]:
    """Due times as stock beat computes them: ``now + remaining_estimate(last_run_at)``."""
    schedule.tz = tz(zone)  # a per-entry zone, as django-celery-beat's TzAwareCrontab sets it
    schedule.nowfun = lambda: start
    out, last = [], start
    for _ in range(count):
        due = (start + schedule.remaining_estimate(last)).astimezone(UTC)
        out.append(due)
        last = due
    return out


def near_transition(moment: datetime, zone: str) -> bool:
    place, span = tz(zone), timedelta(hours=3)
    return (moment - span).astimezone(place).utcoffset() != (moment + span).astimezone(
        place
    ).utcoffset()


starts = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2060, 1, 1), timezones=st.just(UTC)
)


def _compare(kwargs: dict[str, Any], zone: str, start: datetime) -> int:
    """Assert both agree on every due time away from clock changes; returns how many."""
    celery_schedule = crontab(**kwargs)
    rule = Crontab(**kwargs, zone=zone)
    ours = dues(rule, start, COUNT)
    theirs = celery_dues(celery_schedule, zone, start, COUNT)
    compared = COUNT
    for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if near_transition(a, zone) or near_transition(b, zone):
            compared = index
            break
    assert ours[:compared] == theirs[:compared], f"ours={ours}\ncelery={theirs}"
    return compared


@ORACLE
@given(seeded_crontabs, starts)
def test_next_20_due_times_equal_celerys_in_utc(kwargs: dict[str, Any], start: datetime) -> None:
    assume(_build_celery(kwargs) is not None)
    assert _compare(kwargs, "UTC", start) == COUNT


@ORACLE
@given(seeded_crontabs, st.sampled_from(["Europe/Oslo", "America/New_York"]), starts)
def test_next_20_due_times_equal_celerys_in_a_dst_zone(
    kwargs: dict[str, Any], zone: str, start: datetime
) -> None:
    assume(not near_transition(start, zone) and _build_celery(kwargs) is not None)
    _compare(kwargs, zone, start)


def test_dst_zone_comparison_is_not_vacuous() -> None:
    """Away from clock changes all 20 due times are compared, in both DST zones."""
    start = datetime(2026, 5, 4, 7, 13, tzinfo=UTC)
    for zone in ("Europe/Oslo", "America/New_York"):
        kwargs = {"minute": "*/7", "hour": "8-17", "day_of_week": "mon-fri"}
        assert _compare(kwargs, zone, start) == COUNT
        first = {"minute": 0, "hour": 9, "day_of_month": "1-7", "day_of_week": "mon"}
        assert _compare(first, zone, start) == COUNT


# --- the field parser against Celery's, including what both refuse --------------------------

raw_text = st.text(alphabet="0123456789*/-,_ abcdefjlmnorstuyFJMNOSTW!٣", max_size=12)


@settings(ORACLE, max_examples=max(500, settings().max_examples))
@given(st.sampled_from(FIELDS), st.one_of(raw_text, st.builds(",".join, st.lists(_item("hour")))))
def test_any_text_is_read_as_celery_reads_it(field: str, text: str) -> None:
    try:
        expected = getattr(crontab(**{field: text}), field)
    except Exception:  # Celery refuses it
        expected = None
    try:
        found = set(getattr(Crontab(**{field: text}), field))
    except InvalidSchedule:
        found = None
    assert found == expected


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"hour": "22-2"}, ("hour", (0, 1, 2, 22, 23))),
        ({"hour": "22-2/2"}, ("hour", (0, 2, 22))),
        ({"day_of_week": "fri-mon"}, ("day_of_week", (0, 1, 5, 6))),
        ({"day_of_week": "Monday"}, ("day_of_week", (1,))),
        ({"day_of_week": "SUNDAY,sat"}, ("day_of_week", (0, 6))),
        ({"month_of_year": "nov-feb"}, ("month_of_year", (1, 2, 11, 12))),
        ({"month_of_year": "January"}, ("month_of_year", (1,))),
        ({"hour": [2, 14]}, ("hour", (2, 14))),
        ({"hour": {14, 2}}, ("hour", (2, 14))),
        ({"hour": (2, 14)}, ("hour", (2, 14))),
        ({"minute": range(0, 60, 15)}, ("minute", (0, 15, 30, 45))),
        ({"minute": "*/15"}, ("minute", (0, 15, 30, 45))),
    ],
)
def test_field_forms_from_celerys_docs(kwargs: dict[str, Any], expected: tuple[str, Any]) -> None:
    field, values = expected
    assert getattr(Crontab(**kwargs), field) == values
    assert set(values) == getattr(crontab(**kwargs), field)


def test_first_monday_of_the_month_uses_celerys_and_rule() -> None:
    """B2: day of month 1-7 AND Monday — not cron's OR rule, which Cron keeps (R4)."""
    rule = Crontab(minute=0, hour=9, day_of_month="1-7", day_of_week="mon")
    start = datetime(2026, 11, 1, tzinfo=UTC)
    assert dues(rule, start, 4) == [
        datetime(2026, 11, 2, 9, tzinfo=UTC),
        datetime(2026, 12, 7, 9, tzinfo=UTC),
        datetime(2027, 1, 4, 9, tzinfo=UTC),
        datetime(2027, 2, 1, 9, tzinfo=UTC),
    ]
    cron = Cron("0 9 1-7 * mon")
    assert cron.next_after(datetime(2026, 11, 2, 10, tzinfo=UTC)) == datetime(
        2026, 11, 3, 9, tzinfo=UTC
    )
    assert rule != cron and rule.to_json()["type"] != cron.to_json()["type"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"day_of_month": 31, "month_of_year": "feb,apr"},
        {"day_of_month": 30, "month_of_year": 2},
        {"minute": []},
        {"hour": set()},
        {"day_of_week": ()},
        {"day_of_month": range(5, 5)},
        {"month_of_year": []},
    ],
)
def test_a_crontab_that_can_never_be_due_is_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidSchedule, match="never be due"):
        Crontab(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"minute": 60}, "minute"),
        ({"hour": "25"}, "hour"),
        ({"day_of_week": 7}, "day_of_week"),
        ({"day_of_week": "funday"}, "day_of_week"),
        ({"day_of_month": 0}, "day_of_month"),
        ({"minute": "*/0"}, "minute"),
        ({"minute": "5/15"}, "minute"),
        ({"minute": [1.5]}, "minute"),
        ({"minute": ["5"]}, "minute"),
        ({"minute": 1.5}, "minute"),
        ({"hour": "1,,2"}, "hour"),
        ({"hour": None}, "hour"),
    ],
)
def test_bad_fields_are_refused_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSchedule, match=f"Crontab.{field}"):
        Crontab(**kwargs)


def test_feb_29_on_a_monday_is_found_without_scanning_minutes() -> None:
    """Day-level skipping: 28 years ahead in a few milliseconds, and equal to Celery's answer."""
    kwargs = {"minute": 0, "hour": 0, "day_of_month": 29, "month_of_year": 2, "day_of_week": 1}
    start = datetime(2016, 3, 1, tzinfo=UTC)
    ours = dues(Crontab(**kwargs), start, 2)
    assert ours == [datetime(2044, 2, 29, tzinfo=UTC), datetime(2072, 2, 29, tzinfo=UTC)]
    assert ours == celery_dues(crontab(**kwargs), "UTC", start, 2)


# --- R7 across DST ---------------------------------------------------------------------------


def test_r7_a_skipped_local_time_is_due_at_the_end_of_the_gap() -> None:
    """Oslo 2027-03-28: 02:00 and 02:30 are both due once, at 03:00 CEST = 01:00 UTC."""
    rule = Crontab(minute="0,30", hour=2, zone="Europe/Oslo")
    assert dues(rule, datetime(2027, 3, 27, 1, 15, tzinfo=UTC), 3) == [
        datetime(2027, 3, 27, 1, 30, tzinfo=UTC),
        datetime(2027, 3, 28, 1, 0, tzinfo=UTC),
        datetime(2027, 3, 29, 0, 0, tzinfo=UTC),
    ]


def test_r7_a_repeated_local_time_is_due_once_at_its_first_occurrence() -> None:
    """Oslo 2026-10-25: 02:00 happens at 00:00 and 01:00 UTC; due only at 00:00 UTC."""
    rule = Crontab(minute=0, hour=2, zone="Europe/Oslo")
    assert dues(rule, datetime(2026, 10, 24, 12, tzinfo=UTC), 2) == [
        datetime(2026, 10, 25, 0, 0, tzinfo=UTC),
        datetime(2026, 10, 26, 1, 0, tzinfo=UTC),
    ]


def celery_matcher(schedule: crontab) -> Any:
    """Celery's own definition of a matching local minute (its field sets, AND day rule)."""

    def matches(wall: datetime) -> bool:
        return (
            wall.minute in schedule.minute
            and wall.hour in schedule.hour
            and wall.day in schedule.day_of_month
            and wall.month in schedule.month_of_year
            and wall.isoweekday() % 7 in schedule.day_of_week
        )

    return matches


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    crontab_kwargs,
    st.sampled_from(["Europe/Oslo", "America/New_York", "Australia/Lord_Howe"]),
    st.integers(2000, 2060),
    st.integers(0, 1),
    st.integers(0, 59),
)
def test_r7_across_clock_changes_matches_the_r7_oracle(
    kwargs: dict[str, Any], zone: str, year: int, pick: int, shift: int
) -> None:
    """Around real transitions, every due time is where R7 puts Celery's matching minutes."""
    schedule = _build_celery(kwargs)
    assume(schedule is not None)
    rule = Crontab(**kwargs, zone=zone)
    start, end = window(zone, year, pick, shift)
    got, after = [], start
    while (due := rule.next_after(after)) is not None and due <= end:
        got.append(due)
        after = due
    assert got == oracle(celery_matcher(schedule), zone, start, end)


# --- storage, API form, adapter --------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(crontab_kwargs, st.sampled_from(["UTC", "Europe/Oslo"]))
def test_json_and_pickle_round_trip(kwargs: dict[str, Any], zone: str) -> None:
    try:
        rule = Crontab(**kwargs, zone=zone)
    except InvalidSchedule:
        assume(False)
    data = rule.to_json()
    assert data["type"] == "crontab"
    assert rule_from_json(data) == rule
    assert pickle.loads(pickle.dumps(rule)) == rule
    assert all(data[name] == sorted(data[name]) for name in FIELDS)


def test_stored_form_is_the_normalised_field_sets() -> None:
    rule = Crontab(minute=0, hour="22-2", day_of_week="fri-mon", zone="Europe/Oslo")
    assert rule.to_json() == {
        "type": "crontab",
        "minute": [0],
        "hour": [0, 1, 2, 22, 23],
        "day_of_week": [0, 1, 5, 6],
        "day_of_month": list(range(1, 32)),
        "month_of_year": list(range(1, 13)),
        "zone": "Europe/Oslo",
        "end_at": None,
        "max_runs": None,
    }
    assert str(rule) == 'crontab "0 0-2,22-23 * * 0-1,5-6" Europe/Oslo'
    assert PublicCrontab is Crontab


@pytest.mark.parametrize(
    "damage",
    [
        {"minute": [True]},
        {"minute": "0"},
        {"hour": [24]},
        {"day_of_week": [1.0]},
        {"day_of_month": []},
    ],
)
def test_damaged_crontab_json_is_refused(damage: dict[str, Any]) -> None:
    data = Crontab(minute=0, hour=9).to_json() | damage
    with pytest.raises(InvalidSchedule):
        rule_from_json(data)


def test_from_celery_uses_celerys_sets_and_the_objects_own_zone() -> None:
    schedule = crontab(minute=0, hour=[2, 14], day_of_week="Monday-wed")
    rule = Crontab.from_celery(schedule, "Europe/Oslo")
    assert rule == Crontab(minute=0, hour=[2, 14], day_of_week="1-3", zone="Europe/Oslo")
    assert crontab_rule(schedule) == Crontab(minute=0, hour="2,14", day_of_week="1-3")
    schedule.tz = tz("America/New_York")
    assert Crontab.from_celery(schedule, "Europe/Oslo").zone == "America/New_York"


def test_from_celery_reads_a_tz_property_of_a_subclass() -> None:
    class TokyoCrontab(crontab):
        @property
        def tz(self) -> Any:
            return tz("Asia/Tokyo")

    assert Crontab.from_celery(TokyoCrontab(minute=5), "UTC").zone == "Asia/Tokyo"


def test_from_celery_falls_back_to_the_app_zone() -> None:
    app = Celery("zones", set_as_current=False)
    app.conf.timezone = "Europe/Oslo"
    schedule = crontab(minute=5, app=app)
    assert Crontab.from_celery(schedule, app.timezone).zone == "Europe/Oslo"


@pytest.mark.parametrize(
    ("zone", "name"),
    [
        (UTC, "UTC"),
        (timezone(timedelta(hours=2)), "Etc/GMT-2"),
        (timezone(timedelta(hours=-5)), "Etc/GMT+5"),
        ("Europe/Oslo", "Europe/Oslo"),
    ],
)
def test_zone_names(zone: Any, name: str) -> None:
    assert zone_name(zone) == name


def test_a_zone_without_a_name_is_refused() -> None:
    with pytest.raises(InvalidSchedule, match="no IANA name"):
        zone_name(timezone(timedelta(minutes=90)))


_PURE_FILES = ("crontab.py", "cron.py", "sun.py", "codec.py")


def test_rule_modules_import_neither_celery_nor_sqlalchemy() -> None:
    """Pure core: the rule modules' own imports (the adapter is separate)."""
    package = Path(__file__).parents[2] / "celery_durable" / "core"
    modules = [*sorted((package / "rules").glob("*.py")), *(package / m for m in _PURE_FILES)]
    assert len(modules) > len(_PURE_FILES) + 5  # the rules package's modules were found
    for module in modules:
        tree = ast.parse(module.read_text())
        names = [
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        ]
        names += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] in ("celery", "kombu", "sqlalchemy")]
