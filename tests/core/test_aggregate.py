"""The schedule aggregate, pure: A1–A6, C1–C3, R5, R6 through decide() and fold()."""

from __future__ import annotations

from datetime import datetime, time, timedelta, timezone

import pytest

from celery_durable import CatchUp, Daily, Every, InvalidSchedule, Once, ScheduleConflict, Weekly
from celery_durable.core.catchup import ALL_LIMIT
from celery_durable.core.schedule_aggregate import (
    Change,
    Create,
    DecideDue,
    DecideRun,
    Delete,
    MarkFailedToStart,
    MarkStarted,
    Pause,
    Resume,
    ScheduleState,
    decide,
    fold_all,
)
from celery_durable.core.schedule_events import Content, RunDecided, RunsMissed, from_data, to_data

UTC = timezone.utc
T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)  # a Monday, noon UTC
OSLO = "Europe/Oslo"


def content(rule=None, catch_up=CatchUp.LATEST, task="backup", input="/srv", **options) -> Content:
    return Content(
        task=task,
        input=input,
        rule=rule or Daily(time(2, 0), OSLO),
        catch_up=catch_up,
        options=options,
    )


class Schedule:
    """A tiny in-memory harness: decide, then fold what was decided (as the store does)."""

    def __init__(self, sid: str = "nightly") -> None:
        self.state = ScheduleState(schedule_id=sid)
        self.log: list = []

    def do(self, command) -> list:
        events = decide(self.state, command)
        # Events survive their JSON form unchanged (they are stored as JSON).
        events = [from_data(e.TYPE, to_data(e)) for e in events]
        self.state = fold_all(self.state, events)
        self.log.extend(events)
        return events

    def tick(self, now: datetime) -> list[datetime]:
        return [e.due for e in self.do(DecideDue(now=now)) if isinstance(e, RunDecided)]


def created(c: Content | None = None, at: datetime = T0, sid: str = "nightly") -> Schedule:
    s = Schedule(sid)
    s.do(Create(content=c or content(), now=at))
    return s


# A1 -----------------------------------------------------------------------------------------


def test_a1_second_create_with_same_content_stores_nothing() -> None:
    s = created()
    assert s.do(Create(content=content(), now=T0 + timedelta(hours=1))) == []


def test_a1_same_content_compares_with_first_content_even_after_change() -> None:
    s = created()
    s.do(Change(content=content(input="/other"), now=T0 + timedelta(hours=1)))
    assert s.do(Create(content=content(), now=T0 + timedelta(hours=2))) == []
    with pytest.raises(ScheduleConflict, match="different content"):
        decide(s.state, Create(content=content(input="/other"), now=T0 + timedelta(hours=3)))


def test_a1_weekly_days_are_normalised_before_comparison() -> None:
    s = created(content(Weekly(["thu", "mon"], time(8), OSLO)))
    assert (
        s.do(Create(content=content(Weekly(["monday", "thursday", "mon"], "08:00", OSLO)), now=T0))
        == []
    )


def test_a1_create_with_other_content_conflicts_and_stores_nothing() -> None:
    s = created()
    before = s.state
    with pytest.raises(ScheduleConflict):
        decide(s.state, Create(content=content(task="other"), now=T0))
    assert s.state == before


def test_a1_create_of_deleted_id_conflicts_even_with_same_content() -> None:
    s = created()
    s.do(Delete(now=T0 + timedelta(minutes=1)))
    with pytest.raises(ScheduleConflict, match="deleted"):
        decide(s.state, Create(content=content(), now=T0 + timedelta(minutes=2)))


def test_r8_end_at_before_creation_is_refused() -> None:
    with pytest.raises(InvalidSchedule, match="end_at"):
        decide(
            ScheduleState(schedule_id="x"),
            Create(content=content(Daily("02:00", OSLO, end_at=T0 - timedelta(days=1))), now=T0),
        )


# Rule dues ----------------------------------------------------------------------------------


def test_daily_decides_each_night_in_utc() -> None:
    s = created()
    assert s.tick(T0 + timedelta(hours=6)) == []
    assert s.state.next_due() == datetime(2026, 11, 3, 1, 0, tzinfo=UTC)
    assert s.tick(datetime(2026, 11, 3, 1, 0, 0, tzinfo=UTC)) == [
        datetime(2026, 11, 3, 1, tzinfo=UTC)
    ]
    assert s.tick(datetime(2026, 11, 3, 1, 0, 5, tzinfo=UTC)) == []


def test_every_counts_from_the_anchor() -> None:
    s = created(content(Every(timedelta(seconds=10))))
    assert s.tick(T0 + timedelta(seconds=10)) == [T0 + timedelta(seconds=10)]
    assert s.tick(T0 + timedelta(seconds=15)) == []
    assert s.tick(T0 + timedelta(seconds=20)) == [T0 + timedelta(seconds=20)]


def test_run_decided_carries_run_id_task_and_input() -> None:
    s = created(content(Every(timedelta(seconds=10)), input={"a": 1}, queue="q"))
    s.tick(T0 + timedelta(seconds=10))
    decided = next(e for e in s.log if isinstance(e, RunDecided))
    assert decided.run_id == "nightly@2026-11-02T12:00:10.0000000Z"
    assert decided.task == "backup"
    assert decided.input == {"a": 1}
    assert decided.options == {"queue": "q"}


# C1–C3 --------------------------------------------------------------------------------------


def test_c1_latest_three_nights_off_runs_only_the_last_night() -> None:
    s = created()
    back = datetime(2026, 11, 5, 9, 0, tzinfo=UTC)
    assert s.tick(back) == [datetime(2026, 11, 5, 1, tzinfo=UTC)]
    missed = [e for e in s.log if isinstance(e, RunsMissed)]
    assert missed and missed[0].count == 2
    assert s.tick(back + timedelta(minutes=1)) == []


def test_c2_all_two_mondays_off_runs_both_oldest_first() -> None:
    s = created(content(Weekly(["mon"], "08:00", OSLO), catch_up=CatchUp.ALL))
    back = datetime(2026, 11, 17, 12, 0, tzinfo=UTC)
    assert s.tick(back) == [
        datetime(2026, 11, 9, 7, tzinfo=UTC),
        datetime(2026, 11, 16, 7, tzinfo=UTC),
    ]


def test_c2_all_keeps_only_the_1000_most_recent() -> None:
    s = created(content(Every(timedelta(seconds=1)), catch_up=CatchUp.ALL))
    dues = s.tick(T0 + timedelta(seconds=1500))
    assert len(dues) == ALL_LIMIT
    assert dues[0] == T0 + timedelta(seconds=501)
    assert dues[-1] == T0 + timedelta(seconds=1500)
    assert dues == sorted(dues)


def test_c2_all_after_a_year_down_still_finds_the_most_recent_quickly() -> None:
    s = created(content(Every(timedelta(seconds=1)), catch_up=CatchUp.ALL))
    back = T0 + timedelta(days=365)
    dues = s.tick(back)
    assert len(dues) == ALL_LIMIT
    assert dues[-1] == back
    assert dues[0] == back - timedelta(seconds=ALL_LIMIT - 1)


def test_c3_none_drops_missed_and_runs_on_time() -> None:
    s = created(content(Every(timedelta(seconds=30)), catch_up=CatchUp.NONE))
    # Back after 10 minutes: due times more than 60 s late are missed; three are on time.
    back = T0 + timedelta(minutes=10)
    assert s.tick(back) == [back - timedelta(seconds=s) for s in (60, 30, 0)]
    missed = [e for e in s.log if isinstance(e, RunsMissed)]
    assert missed[0].count == 17
    assert s.tick(back + timedelta(seconds=1)) == []


def test_c3_none_only_missed_decides_nothing_and_moves_on() -> None:
    s = created(content(catch_up=CatchUp.NONE))
    assert s.tick(datetime(2026, 11, 5, 9, tzinfo=UTC)) == []
    assert s.state.next_due() == datetime(2026, 11, 6, 1, tzinfo=UTC)


def test_on_time_is_at_most_60_seconds_late() -> None:
    s = created(content(catch_up=CatchUp.NONE))
    due = datetime(2026, 11, 3, 1, tzinfo=UTC)
    assert s.tick(due + timedelta(seconds=60)) == [due]
    s2 = created(content(catch_up=CatchUp.NONE))
    assert s2.tick(due + timedelta(seconds=61)) == []


# A2 -----------------------------------------------------------------------------------------


def test_a2_change_no_due_time_at_or_before_the_change_runs() -> None:
    s = created()
    change_at = datetime(2026, 11, 4, 12, tzinfo=UTC)
    s.do(Change(content=content(input="/new"), now=change_at))
    # Two nights before the change were missed: none of them runs, even with ALL.
    assert s.tick(change_at + timedelta(minutes=1)) == []
    assert s.tick(datetime(2026, 11, 5, 1, tzinfo=UTC)) == [datetime(2026, 11, 5, 1, tzinfo=UTC)]


def test_a2_every_counts_from_the_change() -> None:
    s = created(content(Every(timedelta(seconds=10))))
    s.do(Change(content=content(Every(timedelta(seconds=7))), now=T0 + timedelta(seconds=3)))
    assert s.state.next_due() == T0 + timedelta(seconds=10)


def test_a2_change_to_current_content_stores_nothing() -> None:
    s = created()
    assert s.do(Change(content=content(), now=T0 + timedelta(hours=1))) == []


@pytest.mark.parametrize("deleted", [False, True])
def test_a2_change_of_unknown_or_deleted_conflicts(deleted: bool) -> None:
    s = created() if deleted else Schedule()
    if deleted:
        s.do(Delete(now=T0))
    with pytest.raises(ScheduleConflict):
        decide(s.state, Change(content=content(), now=T0))


# A3 -----------------------------------------------------------------------------------------


def test_a3_due_times_inside_a_pause_never_run_whatever_the_policy() -> None:
    for policy in CatchUp:
        s = created(content(catch_up=policy))
        s.do(Pause(now=T0 + timedelta(hours=1)))
        assert s.tick(datetime(2026, 11, 5, 9, tzinfo=UTC)) == []
        assert s.state.next_due() is None
        s.do(Resume(now=datetime(2026, 11, 5, 9, tzinfo=UTC)))
        assert s.tick(datetime(2026, 11, 5, 9, 1, tzinfo=UTC)) == []
        assert s.state.next_due() == datetime(2026, 11, 6, 1, tzinfo=UTC)


def test_a3_pause_twice_is_a_no_op_and_resume_unpaused_conflicts() -> None:
    s = created()
    assert len(s.do(Pause(now=T0))) == 1
    assert s.do(Pause(now=T0)) == []
    s.do(Resume(now=T0))
    with pytest.raises(ScheduleConflict, match="not paused"):
        decide(s.state, Resume(now=T0))


def test_a3_pause_unknown_or_deleted_conflicts() -> None:
    with pytest.raises(ScheduleConflict):
        decide(ScheduleState(schedule_id="x"), Pause(now=T0))
    s = created()
    s.do(Delete(now=T0))
    with pytest.raises(ScheduleConflict):
        decide(s.state, Pause(now=T0))


# A4 -----------------------------------------------------------------------------------------


def test_a4_delete_unknown_conflicts_and_deleted_is_a_no_op() -> None:
    with pytest.raises(ScheduleConflict):
        decide(ScheduleState(schedule_id="x"), Delete(now=T0))
    s = created()
    assert len(s.do(Delete(now=T0))) == 1
    assert s.do(Delete(now=T0)) == []
    assert s.tick(datetime(2026, 11, 9, tzinfo=UTC)) == []


# A5, A6 -------------------------------------------------------------------------------------


def test_a5_decided_run_stays_pending_across_change_pause_delete() -> None:
    s = created(content(Every(timedelta(seconds=10)), input="old"))
    s.tick(T0 + timedelta(seconds=10))
    s.do(
        Change(
            content=content(Every(timedelta(seconds=10)), input="new"),
            now=T0 + timedelta(seconds=11),
        )
    )
    s.do(Pause(now=T0 + timedelta(seconds=12)))
    s.do(Delete(now=T0 + timedelta(seconds=13)))
    [pending] = s.state.pending
    assert pending.input == "old"
    assert pending.run_id == "nightly@2026-11-02T12:00:10.0000000Z"


def test_a6_started_and_failed_runs_leave_pending() -> None:
    s = created(content(Every(timedelta(seconds=10))))
    s.tick(T0 + timedelta(seconds=20))
    s.tick(T0 + timedelta(seconds=30))
    assert len(s.state.pending) == 2
    s.do(MarkStarted(due=T0 + timedelta(seconds=20), now=T0))
    assert s.do(MarkStarted(due=T0 + timedelta(seconds=20), now=T0)) == []
    s.do(MarkFailedToStart(due=T0 + timedelta(seconds=30), error="boom", now=T0))
    assert s.state.pending == ()


def test_a6_explicit_due_time_in_the_future_is_refused_and_decided_once() -> None:
    s = created(content(Every(timedelta(seconds=10))))
    with pytest.raises(InvalidSchedule, match="future"):
        decide(s.state, DecideRun(due=T0 + timedelta(seconds=5), now=T0, reason="trigger"))
    due = T0 + timedelta(milliseconds=500)
    assert decide(s.state, DecideRun(due=due, now=T0, reason="trigger"))
    s.do(DecideRun(due=due, now=T0, reason="trigger"))
    assert s.do(DecideRun(due=due, now=T0, reason="trigger")) == []


# R5, R6 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", list(CatchUp))
def test_r5_past_once_runs_at_the_next_tick_whatever_the_policy(policy: CatchUp) -> None:
    at = T0 - timedelta(days=3)
    s = created(content(Once(at), catch_up=policy))
    assert s.tick(T0 + timedelta(seconds=1)) == [at]
    assert s.state.next_due() is None
    assert s.tick(T0 + timedelta(days=1)) == []


def test_r5_future_once_waits_for_its_time() -> None:
    at = T0 + timedelta(hours=1)
    s = created(content(Once(at)))
    assert s.tick(T0 + timedelta(minutes=59)) == []
    assert s.tick(at) == [at]


def test_r6_max_runs_completes_the_schedule() -> None:
    s = created(content(Every(timedelta(seconds=2), max_runs=3), catch_up=CatchUp.ALL))
    assert s.tick(T0 + timedelta(seconds=4)) == [
        T0 + timedelta(seconds=2),
        T0 + timedelta(seconds=4),
    ]
    assert s.tick(T0 + timedelta(seconds=10)) == [T0 + timedelta(seconds=6)]
    assert s.state.next_due() is None
    assert s.tick(T0 + timedelta(seconds=20)) == []


def test_r6_end_at_bounds_the_due_times() -> None:
    end = T0 + timedelta(seconds=25)
    s = created(content(Every(timedelta(seconds=10), end_at=end), catch_up=CatchUp.ALL))
    assert s.tick(T0 + timedelta(minutes=5)) == [
        T0 + timedelta(seconds=10),
        T0 + timedelta(seconds=20),
    ]
    assert s.state.next_due() is None


# State JSON (the index entry format) ---------------------------------------------------------


def test_state_json_round_trip() -> None:
    s = created(content(Every(timedelta(seconds=10)), input={"k": [1, 2]}, queue="q"))
    s.tick(T0 + timedelta(seconds=10))
    s.do(Pause(now=T0 + timedelta(seconds=11)))
    assert ScheduleState.from_json(s.state.to_json()) == s.state


def test_oslo_dst_nights() -> None:
    s = created(content(), at=datetime(2026, 10, 24, 12, tzinfo=UTC))
    # R7: 02:00 on 2026-10-25 happens twice in Oslo; it is due once, at the first (00:00 UTC).
    assert s.tick(datetime(2026, 10, 25, 3, tzinfo=UTC)) == [datetime(2026, 10, 25, 0, tzinfo=UTC)]
    s2 = created(content(), at=datetime(2027, 3, 27, 12, tzinfo=UTC))
    # 2027-03-28 02:00 does not exist: due at 03:00 CEST = 01:00 UTC.
    assert s2.tick(datetime(2027, 3, 28, 3, tzinfo=UTC)) == [datetime(2027, 3, 28, 1, tzinfo=UTC)]


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"version": 7},
        {"version": 2, "pending": (), "running": (T0,)},
        {"paused": True, "deleted": True, "cursor": None, "anchor": T0},
        {"content": content(Every(timedelta(minutes=5))), "runs_since_change": 0},
        {"last_decided": T0, "runs_decided": 3, "created_digest": "x", "created_at": T0},
    ],
)
def test_fold_builds_the_state_dataclasses_replace_would(changes: dict[str, object]) -> None:
    """Folding builds each new state without ``dataclasses.replace`` (it is on the hot path);
    the state is the same, field for field, and still frozen."""
    import dataclasses

    from celery_durable.core.schedule_aggregate import _evolved

    state = created().state
    built = _evolved(state, dict(changes))
    assert built == dataclasses.replace(state, **changes)  # type: ignore[arg-type]
    assert [getattr(built, f.name) for f in dataclasses.fields(built)] == [
        changes.get(f.name, getattr(state, f.name)) for f in dataclasses.fields(built)
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.version = 0  # type: ignore[misc]


def test_a_selection_is_remembered_for_its_rule_grid_and_moment() -> None:
    """A burst decides thousands of schedules of one rule at one moment: the catch-up
    selection is computed once for them. The anchor counts only where the rule reads it."""
    from celery_durable import Cron
    from celery_durable.core.catchup import select

    now = T0 + timedelta(hours=3, seconds=1)
    every = select(Every(timedelta(hours=1)), after=T0, now=now, anchor=T0, policy=CatchUp.ALL)
    again = select(Every(timedelta(hours=1)), after=T0, now=now, anchor=T0, policy=CatchUp.ALL)
    assert again is every and len(every.run) == 3
    shifted = T0 + timedelta(minutes=30)
    other = select(Every(timedelta(hours=1)), after=T0, now=now, anchor=shifted, policy=CatchUp.ALL)
    assert other.run == tuple(shifted + timedelta(hours=k) for k in (1, 2)) != every.run
    cron = [
        select(Cron("0 * * * *"), after=T0, now=now, anchor=a, policy=CatchUp.ALL)
        for a in (T0, shifted)
    ]
    assert cron[0] is cron[1] and cron[0].run == every.run


def test_a_beat_entry_selection_asks_its_live_object_each_time() -> None:
    """B3: a BeatEntry's due times come from the live object, which may answer otherwise
    from one moment to the next: its selection is never remembered."""
    from celery_durable.core.catchup import select
    from celery_durable.core.rules import BeatEntry

    answers = [T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)]

    class Live:
        def next_due(self, entry: str, after: datetime) -> datetime | None:
            return answers[0] if after < answers[0] else None

        def as_of(self, now: datetime) -> Live:
            return self

    now = T0 + timedelta(minutes=5)
    rule = BeatEntry("e")
    first = select(rule, after=T0, now=now, anchor=T0, policy=CatchUp.ALL, live=Live())
    answers.pop(0)
    second = select(rule, after=T0, now=now, anchor=T0, policy=CatchUp.ALL, live=Live())
    assert first.run == (T0 + timedelta(minutes=1),)
    assert second.run == (T0 + timedelta(minutes=2),)
