"""A year of Europe/Oslo local time through blackout windows, on the test clock (SPEC P4, R7).

The harness of ``celery_durable.testing`` moves the clock from due time to due time with the
dispatcher and a worker running all along: a year in no wall time. Two schedules due at 02:00
and 04:00 Oslo time keep out of a nightly 02:00 window of two wall-clock hours,
one skipping, one deferring; the expected runs come from an oracle written with ``zoneinfo``
alone (both clock changes of the year included).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery

from celery_durable import Blackout, Cron, Daily, ScheduledRun
from celery_durable.schedules import backfill_due_times
from celery_durable.testing import DurableHarness, TestClock
from tests.support.clock import T0

pytestmark = pytest.mark.timeout(300)

UTC = timezone.utc
OSLO = ZoneInfo("Europe/Oslo")
RULE = Cron("0 2,4 * * *", "Europe/Oslo")
WINDOW = Blackout("nightly", start=Daily("02:00", "Europe/Oslo"), duration=timedelta(hours=2))


def local(day: date, hour: int) -> datetime:
    """R7 by hand: a skipped local time is due when the gap ends (Oslo's gaps are one whole
    hour); of two occurrences, the first (fold 0)."""
    wall = datetime(day.year, day.month, day.day, hour, tzinfo=OSLO)
    instant = wall.astimezone(UTC)
    if instant.astimezone(OSLO).replace(tzinfo=None) != wall.replace(tzinfo=None):
        instant = (wall + timedelta(hours=1)).astimezone(UTC)  # in the gap
    return instant


def expected(first: datetime, last: datetime) -> tuple[list[tuple], list[tuple]]:
    """(due, sent) of every run in ``(first, last]``: skipping, then deferring."""
    skipping: list[tuple] = []
    deferring: list[tuple] = []
    day = first.astimezone(OSLO).date()
    while day <= last.astimezone(OSLO).date():
        opens = local(day, 2)
        wall_end = opens.astimezone(OSLO).replace(tzinfo=None) + timedelta(hours=2)
        closes = wall_end.replace(tzinfo=OSLO).astimezone(UTC)
        dues = sorted({local(day, hour) for hour in (2, 4)})
        dues = [d for d in dues if first < d <= last]
        inside = [d for d in dues if opens <= d < closes]
        for due in dues:
            if due not in inside:
                skipping.append((due, due))
                deferring.append((due, due))
        if inside and closes <= last:
            deferring.append((inside[0], closes))
        day += timedelta(days=1)
    return sorted(skipping), sorted(deferring)


@pytest.fixture
def durable(celery_app: Celery, sqlite_url: str) -> Iterator[Any]:
    with DurableHarness(celery_app, sqlite_url, clock=TestClock(T0)) as harness:
        harness.start()
        yield harness


def test_a_year_of_oslo_nights_keeps_out_of_the_window_across_both_clock_changes(
    durable: DurableHarness,
) -> None:
    seen: dict[str, list[tuple[datetime, datetime]]] = {"skip": [], "defer": []}

    @durable.task(name="t.night")
    def night(run: ScheduledRun) -> None:
        seen[run.input].append((run.due, durable.now()))

    for mode in ("skip", "defer"):
        durable.schedules.create(mode, night, mode, RULE, blackouts=[WINDOW], on_blackout=mode)
    view = durable.schedules.state("defer")
    assert view is not None and view.next_due == local(date(2026, 11, 3), 2)
    assert view.next_run == local(date(2026, 11, 3), 4)  # deferred to the window's end
    end = T0 + timedelta(days=365)
    durable.advance(until=end)

    skipping, deferring = expected(T0, end)
    assert sorted(seen["skip"]) == skipping
    assert sorted(seen["defer"]) == deferring

    def night_of(day: date) -> list[tuple[datetime, datetime]]:
        return [(d, s) for d, s in seen["defer"] if d.astimezone(OSLO).date() == day]

    # 02:00 is skipped by the clock: due at 03:00 CEST (R7), where the window opens too; it
    # closes two wall-clock hours later, 05:00 CEST, so 04:00 CEST is inside: one run, at 05:00.
    assert night_of(date(2027, 3, 28)) == [
        (datetime(2027, 3, 28, 1, tzinfo=UTC), datetime(2027, 3, 28, 3, tzinfo=UTC))
    ]
    # From the first 02:00 (CEST) to 04:00 CET: three real hours; 04:00 CET runs as usual.
    assert night_of(date(2027, 10, 31)) == [
        (datetime(2027, 10, 31, 0, tzinfo=UTC), datetime(2027, 10, 31, 3, tzinfo=UTC)),
        (datetime(2027, 10, 31, 3, tzinfo=UTC), datetime(2027, 10, 31, 3, tzinfo=UTC)),
    ]
    # Each night's 02:00 (and the spring night's 04:00) is recorded as skipped; retention (O1,
    # 30 days) has removed the records of the older ones by now.
    every_due = set(backfill_due_times(RULE, T0, end, None, 10_000))
    assert len(every_due) == 2 * 365
    should_skip = every_due - {due for due, _ in skipping}
    assert len(should_skip) == 365 + 1
    skipped = [r for r in durable.schedules.runs("skip") if r.state == "skipped"]
    recent = {d for d in should_skip if d > end - timedelta(days=29)}
    assert recent <= {r.due for r in skipped} <= should_skip
    assert {r.error for r in skipped} == {"blackout nightly"}
    # Deferring, each recent night's 02:00 ran at the window's end and none was skipped (the
    # only night with two due times inside, 2027-03-28, is older than the retention).
    recent_defer = [r for r in durable.schedules.runs("defer") if r.due > end - timedelta(days=29)]
    assert recent_defer and not [r for r in recent_defer if r.state == "skipped"]
    assert {r.due for r in recent_defer} == {
        d for d, _ in deferring if d > end - timedelta(days=29)
    }
