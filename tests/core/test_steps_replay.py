"""The pure core of durable runs: folding run events and deciding what a delivery does."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_durable.core.codec import time_to_json
from celery_durable.core.outcomes import Cancelled, Faulted, Finished
from celery_durable.core.run_aggregate import (
    Busy,
    Ended,
    Mismatch,
    NotYet,
    Position,
    Proceed,
    RunState,
    fold,
    on_delivery,
    position_order,
    stored_at,
    unreached,
)

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


@dataclass
class Ev:
    version: int
    type: str
    data: dict[str, Any]


def stream(*events: tuple[str, dict[str, Any]]) -> list[Ev]:
    return [Ev(i, t, {"v": 1, **d}) for i, (t, d) in enumerate(events, start=1)]


def t(seconds: float) -> str:
    return time_to_json(T0 + timedelta(seconds=seconds))


STARTED = ("RunStarted", {"task": "x", "args": [], "kwargs": {}, "options": {}})


def claimed(owner: str = "w1", lease: float = 300) -> tuple[str, dict[str, Any]]:
    return ("RunClaimed", {"owner": owner, "lease_until": t(lease)})


def test_steps_fold_by_position() -> None:
    state = fold(
        stream(
            STARTED,
            claimed(),
            ("StepCompleted", {"position": 0, "name": "a", "kind": "step", "result": [1]}),
            (
                "StepAttemptFailed",
                {
                    "position": 1,
                    "name": "b",
                    "kind": "step",
                    "attempt": 1,
                    "failure": "error",
                    "error_type": "OSError",
                    "message": "x",
                    "first_started_at": t(1),
                    "retry_at": t(3),
                },
            ),
        )
    )
    assert state.version == 4 and state.started
    assert state.positions[0].result == [1] and state.positions[0].status == "completed"
    b = state.positions[1]
    assert (b.status, b.attempts, b.retry_at) == ("retrying", 1, T0 + timedelta(seconds=3))
    assert stored_at(state, 0, "a", "step") is state.positions[0]
    assert stored_at(state, 2, "c", "step") is None
    with pytest.raises(Mismatch) as info:
        stored_at(state, 0, "other", "step")
    assert "position 0" in str(info.value) and "'a'" in str(info.value)
    assert info.value.expected == ("a", "step") and info.value.found == ("other", "step")
    assert unreached(state, 1) is b and unreached(state, 2) is None


_POSITIONS = st.one_of(
    st.integers(0, 12),
    st.lists(st.integers(0, 4), min_size=3, max_size=5).map(lambda p: ".".join(map(str, p))),
)


@given(st.lists(_POSITIONS, max_size=20), st.integers(0, 14))
def test_unreached_is_the_first_stored_position_in_order_at_or_after_the_end(
    positions: list[Any], reached: int
) -> None:
    # The one-pass search (2026-12-06) finds what sorting every position found.
    state = RunState()
    for pos in positions:
        state.positions[pos] = Position(str(pos), "step")
    ordered = sorted(state.positions, key=position_order)
    expected = next((p for p in ordered if position_order(p)[0] >= reached), None)
    found = unreached(state, reached)
    assert found is (None if expected is None else state.positions[expected])


def test_delivery_decisions() -> None:
    now = T0 + timedelta(seconds=10)
    assert isinstance(on_delivery(RunState(), now), Proceed)
    live = fold(stream(STARTED, claimed(lease=60)))
    assert on_delivery(live, now) == Busy("w1", T0 + timedelta(seconds=60))
    assert isinstance(on_delivery(live, now, lambda _owner: False), Proceed)
    expired = fold(stream(STARTED, claimed(lease=5)))
    assert isinstance(on_delivery(expired, now), Proceed)
    asleep = fold(stream(STARTED, claimed(), ("RunSuspended", {"until": t(20), "reason": "sleep"})))
    assert on_delivery(asleep, now) == NotYet(T0 + timedelta(seconds=20))
    assert isinstance(on_delivery(asleep, T0 + timedelta(seconds=20)), Proceed)
    cancelled = fold([Ev(4, "RunCancelRequested", {"v": 1})], asleep)
    assert isinstance(on_delivery(cancelled, now), Proceed)


def test_signal_wait_wakes_on_its_signal_only() -> None:
    waiting = fold(
        stream(
            STARTED,
            claimed(),
            ("RunSuspended", {"until": None, "reason": "signal", "wait": "go"}),
            ("SignalReceived", {"name": "other", "payload": 1}),
        )
    )
    assert on_delivery(waiting, T0) == NotYet(None)
    fold([Ev(5, "SignalReceived", {"v": 1, "name": "go", "payload": 2})], waiting)
    assert isinstance(on_delivery(waiting, T0), Proceed)
    assert waiting.pending_signal("go") == (5, 2)


def test_signals_are_fifo_per_name() -> None:
    state = fold(
        stream(
            ("SignalReceived", {"name": "go", "payload": "first"}),
            ("SignalReceived", {"name": "go", "payload": "second"}),
            STARTED,
            (
                "SignalConsumed",
                {"position": 0, "name": "go", "kind": "signal", "signal": 1, "payload": "first"},
            ),
        )
    )
    assert state.pending_signal("go") == (2, "second")
    assert state.positions[0].result == "first"


@pytest.mark.parametrize(
    ("event", "outcome"),
    [
        (("RunFinished", {"result": {"a": 1}}), Finished({"a": 1})),
        (("RunFaulted", {"error_type": "ValueError", "message": "m"}), Faulted("m", "ValueError")),
        (("RunCancelled", {}), Cancelled()),
    ],
)
def test_endings(event: tuple[str, dict[str, Any]], outcome: Any) -> None:
    state = fold(stream(STARTED, claimed(), event))
    assert state.ended and on_delivery(state, T0) == Ended(outcome)


def test_unknown_events_are_skipped() -> None:
    state = fold(stream(STARTED, ("SomethingNewer", {"x": 1})))
    assert state.version == 2 and state.started


@given(st.lists(st.sampled_from(["a", "b", "c"]), max_size=30))
def test_fold_is_incremental(names: list[str]) -> None:
    events = stream(
        STARTED,
        *[
            ("StepCompleted", {"position": i, "name": n, "kind": "step", "result": i})
            for i, n in enumerate(names)
        ],
    )
    whole = fold(events)
    for cut in range(len(events) + 1):
        part = fold(events[cut:], fold(events[:cut]))
        assert part.version == whole.version
        assert {p: (r.name, r.result) for p, r in part.positions.items()} == {
            p: (r.name, r.result) for p, r in whole.positions.items()
        }
