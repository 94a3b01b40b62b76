"""Blackout windows in the pure core (SPEC P4): the values, their checks, skip and defer.

The aggregate is driven with explicit moments (no clock); events go through their JSON form
as they would through the journal. The property tests compare the decisions of one schedule
with and without windows over the same ticks.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_durable import Blackout, CatchUp, Cron, Daily, Every, InvalidSchedule, Once, Weekly
from celery_durable.core.blackouts import OnBlackout, blocking, check_windows
from celery_durable.core.schedule_aggregate import (
    Create,
    DecideDue,
    ScheduleState,
    decide,
    digest,
    fold_all,
)
from celery_durable.core.schedule_events import (
    Content,
    RunDecided,
    RunSkipped,
    ScheduleCreated,
    from_data,
    to_data,
)

UTC = timezone.utc
OSLO = ZoneInfo("Europe/Oslo")
T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)


def oslo(*fields: int) -> datetime:
    return datetime(*fields, tzinfo=OSLO).astimezone(UTC)  # type: ignore[misc]


class Schedule:
    """Decide, round-trip the events through JSON (they are stored so), fold."""

    def __init__(self, c: Content, at: datetime = T0) -> None:
        self.state = ScheduleState(schedule_id="s")
        self.events: list = []
        self.do(Create(content=c, now=at))

    def do(self, command: object) -> list:
        events = [from_data(e.TYPE, to_data(e)) for e in decide(self.state, command)]  # type: ignore[arg-type]
        self.state = fold_all(self.state, events)
        self.events += events
        return events

    def tick(self, now: datetime, windows: tuple[Blackout, ...] = ()) -> list:
        return self.do(DecideDue(now=now, blackouts=windows))


def content(rule: object = None, **blackout: object) -> Content:
    return Content(
        task="backup",
        input="/srv",
        rule=rule or Every(timedelta(minutes=10)),  # type: ignore[arg-type]
        catch_up=CatchUp.ALL,
        blackouts=check_windows(blackout.pop("blackouts", ())),
        on_blackout=OnBlackout.parse(blackout.pop("on_blackout", "skip")),
    )


FREEZE = Blackout.between("freeze", T0 + 25 * M, T0 + 55 * M)  # covers 12:30, 12:40, 12:50


# Checks -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: Blackout("", start="0 2 * * *", duration=H), "must not be blank"),
        (lambda: Blackout(" x", start="0 2 * * *", duration=H), "whitespace"),
        (lambda: Blackout("x\n", start="0 2 * * *", duration=H), "control character"),
        (lambda: Blackout("x", start="0 2 * * *", duration=timedelta(0)), "more than 0 s"),
        (lambda: Blackout("x", start="0 2 * * *", duration=-5), "more than 0 s"),
        (lambda: Blackout("x", start="0 2 * * *", duration="1h"), "timedelta or seconds"),
        (lambda: Blackout("x", start="0 2 * * *", duration=H, zone="Mars/Olympus"), "unknown"),
        (lambda: Blackout("x", start=Daily("02:00", "UTC"), duration=H, zone="Europe/Oslo"),
         "differs from the start rule's zone"),
        (lambda: Blackout("x", start=Every(H), duration=H), "start must be a Daily"),
        (lambda: Blackout("x", start=Daily("02:00", "UTC", max_runs=2), duration=H), "max_runs"),
        (lambda: Blackout.between("x", T0, T0 - M), "is not after start"),
        (lambda: Blackout.between("x", T0, T0), "is not after start"),
        (lambda: Blackout.between("x", T0.replace(tzinfo=None), T0 + M), "aware"),
        (lambda: OnBlackout.parse("later"), "on_blackout must be 'skip' or 'defer'"),
        (lambda: check_windows([FREEZE, FREEZE]), "given twice"),
        (lambda: check_windows(FREEZE), "must be a list"),
        (lambda: check_windows(["freeze"]), "must hold Blackout windows"),
    ],
)  # fmt: skip
def test_bad_windows_are_refused_with_a_message_naming_what_is_wrong(
    make: object, words: str
) -> None:
    with pytest.raises(InvalidSchedule, match=words):
        make()  # type: ignore[operator]


def test_windows_compare_by_content_and_survive_their_stored_form() -> None:
    windows = [
        Blackout("a", start="0 2 * * *", duration=2 * H, zone="Europe/Oslo"),
        Blackout("b", start=Weekly(["sat", "sun"], "08:00", "UTC"), duration=H),
        Blackout("c", start=Daily("23:30", "Europe/Oslo"), duration=90 * M),
        FREEZE,
    ]
    for window in windows:
        assert Blackout.from_json(window.to_json()) == window
    assert windows[0] == Blackout("a", start=Cron("0 2 * * *", "Europe/Oslo"), duration=7200)
    assert [w.describe() for w in windows] == [
        "a;cron 0 2 * * *;2h;Europe/Oslo",
        "b;weekly sat,sun@08:00;1h;UTC",
        "c;daily 23:30;1h30m;Europe/Oslo",
        "freeze;2026-11-02T12:25:00Z;2026-11-02T12:55:00Z",
    ]


# Where a window is ----------------------------------------------------------------------------


def test_a_window_covers_its_start_and_not_its_end() -> None:
    nightly = Blackout("nightly", start=Daily("02:00", "Europe/Oslo"), duration=2 * H)
    start, end = oslo(2026, 11, 3, 2), oslo(2026, 11, 3, 4)
    assert nightly.covering(start - timedelta(microseconds=1)) is None
    assert nightly.covering(start) == end
    assert nightly.covering(end - timedelta(microseconds=1)) == end
    assert nightly.covering(end) is None


def test_dst_applies_to_the_start_and_the_length_is_wall_clock() -> None:
    """R7 on the start; the end is the local start plus the duration on the wall clock."""
    nightly = Blackout("nightly", start=Daily("02:00", "Europe/Oslo"), duration=2 * H)
    # 2027-03-28: 02:00 is skipped, so the window opens at 03:00 CEST (01:00 UTC), ends 05:00.
    assert nightly.covering(datetime(2027, 3, 28, 0, 59, tzinfo=UTC)) is None
    assert nightly.covering(datetime(2027, 3, 28, 1, tzinfo=UTC)) == datetime(
        2027, 3, 28, 3, tzinfo=UTC
    )
    early = Blackout("early", start=Daily("01:00", "Europe/Oslo"), duration=2 * H)
    # 01:00 CET to 03:00 CEST: two hours on the wall clock, one in real time.
    assert early.covering(datetime(2027, 3, 28, 0, tzinfo=UTC)) == datetime(
        2027, 3, 28, 1, tzinfo=UTC
    )
    # 2026-10-25: 02:00 CEST (00:00 UTC, the first occurrence) to 04:00 CET: three real hours.
    assert nightly.covering(datetime(2026, 10, 25, 2, 59, tzinfo=UTC)) == datetime(
        2026, 10, 25, 3, tzinfo=UTC
    )


def test_overlapping_windows_make_one_blackout_that_ends_where_none_covers() -> None:
    first = Blackout.between("first", T0, T0 + H)
    second = Blackout.between("second", T0 + 30 * M, T0 + 2 * H)
    third = Blackout.between("third", T0 + 2 * H, T0 + 3 * H)  # adjoining: still covered
    blocked = blocking(T0 + 10 * M, [first, second, third])
    assert blocked is not None
    assert (blocked.window.name, blocked.ends, blocked.reason) == (
        "first",
        T0 + 3 * H,
        "blackout first",
    )
    assert blocking(T0 + 3 * H, [first, second, third]) is None
    endless = Blackout("endless", start="0 * * * *", duration=2 * H)
    never = blocking(T0, [endless])
    assert never is not None and never.ends is None  # defer falls back to skip


# The aggregate ------------------------------------------------------------------------------


def test_skip_records_the_due_times_inside_as_skipped_with_the_windows_name() -> None:
    s = Schedule(content(blackouts=[FREEZE]))
    events = s.tick(T0 + 70 * M)
    assert [(type(e).__name__, e.due - T0) for e in events] == [
        ("RunDecided", 10 * M),
        ("RunDecided", 20 * M),
        ("RunSkipped", 30 * M),
        ("RunSkipped", 40 * M),
        ("RunSkipped", 50 * M),
        ("RunDecided", 60 * M),
        ("RunDecided", 70 * M),
    ]
    assert {e.reason for e in events if isinstance(e, RunSkipped)} == {"blackout freeze"}
    assert all(
        e.send_at is None and e.blackout is None for e in events if isinstance(e, RunDecided)
    )


def test_defer_runs_once_when_the_window_ends() -> None:
    s = Schedule(content(blackouts=[FREEZE], on_blackout="defer"))
    assert s.state.next_run() == T0 + 10 * M
    for minute in (10, 20, 30, 40, 50, 60):  # on time, as the dispatcher would see them
        s.tick(T0 + minute * M)
    decided = [e for e in s.events if isinstance(e, RunDecided)]
    assert [(e.due - T0, e.send_at, e.blackout) for e in decided] == [
        (10 * M, None, None),
        (20 * M, None, None),
        (30 * M, T0 + 55 * M, "freeze"),  # the first due time inside: sent at the end
        (60 * M, None, None),
    ]
    skipped = [(e.due - T0, e.reason) for e in s.events if isinstance(e, RunSkipped)]
    assert skipped == [(40 * M, "blackout freeze"), (50 * M, "blackout freeze")]


def test_global_windows_come_with_the_command_and_the_schedules_own_are_named_first() -> None:
    own = Blackout.between("own", T0 + 25 * M, T0 + 35 * M)
    s = Schedule(content(blackouts=[own]))
    events = s.tick(T0 + 40 * M, (FREEZE,))
    reasons = {e.due - T0: e.reason for e in events if isinstance(e, RunSkipped)}
    assert reasons == {30 * M: "blackout own", 40 * M: "blackout freeze"}


def test_a_once_inside_a_window_is_skipped_or_deferred() -> None:
    at = T0 + 30 * M
    skipped = Schedule(content(Once(at), blackouts=[FREEZE]))
    assert skipped.state.next_run() is None
    assert [type(e).__name__ for e in skipped.tick(at)] == ["RunSkipped"]
    assert skipped.state.next_due() is None
    deferred = Schedule(content(Once(at), blackouts=[FREEZE], on_blackout="defer"))
    assert deferred.state.next_run() == T0 + 55 * M
    [run] = deferred.tick(at)
    assert isinstance(run, RunDecided) and run.send_at == T0 + 55 * M


def test_next_run_passes_over_skipped_due_times() -> None:
    s = Schedule(content(blackouts=[FREEZE]), at=T0 + 20 * M)
    assert s.state.next_due() == T0 + 30 * M
    assert s.state.next_run() == T0 + 60 * M
    assert s.state.next_run((Blackout.between("more", T0 + 55 * M, T0 + 65 * M),)) == T0 + 70 * M


def test_content_without_windows_keeps_its_stored_form_and_digest() -> None:
    """§9: the fields are optional; content stored before them reads as no windows."""
    plain = content()
    assert "blackouts" not in plain.to_json() and "on_blackout" not in plain.to_json()
    old = {k: v for k, v in plain.to_json().items()}
    assert Content.from_json(old) == plain and digest(Content.from_json(old)) == digest(plain)
    guarded = content(blackouts=[FREEZE], on_blackout="defer")
    again = Content.from_json(guarded.to_json())
    assert (again.blackouts, again.on_blackout) == ((FREEZE,), OnBlackout.DEFER)
    assert digest(again) != digest(plain)
    event = ScheduleCreated(at=T0, content=guarded)
    assert from_data(event.TYPE, to_data(event)) == event


# Properties ---------------------------------------------------------------------------------

_starts = st.integers(min_value=0, max_value=14 * 24 * 60)
_windows = st.lists(
    st.one_of(
        st.builds(
            lambda a, b: Blackout.between("fixed", T0 + a * M, T0 + (a + b) * M),
            _starts,
            st.integers(min_value=1, max_value=3 * 24 * 60),
        ),
        st.builds(
            lambda h, m, d: Blackout(
                "nightly", start=Daily(f"{h:02d}:{m:02d}", "Europe/Oslo"), duration=d * M
            ),
            st.integers(0, 23),
            st.sampled_from([0, 15, 30]),
            st.integers(min_value=1, max_value=30 * 60),
        ),
        st.builds(
            lambda expr, d: Blackout("cron", start=expr, duration=d * M, zone="Europe/Oslo"),
            st.sampled_from(["0 9 * * mon-fri", "*/20 * * * *", "30 1 * * 0"]),
            st.integers(min_value=1, max_value=8 * 60),
        ),
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda w: w.name,
)
_rules = st.one_of(
    st.builds(lambda m: Every(m * M), st.integers(min_value=7, max_value=300)),
    st.sampled_from([Cron("15 * * * *", "Europe/Oslo"), Daily("02:30", "Europe/Oslo")]),
)
_ticks = st.lists(st.integers(min_value=1, max_value=36 * 60), min_size=1, max_size=12)


def _run(rule: object, policy: CatchUp, ticks: list[int], **blackout: object) -> Schedule:
    c = content(rule, **blackout)
    s = Schedule(Content(**{**c.__dict__, "catch_up": policy}))
    now = T0
    for step in ticks:
        now += step * M
        s.tick(now)
    return s


def _inside(moment: datetime, windows: list[Blackout]) -> bool:
    return any(w.covering(moment) is not None for w in windows)


@settings(max_examples=60, deadline=None)
@given(_rules, st.sampled_from(list(CatchUp)), _ticks, _windows)
def test_no_due_time_inside_a_window_starts_and_the_others_are_unchanged(
    rule: object, policy: CatchUp, ticks: list[int], windows: list[Blackout]
) -> None:
    """P4 with ``skip``: each due time the schedule settles without windows is settled the
    same way with them, except that one inside a window is skipped instead of decided."""
    without = _run(rule, policy, ticks)
    with_ = _run(rule, policy, ticks, blackouts=windows)
    plain = [e for e in without.events if not isinstance(e, ScheduleCreated)]
    guarded = [e for e in with_.events if not isinstance(e, ScheduleCreated)]
    assert len(plain) == len(guarded)
    for a, b in zip(plain, guarded, strict=True):
        if isinstance(a, RunDecided) and _inside(a.due, windows):
            assert isinstance(b, RunSkipped) and b.due == a.due
            assert b.reason.startswith("blackout ")
        else:
            assert a == b  # outside every window: exactly as without windows
    assert with_.state.cursor == without.state.cursor


@settings(max_examples=60, deadline=None)
@given(_rules, st.sampled_from(list(CatchUp)), _ticks, _windows)
def test_deferred_runs_are_sent_outside_every_window_once_per_blackout(
    rule: object, policy: CatchUp, ticks: list[int], windows: list[Blackout]
) -> None:
    without = _run(rule, policy, ticks)
    deferred = _run(rule, policy, ticks, blackouts=windows, on_blackout="defer")
    plain = {e.due: e for e in without.events if isinstance(e, RunDecided)}
    runs = [e for e in deferred.events if isinstance(e, RunDecided)]
    for run in runs:
        assert run.due in plain
        assert not _inside(run.send_at or run.due, windows), "no run starts inside a window"
        if not _inside(run.due, windows):
            assert run == plain[run.due]  # outside every window: exactly as without windows
    ends = [r.send_at for r in runs if r.blackout is not None]
    assert len(ends) == len(set(ends)), "one run per blackout"
    settled = {e.due for e in deferred.events if isinstance(e, RunDecided | RunSkipped)}
    assert settled == set(plain)
