"""Property tests of blackout windows (SPEC P4): no run starts inside a window, and every due
time a window leaves alone behaves exactly as without windows.

Each example drives one schedule twice over the same ticks — once without windows, once with
them — through :class:`~tests.support.blackout_sim.Sim` (the dispatcher's loop over the pure
aggregate), and compares what became of each due time. The ticks have gaps (beat down), the
broker is away at some of them, the schedules have jitter (P2), start deadlines (P1), overlap
policies (D7), their own and global windows, and some examples start just before a clock
change in Oslo (R7), so that windows and due times cross it.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from celery_durable import Blackout, CatchUp, Cron, Daily, Every, Overlap
from celery_durable.core.blackouts import OnBlackout, blocking, check_windows
from celery_durable.core.policies import Timing
from celery_durable.core.schedule_events import Content, RunDecided, RunDeferred, RunSkipped
from tests.support.blackout_sim import Sim, inside

UTC = timezone.utc
M = timedelta(minutes=1)
STARTS = (
    datetime(2026, 11, 2, 12, 0, tzinfo=UTC),
    datetime(2027, 3, 27, 20, 0, tzinfo=UTC),  # Oslo springs forward at 01:00 UTC on the 28th
    datetime(2026, 10, 24, 20, 0, tzinfo=UTC),  # Oslo falls back at 01:00 UTC on the 25th
)


@st.composite
def windows(draw: Any, t0: datetime, name: str) -> list[Blackout]:
    kinds = st.one_of(
        st.builds(
            lambda a, b: Blackout.between(f"{name}fixed", t0 + a * M, t0 + (a + b) * M),
            st.integers(0, 14 * 60),
            st.integers(1, 6 * 60),
        ),
        st.builds(
            lambda h, m, d: Blackout(
                f"{name}nightly", start=Daily(f"{h:02d}:{m:02d}", "Europe/Oslo"), duration=d * M
            ),
            st.integers(0, 23),
            st.sampled_from([0, 15, 30]),
            st.integers(1, 5 * 60),
        ),
        st.builds(
            lambda expr, d: Blackout(f"{name}cron", start=expr, duration=d * M, zone="Europe/Oslo"),
            st.sampled_from(["*/20 * * * *", "30 1 * * *", "0 2 * * *", "45 * * * *"]),
            st.integers(1, 3 * 60),
        ),
    )
    return draw(st.lists(kinds, min_size=0, max_size=2, unique_by=lambda w: w.name))


@st.composite
def cases(draw: Any, overlap: Any = None) -> dict[str, Any]:
    t0 = draw(st.sampled_from(STARTS))
    rule = draw(
        st.one_of(
            st.builds(lambda m: Every(m * M), st.integers(4, 90)),
            st.sampled_from(
                [
                    Cron("15 * * * *", "Europe/Oslo"),
                    Cron("*/10 1-3 * * *", "Europe/Oslo"),
                    Daily("02:30", "Europe/Oslo"),
                ]
            ),
        )
    )
    jitter = draw(st.sampled_from([None, 2 * M, 7 * M, 25 * M, 50 * M]))
    deadlines = [d for d in (9 * M, 40 * M, 90 * M) if jitter is None or d > jitter]
    deadline = draw(st.sampled_from([None, *deadlines]))  # P2 needs jitter < deadline
    own, global_ = draw(windows(t0, "own-")), draw(windows(t0, "global-"))
    if not own and not global_:
        own = [Blackout.between("fixed", t0 + 60 * M, t0 + 150 * M)]
    # Ticks every few minutes over 6 to 14 hours (across the clock change when t0 is one of
    # the evenings), with up to two stretches where beat was down (catch-up, P3, C1-C3).
    step = draw(st.integers(1, 4))
    span = draw(st.integers(6 * 60, 14 * 60))
    outages = draw(st.lists(st.tuples(st.integers(0, span), st.integers(5, 120)), max_size=3))
    ticks = [
        t0 + minute * M
        for minute in range(step, span + 1, step)
        if not any(start <= minute < start + length for start, length in outages)
    ]
    down = draw(st.frozensets(st.sampled_from(ticks), max_size=len(ticks) // 4))
    return {
        "t0": t0,
        "content": Content(
            task="backup",
            input="/srv",
            rule=rule,
            catch_up=draw(st.sampled_from(list(CatchUp))),
            overlap=Overlap.ALLOW if overlap is None else draw(overlap),
            timing=Timing(start_deadline=deadline, jitter=jitter),
            blackouts=check_windows(own),
            on_blackout=draw(st.sampled_from(list(OnBlackout))),
        ),
        "global": tuple(global_),
        "ticks": ticks,
        "down": down,
        "run_for": draw(st.sampled_from([M, 5 * M, 30 * M])),
    }


def _both(case: dict[str, Any], **content: Any) -> tuple[Sim, Sim, list[Blackout]]:
    c = Content(**{**case["content"].__dict__, **content})
    plain = Content(**{**c.__dict__, "blackouts": ()})
    make = {"created": case["t0"], "run_for": case["run_for"]}
    without = Sim(plain, **make).run(case["ticks"], (), case["down"])
    with_ = Sim(c, **make).run(case["ticks"], case["global"], case["down"])
    return without, with_, [*c.blackouts, *case["global"]]


def _no_start_inside(sim: Sim, every: list[Blackout]) -> None:
    decided = {e.due for e in sim.decided()}
    held_back = [
        e for e in sim.events if isinstance(e, RunDeferred | RunSkipped) and e.due in decided
    ]
    event(f"runs held back at their send moment: {min(len(held_back), 3)}")
    event(f"runs started: {min(len(sim.starts), 3)}")
    no_start_inside(sim.outcomes(), every)


def no_start_inside(outcomes: dict[datetime, tuple[Any, ...]], every: list[Blackout]) -> None:
    """No run started inside a window."""
    started_inside = {
        due: o[1] for due, o in outcomes.items() if o[0] == "started" and inside(o[1], every)
    }
    assert not started_inside, f"runs started inside a window: {started_inside}"


def _blackout_reason(outcome: tuple[Any, ...]) -> bool:
    return outcome[0] == "skipped" and str(outcome[1]).startswith("blackout ")


def skip_rule(
    plain: dict[datetime, tuple[Any, ...]],
    guarded: dict[datetime, tuple[Any, ...]],
    every: list[Blackout],
) -> None:
    """``skip``, ``Overlap.ALLOW``: each due time settled without windows is settled with them
    too; one inside a window, or whose run would start inside one, is skipped with the
    reason ``blackout <name>``; every other one exactly as without windows."""
    no_start_inside(guarded, every)
    assert set(plain) == set(guarded)
    for due, outcome in plain.items():
        if inside(due, every) or (outcome[0] == "started" and inside(outcome[1], every)):
            assert _blackout_reason(guarded[due]), (due, guarded[due])
        elif outcome[0] == "waiting" and not _blackout_reason(guarded[due]):
            assert guarded[due] == outcome
        elif outcome[0] != "waiting":
            assert guarded[due] == outcome, (due, outcome, guarded[due])


def defer_rule(
    plain: dict[datetime, tuple[Any, ...]],
    guarded: dict[datetime, tuple[Any, ...]],
    every: list[Blackout],
) -> None:
    """``defer``, ``Overlap.ALLOW``: a due time outside every window whose run starts outside
    them starts at the same moment as without windows; one whose send moment falls inside
    starts when the blackout is over (or later, or is missed: P1); the due times inside one
    blackout give at most one run, started when it is over."""
    no_start_inside(guarded, every)
    assert set(plain) == set(guarded)
    for due, outcome in plain.items():
        if inside(due, every):
            continue
        if outcome[0] == "started" and not inside(outcome[1], every):
            assert guarded[due] == outcome, (due, outcome, guarded[due])
        elif outcome[0] == "started":
            ends = blocking(outcome[1], every)
            assert ends is not None and ends.ends is not None
            assert guarded[due][0] in ("started", "waiting", "missed")
            if guarded[due][0] == "started":
                assert guarded[due][1] >= ends.ends
        elif outcome[0] == "missed":
            assert guarded[due] == outcome
    per_blackout: dict[datetime, int] = {}
    for due, outcome in guarded.items():
        if inside(due, every) and outcome[0] == "started":
            blocked = blocking(due, every)
            assert blocked is not None and blocked.ends is not None
            assert outcome[1] >= blocked.ends
            per_blackout[blocked.ends] = per_blackout.get(blocked.ends, 0) + 1
    assert set(per_blackout.values()) <= {1}, "one run per blackout"


@settings(max_examples=150, deadline=None)
@given(cases())
def test_skip_no_run_starts_inside_a_window_and_the_others_run_as_without(
    case: dict[str, Any],
) -> None:
    """:func:`skip_rule` over the pure aggregate; the decisions of untouched due times are
    the same events (jitter offset and deadline included)."""
    without, with_, every = _both(case, on_blackout=OnBlackout.SKIP)
    _no_start_inside(with_, every)
    assert with_.dropped() == without.dropped()
    skip_rule(without.outcomes(), with_.outcomes(), every)
    untouched = {e.due: e for e in with_.decided() if not inside(e.due, every)}
    for decided in without.decided():
        if decided.due in untouched:
            assert untouched[decided.due] == decided


@settings(max_examples=150, deadline=None)
@given(cases())
def test_defer_no_run_starts_inside_a_window_and_each_blackout_gets_one_run(
    case: dict[str, Any],
) -> None:
    """:func:`defer_rule` over the pure aggregate."""
    without, with_, every = _both(case, on_blackout=OnBlackout.DEFER)
    _no_start_inside(with_, every)
    assert with_.dropped() == without.dropped()
    defer_rule(without.outcomes(), with_.outcomes(), every)


@settings(max_examples=100, deadline=None)
@given(cases(overlap=st.sampled_from([Overlap.SKIP, Overlap.BUFFER_ONE])))
def test_with_overlap_policies_no_run_starts_inside_a_window(case: dict[str, Any]) -> None:
    """D7: a skipped run frees the slot and a deferred one holds it, so later due times may
    differ from a schedule without windows; still no run starts inside a window, every due
    time is settled once, and a window's skips name it."""
    without, with_, every = _both(case)
    _no_start_inside(with_, every)
    assert set(with_.outcomes()) == set(without.outcomes())
    for stored in with_.events:
        if isinstance(stored, RunSkipped) and stored.reason != "overlap":
            assert stored.reason.startswith("blackout ")
    settled = [e.due for e in with_.events if isinstance(e, RunDecided | RunSkipped)]
    skipped_then_decided = [d for d in settled if settled.count(d) > 1]
    for due in skipped_then_decided:  # a decided run skipped at its send moment (P4)
        assert _blackout_reason(with_.outcomes()[due])
