"""Blackout windows in the pure core (SPEC P4): the values, their checks, skip and defer.

The aggregate is driven with explicit moments (no clock); events go through their JSON form
as they would through the journal. The property tests compare the decisions of one schedule
with and without windows over the same ticks.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from celery_durable import (
    Blackout,
    CatchUp,
    Cron,
    Daily,
    Every,
    InvalidSchedule,
    Once,
    Overlap,
    Weekly,
)
from celery_durable.core.blackouts import OnBlackout, blocking, check_windows
from celery_durable.core.policies import Timing, jitter_offset
from celery_durable.core.schedule_aggregate import (
    Create,
    DecideDue,
    DecideRun,
    ScheduleState,
    decide,
    digest,
    fold_all,
)
from celery_durable.core.schedule_events import (
    Content,
    RunDecided,
    RunDeferred,
    RunSkipped,
    ScheduleCreated,
    from_data,
    to_data,
)
from tests.support.blackout_sim import Sim, inside

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
        (lambda: Blackout("x", start="0 2 * * *", duration=float("nan")), "more than 0 s"),
        (lambda: Blackout("x", start="0 2 * * *", duration=float("inf")), "at most 366 days"),
        (lambda: Blackout("x", start="0 2 * * *", duration=1e300), "at most 366 days"),
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
    sim = Sim(content(blackouts=[own]), T0).run([T0 + m * M for m in (10, 20, 30, 40)], (FREEZE,))
    reasons = {e.due - T0: e.reason for e in sim.events if isinstance(e, RunSkipped)}
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


def test_next_run_passes_over_a_blackout_longer_than_a_thousand_due_times() -> None:
    """P4: a schedule due every minute under a weekend window has 2,880 due times to pass
    over; its next run is Monday's first, not "none" (and the same with a global window)."""
    saturday = datetime(2026, 11, 7, 1, 0, tzinfo=UTC)
    weekend = Blackout("weekend", start=Weekly(["sat"], "00:00", "UTC"), duration=48 * H)
    monday = datetime(2026, 11, 9, 0, 0, tzinfo=UTC)
    every_minute = Every(timedelta(minutes=1))
    s = Schedule(content(every_minute, blackouts=[weekend]), at=saturday)
    assert s.state.next_due() == saturday + M
    assert s.state.next_run() == monday
    plain = Schedule(content(every_minute), at=saturday)
    assert plain.state.next_run((weekend,)) == monday
    # Two blackouts in a row (Saturday's and one more day from Monday): passed over too.
    busy = (weekend, Blackout.between("monday", monday, monday + 24 * H))
    assert plain.state.next_run(busy) == monday + 24 * H
    every_second = Schedule(content(Every(timedelta(seconds=1))), at=saturday)
    assert every_second.state.next_run((weekend,)) == monday


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


# The send moment: no run starts inside a window ------------------------------------------------

WINDOW = Blackout.between("freeze", T0 + 22 * M, T0 + 55 * M)
"""Opens two minutes after the 12:20 due time: a run due then must not start inside it."""


def _timed(on_blackout: str, **timing: object) -> Content:
    c = content(on_blackout=on_blackout)
    return Content(**{**c.__dict__, "timing": Timing(**timing)})  # type: ignore[arg-type]


def _minutes(first: int, last: int) -> list[datetime]:
    return [T0 + m * M for m in range(first, last + 1)]


@pytest.mark.parametrize("on_blackout", ["skip", "defer"])
def test_a_jittered_send_that_falls_inside_a_window_does_not_start_there(
    on_blackout: str,
) -> None:
    """P2 + P4: the 12:20 due time is outside the window, its jittered send moment inside."""
    c = _timed(on_blackout, jitter=timedelta(minutes=10))
    [decided] = [e for e in Sim(c, T0).run(_minutes(20, 20)).decided() if e.due == T0 + 20 * M]
    assert decided.send_at is not None and WINDOW.covering(decided.send_at) is not None
    sim = Sim(c, T0).run(_minutes(1, 90), (WINDOW,))
    assert not [m for m in sim.starts.values() if inside(m, [WINDOW])]
    expected = ("skipped", "blackout freeze") if on_blackout == "skip" else ("started", T0 + 55 * M)
    assert sim.outcomes()[T0 + 20 * M] == expected


@pytest.mark.parametrize("on_blackout", ["skip", "defer"])
def test_a_catch_up_after_downtime_does_not_start_inside_a_window(on_blackout: str) -> None:
    """Beat was down from 12:19 to 12:30: the 12:20 due time is decided during the window."""
    sim = Sim(_timed(on_blackout), T0).run([*_minutes(1, 19), *_minutes(30, 70)], (WINDOW,))
    assert not [m for m in sim.starts.values() if inside(m, [WINDOW])]
    expected = ("skipped", "blackout freeze") if on_blackout == "skip" else ("started", T0 + 55 * M)
    assert sim.outcomes()[T0 + 20 * M] == expected


@pytest.mark.parametrize("on_blackout", ["skip", "defer"])
def test_a_run_held_by_buffer_one_does_not_start_inside_a_window(on_blackout: str) -> None:
    """D7: the 12:20 run waits for the 12:10 run (12 minutes long), which ends in the window."""
    c = Content(**{**_timed(on_blackout).__dict__, "overlap": Overlap.BUFFER_ONE})
    sim = Sim(c, T0, run_for=timedelta(minutes=12)).run(_minutes(1, 90), (WINDOW,))
    held = [e for e in sim.decided() if e.due == T0 + 20 * M]
    assert held and held[0].held
    assert not [m for m in sim.starts.values() if inside(m, [WINDOW])]
    expected = ("skipped", "blackout freeze") if on_blackout == "skip" else ("started", T0 + 55 * M)
    assert sim.outcomes()[T0 + 20 * M] == expected


@pytest.mark.parametrize("on_blackout", ["skip", "defer"])
def test_a_run_waiting_for_the_broker_does_not_start_inside_a_window(on_blackout: str) -> None:
    """D3: the broker is away from 12:20 to 12:29; the run decided at 12:20 waits, unsent."""
    down = frozenset(_minutes(20, 29))
    sim = Sim(_timed(on_blackout), T0).run(_minutes(1, 70), (WINDOW,), down)
    assert not [m for m in sim.starts.values() if inside(m, [WINDOW])]
    expected = ("skipped", "blackout freeze") if on_blackout == "skip" else ("started", T0 + 55 * M)
    assert sim.outcomes()[T0 + 20 * M] == expected


def test_a_window_added_or_extended_after_a_run_was_deferred_defers_it_again() -> None:
    first = Blackout.between("first", T0 + 25 * M, T0 + 55 * M)
    sim = Sim(_timed("defer"), T0)
    sim.run(_minutes(1, 40), (first,))
    [deferred] = [e for e in sim.decided() if e.blackout is not None]
    assert (deferred.due, deferred.send_at) == (T0 + 30 * M, T0 + 55 * M)
    later = Blackout.between("later", T0 + 50 * M, T0 + 80 * M)  # added at 12:41
    sim.run(_minutes(41, 100), (first, later))
    assert [(e.due, e.until, e.blackout) for e in sim.events if isinstance(e, RunDeferred)] == [
        (T0 + 30 * M, T0 + 80 * M, "later")
    ]
    assert sim.starts[T0 + 30 * M] == T0 + 80 * M
    extended = Blackout.between("first", T0 + 25 * M, T0 + 85 * M)  # the same name, longer
    again = Sim(_timed("defer"), T0)
    again.run(_minutes(1, 40), (first,))
    again.run(_minutes(41, 100), (extended,))
    assert again.starts[T0 + 30 * M] == T0 + 85 * M
    assert not [m for m in again.starts.values() if inside(m, [extended])]


def test_a_trigger_is_an_explicit_request_and_is_not_held_back() -> None:
    """D9: triggers and backfills are sent when asked for, windows or not (docs/blackouts.md)."""
    sim = Sim(_timed("skip"), T0)
    sim.do(DecideRun(due=T0 + 30 * M, now=T0 + 30 * M, reason="trigger"))
    sim.tick(T0 + 30 * M, (WINDOW,))
    assert sim.starts[T0 + 30 * M] == T0 + 30 * M


def test_next_run_is_the_first_send_moment_a_window_leaves_alone() -> None:
    """P2 + P4: the jittered send of 12:20 falls in the window, so the next run is 12:55's
    run's (skip: 13:00 + its offset) or the deferred one at 12:55 (defer)."""
    jitter = {"jitter": timedelta(minutes=10)}
    skip = Sim(_timed("skip", **jitter), T0).run(_minutes(1, 19))
    offset = jitter_offset("s@2026-11-02T13:00:00.0000000Z", timedelta(minutes=10))
    assert skip.state.next_run((WINDOW,)) == T0 + 60 * M + offset
    defer = Sim(_timed("defer", **jitter), T0).run(_minutes(1, 19))
    assert defer.state.next_run((WINDOW,)) == T0 + 55 * M
    assert defer.state.next_run() == T0 + 20 * M + jitter_offset(
        "s@2026-11-02T12:20:00.0000000Z", timedelta(minutes=10)
    )
