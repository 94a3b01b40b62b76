"""The pure core of durable runs: run events, their fold into a state, and delivery decisions.

A durable run's journal is the stream ``run/<run_id>``. Every event's data carries ``"v": 1``;
type names and fields are persistent contracts (SPEC §9) listed in docs/durable-tasks.md.
Nothing here performs I/O or reads the clock: the time is an argument.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from celery_durable.core.branches import (
    BRANCHES_STARTED,
    BRANCHES_STOPPED,
    calls_of,
    position_order,
)
from celery_durable.core.children import (
    CHILD_ENDED,
    CHILD_STARTED,
    CHILD_WAIT,
    FAN_OUT_STARTED,
    FanOut,
    child_error,
)
from celery_durable.core.codec import time_from_json
from celery_durable.core.outcomes import Cancelled, Faulted, Finished, Outcome

FORMAT = 1

# Run life cycle.
RUN_STARTED = "RunStarted"
RUN_CLAIMED = "RunClaimed"
RUN_SUSPENDED = "RunSuspended"
RUN_FINISHED = "RunFinished"
RUN_FAULTED = "RunFaulted"
RUN_CANCEL_REQUESTED = "RunCancelRequested"
RUN_CANCELLED = "RunCancelled"
RUN_PARKED = "RunParked"
# Positions (steps, helpers, sleeps, signal waits).
STEP_STARTED = "StepStarted"
STEP_COMPLETED = "StepCompleted"
STEP_ATTEMPT_FAILED = "StepAttemptFailed"
STEP_FAILED = "StepFailed"
SLEEP_STARTED = "SleepStarted"
SIGNAL_WAIT_STARTED = "SignalWaitStarted"
SIGNAL_CONSUMED = "SignalConsumed"
SIGNAL_TIMED_OUT = "SignalTimedOut"
# From outside the run.
SIGNAL_RECEIVED = "SignalReceived"

ENDINGS = frozenset((RUN_FINISHED, RUN_FAULTED, RUN_CANCELLED))

_SENT_BEFORE = frozenset(
    (
        STEP_STARTED, STEP_COMPLETED, STEP_ATTEMPT_FAILED, STEP_FAILED, SLEEP_STARTED,
        SIGNAL_WAIT_STARTED, SIGNAL_CONSUMED, SIGNAL_TIMED_OUT, CHILD_ENDED, FAN_OUT_STARTED,
        BRANCHES_STARTED, BRANCHES_STOPPED, RUN_SUSPENDED, RUN_FINISHED, RUN_FAULTED,
        RUN_CANCELLED, RUN_PARKED,
    )
)  # fmt: skip
"""Events only the delivery holding the claim writes, after the sends of the children it
started before (a start is committed, then sent, then the delivery goes on): once one follows
a ``ChildStarted``, that child was handed to the broker (W10). ``RunClaimed`` (a renewal or the
next delivery), ``SignalReceived`` and ``RunCancelRequested`` (written from outside) are not."""

PositionId = int | str
"""A position of the body: ``3`` on the run's straight line, ``"3.1.0"`` inside a parallel
branch (S4: step 0 of branch 1 of the parallel call at position 3). Stored as JSON as is."""


def position_id(value: Any) -> PositionId:
    """A stored position as the fold keys it: an int, or a dotted str (W9)."""
    if type(value) is int:  # the straight line's (a replay folds one per step)
        return value
    if isinstance(value, str) and "." in value:
        return value
    return int(value)


@dataclass(slots=True)
class Position:
    """What the journal holds for one position of the body."""

    name: str
    kind: str
    status: str = "started"
    """``started``, ``retrying``, ``completed``, ``failed``, ``sleeping``, ``waiting`` or
    ``timed_out``."""
    result: Any = None
    error: dict[str, Any] | None = None
    attempts: int = 0
    """Failed attempts stored so far."""
    first_started: datetime | None = None
    retry_at: datetime | None = None
    until: datetime | None = None
    """Wake time of a sleep, or the timeout of a signal wait (``None``: no timeout)."""
    child: str | None = None
    """The run ID of the child started at this position (``child``/``start_child``)."""
    fanout: FanOut | None = None
    """The children of a ``map_children`` position."""
    branches: int | None = None
    """The number of branches of a group call (``parallel``/``race``/``gather``: W9);
    ``None`` for other positions and for calls stored before the group markers."""
    stopped_by: int | None = None
    """The branch whose failure stopped a group call (``BranchesStopped``)."""


@dataclass(slots=True)
class Claim:
    owner: str
    lease_until: datetime


@dataclass(slots=True)
class RunState:
    """Everything a delivery needs to know about a run, folded from its stream."""

    version: int = 0
    task: str | None = None
    message: dict[str, Any] | None = None
    positions: dict[PositionId, Position] = field(default_factory=dict)
    claim: Claim | None = None
    suspended_until: datetime | None = None
    suspended_reason: str | None = None
    suspended_wait: str | None = None
    suspended: bool = False
    signals: dict[str, deque[tuple[int, Any]]] = field(default_factory=dict)
    cancel_requested: bool = False
    cancel_delivered: bool = False
    parked: dict[str, Any] | None = None
    outcome: Outcome | None = None
    parent: str | None = None
    """The run ID of the parent of a child run (W13)."""
    branch_calls: set[PositionId] = field(default_factory=set)
    """The group calls (W9) with stored branch positions (see ``core.branches.legacy``)."""
    unsent: list[str] = field(default_factory=list)
    """Children whose start is the last thing the delivery that stored it wrote: that
    delivery may have died before sending them (W10), so the next one sends them again."""

    @property
    def started(self) -> bool:
        return self.message is not None

    @property
    def ended(self) -> bool:
        return self.outcome is not None

    @property
    def cancel_pending(self) -> bool:
        return self.cancel_requested and not self.cancel_delivered

    def pending_signal(self, name: str) -> tuple[int, Any] | None:
        queue = self.signals.get(name)
        return queue[0] if queue else None


def _position(state: RunState, data: Mapping[str, Any]) -> Position:
    pos = position_id(data["position"])
    record = state.positions.get(pos)
    if record is None:
        record = state.positions[pos] = Position(data["name"], data["kind"])
        if isinstance(pos, str):
            state.branch_calls.update(calls_of(pos))
    return record


def apply(state: RunState, version: int, type_: str, data: Mapping[str, Any]) -> None:
    """Fold one event into ``state`` (in place: replay of long runs must be cheap)."""
    state.version = version
    if state.unsent and type_ in _SENT_BEFORE:
        state.unsent.clear()
    if type_ == STEP_COMPLETED:
        record = _position(state, data)
        record.status = "completed"
        record.result = data.get("result")
    elif type_ == RUN_CLAIMED:
        state.claim = Claim(data["owner"], time_from_json(data["lease_until"]))
        state.suspended = False
    elif type_ == RUN_STARTED:
        state.task = data.get("task")
        state.parent = data.get("parent")
        state.message = {k: data.get(k) for k in ("task", "args", "kwargs", "options")}
    elif type_ == STEP_STARTED:
        record = _position(state, data)
        if record.first_started is None:
            record.first_started = time_from_json(data["at"])
    elif type_ == STEP_ATTEMPT_FAILED:
        record = _position(state, data)
        record.status = "retrying"
        record.attempts = int(data["attempt"])
        record.first_started = time_from_json(data["first_started_at"])
        record.retry_at = time_from_json(data["retry_at"])
        record.error = _error(data)
    elif type_ == STEP_FAILED:
        record = _position(state, data)
        record.status = "failed"
        record.attempts = int(data.get("attempts", record.attempts))
        record.error = _error(data)
        if data.get("failure") == "cancelled" and "child" not in data:
            # (a child's cancellation failing the step is not this run's cancel request)
            state.cancel_delivered = True
    elif type_ == SLEEP_STARTED:
        record = _position(state, data)
        record.status = "sleeping"
        record.until = time_from_json(data["wake_at"])
    elif type_ == SIGNAL_WAIT_STARTED:
        record = _position(state, data)
        record.status = "waiting"
        record.first_started = time_from_json(data["at"])
        until = data.get("until")
        record.until = None if until is None else time_from_json(until)
    elif type_ == SIGNAL_CONSUMED:
        record = _position(state, data)
        record.status = "completed"
        record.result = data.get("payload")
        queue = state.signals.get(data["name"])
        signal_version = data.get("signal")
        if queue:
            # FIFO per name: the consumed one is the oldest, but match by version anyway.
            for index, (stored_version, _) in enumerate(queue):
                if stored_version == signal_version:
                    del queue[index]
                    break
    elif type_ == SIGNAL_TIMED_OUT:
        record = _position(state, data)
        record.status = "timed_out"
        record.result = None
    elif type_ in (CHILD_STARTED, CHILD_ENDED, FAN_OUT_STARTED):
        _apply_child(_position(state, data), type_, data)
        if type_ == CHILD_STARTED:
            state.unsent.append(data["child"])
    elif type_ in (BRANCHES_STARTED, BRANCHES_STOPPED):
        record = _position(state, data)
        if data.get("branches") is not None:
            record.branches = int(data["branches"])
        if type_ == BRANCHES_STOPPED:
            record.stopped_by = int(data["branch"])
    elif type_ == SIGNAL_RECEIVED:
        state.signals.setdefault(data["name"], deque()).append((version, data.get("payload")))
    elif type_ == RUN_SUSPENDED:
        state.claim = None
        state.suspended = True
        until = data.get("until")
        state.suspended_until = None if until is None else time_from_json(until)
        state.suspended_reason = data.get("reason")
        state.suspended_wait = data.get("wait")
    elif type_ == RUN_CANCEL_REQUESTED:
        state.cancel_requested = True
    elif type_ == RUN_FINISHED:
        state.outcome = Finished(data.get("result"))
        state.claim = None
    elif type_ == RUN_FAULTED:
        state.outcome = Faulted(
            str(data.get("message", "")),
            str(data.get("error_type", "Exception")),
            data.get("failure"),
        )
        state.claim = None
    elif type_ == RUN_CANCELLED:
        state.outcome = Cancelled()
        state.claim = None
    elif type_ == RUN_PARKED:
        state.parked = dict(data)
        state.claim = None
    # Unknown types are skipped: a newer version may add events an older reader can ignore.


def _apply_child(record: Position, type_: str, data: Mapping[str, Any]) -> None:
    index = data.get("index")
    if type_ == FAN_OUT_STARTED:
        record.status = "waiting"
        record.fanout = FanOut(int(data["total"]), int(data["at_most"]))
    elif type_ == CHILD_STARTED:
        if index is None:
            record.status = "waiting"
            record.child = data["child"]
        elif record.fanout is not None:
            record.fanout.start(int(index), data["child"])
    elif index is not None:
        fan = record.fanout
        if fan is not None:
            fan.end(int(index), dict(data["outcome"]))
            if record.status == "waiting" and fan.done() and fan.first_failure() is None:
                # Every child finished: the position is as done as a stored step (W11).
                record.status = "completed"
                record.result = fan.results()
    else:
        outcome = data["outcome"]
        if outcome.get("state") == "finished":
            record.status = "completed"
            record.result = outcome.get("result")
        else:
            record.status = "failed"
            record.error = child_error(data["child"], outcome)


def _error(data: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "error_type": data.get("error_type", "Exception"),
        "message": data.get("message", ""),
        "failure": data.get("failure", "error"),
    }


def fold(events: Iterable[Any], state: RunState | None = None) -> RunState:
    """Fold stored events (anything with ``version``, ``type``, ``data``) into a state."""
    state = state if state is not None else RunState()
    for event in events:
        apply(state, event.version, event.type, event.data)
    return state


def parked_outcome(state: RunState) -> Faulted | None:
    """The ``Faulted`` reported for a parked run (``None`` if it is not parked)."""
    if state.parked is None:
        return None
    return Faulted(
        str(state.parked.get("message", "")), "celery_durable.errors.RunParked", "parked"
    )


# -- what a delivery does -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ended:
    """The run has ended: return or raise its outcome without running the body."""

    outcome: Outcome


@dataclass(frozen=True, slots=True)
class Busy:
    """Another delivery holds a live claim until ``until``: do nothing."""

    owner: str
    until: datetime


@dataclass(frozen=True, slots=True)
class NotYet:
    """The run sleeps (or waits) until ``until`` (``None``: until a signal): go back to sleep."""

    until: datetime | None


@dataclass(frozen=True, slots=True)
class Proceed:
    """Claim the run and replay the body."""


Delivery = Ended | Busy | NotYet | Proceed


def on_delivery(
    state: RunState,
    now: datetime,
    owner_alive: Callable[[str], bool] = lambda _owner: True,
    *,
    owner: str | None = None,
) -> Delivery:
    """What a delivery of the run's message should do, given the stored state. Pure, apart
    from ``owner_alive(owner)``, which may say that a claim's owner is known to be dead.
    ``owner``: this delivery's claim name; a claim of its own is no obstacle."""
    if state.outcome is not None:
        return Ended(state.outcome)
    claim = state.claim
    if (
        claim is not None
        and claim.owner != owner
        and claim.lease_until > now
        and owner_alive(claim.owner)
    ):
        return Busy(claim.owner, claim.lease_until)
    if state.suspended and not state.cancel_pending:
        until = state.suspended_until
        waiting_for = state.suspended_wait
        if waiting_for is not None and state.pending_signal(waiting_for) is not None:
            return Proceed()
        if state.suspended_reason == CHILD_WAIT:
            # A parent waiting for children is sent again when one ends: look at them.
            return Proceed()
        if until is None or until > now:
            return NotYet(until)
    return Proceed()


class Mismatch(Exception):
    """The body asked for another step than the one stored at this position (W6)."""

    def __init__(
        self, position: PositionId, expected: tuple[str, str], found: tuple[str, str]
    ) -> None:
        self.position = position
        self.expected = expected
        self.found = found
        super().__init__(
            f"non-deterministic replay at position {position}: the journal holds "
            f"{expected[1]} {expected[0]!r} but the body now asks for {found[1]} {found[0]!r}"
        )


def stored_at(state: RunState, position: PositionId, name: str, kind: str) -> Position | None:
    """The stored record at ``position``, checked against the step the body asks for (W6)."""
    record = state.positions.get(position)
    if record is not None and (record.name != name or record.kind != kind):
        raise Mismatch(position, (record.name, record.kind), (name, kind))
    return record


def unreached(state: RunState, reached: int) -> Position | None:
    """A stored position at or after ``reached`` that a body which ended there never asked for
    (a branch position counts as its parallel call's top-level position)."""
    # One pass instead of sorting every position (a replay's end looks past 1,000 steps).
    first: tuple[int, ...] | None = None
    found = None
    for pos in state.positions:
        if type(pos) is int:
            if pos < reached:
                continue
            order: tuple[int, ...] = (pos,)
        else:
            order = position_order(pos)
            if order[0] < reached:
                continue
        if first is None or order < first:
            first, found = order, pos
    return None if found is None else state.positions[found]
