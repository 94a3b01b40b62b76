"""Start deadlines, jitter and catch-up windows in the pure core (SPEC §5d: P1–P3).

The aggregate with explicit moments (no clock), the catch-up selection, the policies' checks
and their stored forms (SPEC §9: new optional fields; data written before them still reads).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_durable import CatchUp, Every, InvalidSchedule, run_id
from celery_durable.core.policies import Timing, jitter_offset
from celery_durable.core.schedule_aggregate import (
    Create,
    DecideDue,
    DecideRun,
    MarkMissed,
    MarkStarted,
    ScheduleState,
    decide,
    digest,
    fold_all,
)
from celery_durable.core.schedule_events import (
    Content,
    RunDecided,
    RunMissed,
    RunsMissed,
    from_data,
    to_data,
)

UTC = timezone.utc
T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)


def content(catch_up: CatchUp = CatchUp.LATEST, every: float = 60, **timing: object) -> Content:
    return Content(
        task="backup",
        input="/srv",
        rule=Every(timedelta(seconds=every)),
        catch_up=catch_up,
        timing=Timing.parse(catch_up, **timing),
    )


class Schedule:
    """Decide, round-trip the events through JSON (they are stored so), fold."""

    def __init__(self, c: Content, at: datetime = T0) -> None:
        self.state = ScheduleState(schedule_id="s")
        self.do(Create(content=c, now=at))

    def do(self, command: object) -> list:
        events = [from_data(e.TYPE, to_data(e)) for e in decide(self.state, command)]  # type: ignore[arg-type]
        self.state = fold_all(self.state, events)
        return events

    def tick(self, now: datetime) -> list:
        return self.do(DecideDue(now=now))


def decided(events: list) -> list[datetime]:
    return [e.due for e in events if isinstance(e, RunDecided)]


# Checks ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"start_deadline": 0}, "more than 0 s"),
        ({"jitter": -1}, "more than 0 s"),
        ({"catch_up_window": timedelta(days=400)}, "at most 366 days"),
        ({"start_deadline": "5s"}, "timedelta or a number of seconds"),
        ({"jitter": True}, "timedelta or a number of seconds"),
        ({"start_deadline": 5, "jitter": 5}, "jitter (5 s) must be shorter than start_deadline"),
        ({"start_deadline": float("nan")}, "start_deadline must be more than 0 s"),
        ({"jitter": float("inf")}, "jitter must be more than 0 s and at most 366 days"),
        ({"catch_up_window": 1e300}, "catch_up_window must be more than 0 s"),
    ],
)
def test_bad_policies_are_refused_in_words(values: dict, words: str) -> None:
    with pytest.raises(InvalidSchedule, match=re.escape(words)):
        Timing.parse(CatchUp.LATEST, **values)


def test_a_catch_up_window_needs_latest_or_all() -> None:
    with pytest.raises(InvalidSchedule, match=r"CatchUp\.NONE already runs only due times"):
        Timing.parse(CatchUp.NONE, catch_up_window=60)
    assert Timing.parse(CatchUp.ALL, catch_up_window=60).catch_up_window == timedelta(minutes=1)


def test_seconds_and_timedeltas_are_the_same_policy() -> None:
    assert Timing.parse(CatchUp.ALL, jitter=2.5, start_deadline=timedelta(seconds=5)) == Timing(
        jitter=timedelta(seconds=2.5), start_deadline=timedelta(seconds=5)
    )


# Stored forms (SPEC §9) ---------------------------------------------------------------------

#: A ScheduleCreated content and a RunDecided as format 1 wrote them before P1–P3 existed.
OLD_CONTENT = {
    "task": "backup",
    "input": "/srv",
    "rule": Every(timedelta(seconds=60)).to_json(),
    "catch_up": "latest",
    "overlap": "allow",
    "options": {},
}
OLD_DECIDED = {
    "v": 1,
    "at": "2026-11-02T12:01:00.000000Z",
    "due": "2026-11-02T12:01:00.000000Z",
    "run_id": "s@2026-11-02T12:01:00.0000000Z",
    "task": "backup",
    "input": "/srv",
    "options": {},
    "reason": "rule",
    "held": False,
    "track_end": False,
}


def test_content_without_policies_keeps_its_old_json_and_digest() -> None:
    old = Content.from_json(OLD_CONTENT)
    assert old.timing == Timing()
    assert old.to_json() == OLD_CONTENT  # so A1's digest of old schedules is unchanged
    assert digest(content()) == digest(old)


def test_policies_round_trip_and_change_the_content() -> None:
    c = content(CatchUp.ALL, start_deadline=30, jitter=5, catch_up_window=3600)
    data = c.to_json()
    assert {k: data[k] for k in ("start_deadline", "jitter", "catch_up_window")} == {
        "start_deadline": 30.0,
        "jitter": 5.0,
        "catch_up_window": 3600.0,
    }
    assert Content.from_json(data) == c
    assert digest(c) != digest(content(CatchUp.ALL))


def test_old_run_decided_reads_without_send_time_or_deadline() -> None:
    event = from_data("RunDecided", OLD_DECIDED)
    assert isinstance(event, RunDecided)
    assert event.send_at is None and event.deadline is None
    assert to_data(event) == OLD_DECIDED  # nothing new is written for a run without policies


def test_run_missed_round_trips() -> None:
    event = RunMissed(at=T0 + 10 * S, due=T0, reason="start deadline passed")
    assert from_data("RunMissed", to_data(event)) == event


def test_index_entries_keep_send_time_and_deadline() -> None:
    s = Schedule(content(start_deadline=30, jitter=10))
    s.tick(T0 + 60 * S)
    [pending] = s.state.pending
    again = ScheduleState.from_json(s.state.to_json())
    assert again.pending == (pending,)
    assert pending.send_at is not None and pending.deadline == T0 + 90 * S


# P1: start deadline ---------------------------------------------------------------------------


def test_a_decision_carries_the_deadline() -> None:
    s = Schedule(content(start_deadline=5))
    [event] = s.tick(T0 + 60 * S)
    assert isinstance(event, RunDecided) and event.deadline == T0 + 65 * S


def test_an_unsent_run_past_its_deadline_is_missed_not_sent() -> None:
    s = Schedule(content(start_deadline=5))
    s.tick(T0 + 60 * S)  # decided; the broker is away, nothing is sent
    assert s.tick(T0 + 64 * S) == []  # before the deadline it is still to be sent
    assert [p.due for p in s.state.sendable()] == [T0 + 60 * S]
    events = s.tick(T0 + 65 * S)
    assert events == [
        RunMissed(
            at=T0 + 65 * S,
            due=T0 + 60 * S,
            reason="start deadline passed before the run could be sent",
        )
    ]
    assert s.state.pending == ()
    assert s.do(MarkStarted(due=T0 + 60 * S, now=T0 + 66 * S)) == []  # cannot start any more


def test_missed_deadlines_are_recorded_while_paused_too() -> None:
    from celery_durable.core.schedule_aggregate import Pause

    s = Schedule(content(start_deadline=5))
    s.tick(T0 + 60 * S)
    s.do(Pause(now=T0 + 61 * S))
    assert [type(e) for e in s.tick(T0 + 70 * S)] == [RunMissed]


def test_a_worker_records_a_sent_run_that_expired() -> None:
    s = Schedule(content(start_deadline=5))
    s.tick(T0 + 60 * S)
    s.do(MarkStarted(due=T0 + 60 * S, now=T0 + 60 * S))
    reason = "start deadline passed while the message waited for a worker"
    assert s.do(MarkMissed(due=T0 + 60 * S, reason=reason, now=T0 + 70 * S)) == []
    [event] = s.do(MarkMissed(due=T0 + 60 * S, reason=reason, now=T0 + 70 * S, sent=True))
    assert event == RunMissed(at=T0 + 70 * S, due=T0 + 60 * S, reason=reason)


def test_trigger_and_backfill_are_not_bound_by_the_deadline() -> None:
    s = Schedule(content(start_deadline=5, jitter=2))
    [event] = s.do(DecideRun(due=T0 + 5 * S, now=T0 + 5 * S, reason="trigger"))
    assert event.deadline is None and event.send_at is None


# P2: jitter ----------------------------------------------------------------------------------


@given(st.integers(0, 10**6), st.floats(1e-6, 86400))
def test_the_offset_is_a_function_of_the_run_id_within_the_jitter(n: int, seconds: float) -> None:
    jitter = timedelta(seconds=seconds)
    rid = run_id("s", T0 + n * S)
    offset = jitter_offset(rid, jitter)
    assert timedelta(0) <= offset < jitter
    assert jitter_offset(rid, jitter) == offset


def test_a_jittered_run_keeps_its_nominal_run_id_and_is_sent_at_due_plus_offset() -> None:
    s = Schedule(content(jitter=10))
    [event] = s.tick(T0 + 60 * S)
    assert event.run_id == "s@2026-11-02T12:01:00.0000000Z"
    assert event.due == T0 + 60 * S
    assert event.send_at == event.due + jitter_offset(event.run_id, timedelta(seconds=10))
    assert s.state.attention() == event.send_at  # the dispatcher sleeps until then


def test_without_jitter_the_send_time_is_the_due_time() -> None:
    s = Schedule(content())
    [event] = s.tick(T0 + 60 * S)
    assert event.send_at is None
    assert s.state.pending[0].send_time == T0 + 60 * S
    assert s.state.attention() == T0 + 60 * S


# P3: catch-up window ------------------------------------------------------------------------


def down_until(c: Content, minutes: int) -> list:
    """Create at T0, come back after ``minutes`` of downtime, decide once."""
    return Schedule(c).tick(T0 + timedelta(minutes=minutes))


def test_latest_with_a_window_longer_than_the_downtime_runs_the_latest() -> None:
    events = down_until(content(CatchUp.LATEST, catch_up_window=3600), 30)
    assert decided(events) == [T0 + timedelta(minutes=30)]


def test_latest_with_a_window_shorter_than_the_downtime() -> None:
    # The latest due time is within a 10-minute window: it runs; older ones are dropped.
    events = down_until(content(CatchUp.LATEST, catch_up_window=600), 30)
    assert decided(events) == [T0 + timedelta(minutes=30)]
    [missed] = [e for e in events if isinstance(e, RunsMissed)]
    assert missed.count == 29


def test_latest_with_a_window_shorter_than_the_last_gap_runs_nothing() -> None:
    # Hourly, down 90 minutes, back at 13:30 with a 10-minute window: 13:00 is too old.
    c = content(CatchUp.LATEST, every=3600, catch_up_window=600)
    events = down_until(c, 90)
    assert decided(events) == []
    [missed] = [e for e in events if isinstance(e, RunsMissed)]
    assert missed.count == 1
    s = Schedule(c)
    s.tick(T0 + timedelta(minutes=90))
    assert s.state.next_due() == T0 + timedelta(hours=2)


def test_all_with_a_window_longer_than_the_downtime_runs_each() -> None:
    events = down_until(content(CatchUp.ALL, catch_up_window=3600), 30)
    assert decided(events) == [T0 + timedelta(minutes=m) for m in range(1, 31)]
    assert not [e for e in events if isinstance(e, RunsMissed)]


def test_all_with_a_window_shorter_than_the_downtime_runs_those_inside_it() -> None:
    events = down_until(content(CatchUp.ALL, catch_up_window=600), 30)
    # Exactly 10 minutes old (12:20) is inside the window.
    assert decided(events) == [T0 + timedelta(minutes=m) for m in range(20, 31)]
    [missed] = [e for e in events if isinstance(e, RunsMissed)]
    assert missed.count == 19
    assert T0 + timedelta(minutes=19) <= missed.through < T0 + timedelta(minutes=20)


def test_all_with_a_window_keeps_its_1000_limit() -> None:
    events = down_until(content(CatchUp.ALL, every=1, catch_up_window=7200), 60)
    runs = decided(events)
    assert len(runs) == 1000 and runs[-1] == T0 + timedelta(minutes=60)
    [missed] = [e for e in events if isinstance(e, RunsMissed)]
    assert missed.through == T0 + timedelta(seconds=2600)  # (too many to count: C2 as before)


def test_a_long_outage_with_a_window_is_cheap() -> None:
    # Every second, down for a year: selection never walks the gap.
    events = down_until(content(CatchUp.ALL, every=1, catch_up_window=30), 365 * 24 * 60)
    assert len(decided(events)) == 31


@given(
    interval=st.integers(1, 7200),
    downtime=st.integers(0, 200_000),
    window=st.integers(1, 100_000),
    latest=st.booleans(),
)
def test_a_window_keeps_exactly_the_due_times_inside_it(
    interval: int, downtime: int, window: int, latest: bool
) -> None:
    """P3 against a plain enumeration: what runs is the policy applied to the due times at
    most ``window`` old; everything older is dropped and accounted for by the cursor."""
    policy = CatchUp.LATEST if latest else CatchUp.ALL
    c = content(policy, every=interval, catch_up_window=window)
    now = T0 + timedelta(seconds=downtime)
    s = Schedule(c)
    events = s.tick(now)
    every = [T0 + k * interval * S for k in range(1, downtime // interval + 1)]
    inside = [d for d in every if d >= now - window * S]
    expected = inside[-1:] if latest else inside[-1000:]
    assert decided(events) == expected
    dropped = len(every) - len(expected)
    missed = [e for e in events if isinstance(e, RunsMissed)]
    if dropped:
        [event] = missed
        assert event.count in (dropped, None)
        assert (expected[0] if expected else now) > event.through >= every[dropped - 1]
    else:
        assert missed == []
    assert s.state.next_due() == T0 + (downtime // interval + 1) * interval * S


def test_a_held_run_past_its_deadline_is_missed_and_woken_for() -> None:
    """BUFFER_ONE (D7) with a start deadline: the held run waits for the running one, but
    not past its deadline; the dispatcher is asked to look again at that deadline."""
    from dataclasses import replace

    from celery_durable.core.policies import Overlap

    s = Schedule(replace(content(start_deadline=30), overlap=Overlap.BUFFER_ONE))
    s.tick(T0 + 60 * S)
    s.do(MarkStarted(due=T0 + 60 * S, now=T0 + 60 * S))  # still running at the next due time
    [held] = s.tick(T0 + 120 * S)
    assert isinstance(held, RunDecided) and held.held and held.deadline == T0 + 150 * S
    assert s.state.sendable() == ()
    assert s.state.attention() == T0 + 150 * S  # before the next due time (T0 + 180 s)
    [missed] = s.tick(T0 + 150 * S)
    assert missed == RunMissed(
        at=T0 + 150 * S,
        due=T0 + 120 * S,
        reason="start deadline passed before the run could be sent",
    )
