"""The folded states of parents waiting for children, kept by the worker process (W11).

A parent of a fan-out is sent again each time its children end, and each delivery used to
read and fold its whole stream: two events per child, so a fan-out of ``n`` children cost
``O(n²)`` events read. When a parent suspends to wait for its children, its delivery leaves a
folded state here; the next delivery of that run in the same process takes it and reads only
the events stored after it (the children's ends it has not seen and nothing else, usually).

The state kept is *pristine*: no body ever held its values. A body may change a value the
journal gave it (a step's result list it sorts, say); a later delivery must replay from the
stored values, not from those. So a delivery works on a copy (:func:`clone`, whose values are
copies, except the bookkeeping of a fan-out still waiting, which no body sees before it is
done), and the events the delivery stores are folded into the pristine state as copies of
their data (:meth:`~.context.RunContext.stored`). A state is taken by one delivery at a time
(taking removes it), and only trusted when the stream still holds, at the state's version, the
very event the suspending delivery stored last: a journal recreated under the same run ID is
read from the start.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from celery_durable.core.children import FanOut
from celery_durable.core.ids import run_stream
from celery_durable.core.journal import NewEvent
from celery_durable.core.run_aggregate import Position, RunState, fold

if TYPE_CHECKING:
    from celery_durable.runtime import Runtime

__all__ = ["ParentStates", "clone", "parent_states", "read_state"]

CACHED_RUNS = 8
"""How many waiting parents' states a worker process keeps (the least recently kept go)."""


class ParentStates:
    """Run ID → (pristine state, the last event it folded), at most :data:`CACHED_RUNS`."""

    def __init__(self, size: int = CACHED_RUNS) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._states: OrderedDict[str, tuple[RunState, str, dict[str, Any]]] = OrderedDict()

    def keep(self, run_id: str, state: RunState, last: NewEvent) -> None:
        """Keep ``state``, whose last folded event (at ``state.version``) is ``last``."""
        with self._lock:
            self._states.pop(run_id, None)
            self._states[run_id] = (state, last.type, copy.deepcopy(dict(last.data)))
            while len(self._states) > self.size:
                self._states.popitem(last=False)

    def take(self, run_id: str) -> tuple[RunState, str, dict[str, Any]] | None:
        with self._lock:
            return self._states.pop(run_id, None)

    def __len__(self) -> int:
        return len(self._states)


def parent_states(runtime: Runtime) -> ParentStates:
    """The cache of this runtime (one per runtime, so per journal)."""
    cache = runtime.__dict__.get("_parent_states")
    if cache is None:
        cache = runtime.__dict__.setdefault("_parent_states", ParentStates())
    return cache


def waiting_fan_out(state: RunState) -> bool:
    """Whether the run waits at a ``map_children`` position (a parent worth keeping)."""
    return any(
        record.fanout is not None and record.status == "waiting"
        for record in state.positions.values()
    )


def read_state(runtime: Runtime, run_id: str) -> tuple[RunState, RunState | None]:
    """The run's state folded from its stream, and a pristine copy of it when the run waits
    at a fan-out (``None`` otherwise). From a kept state and the events after it when this
    process kept one that still matches the stream, else from the start."""
    stream = run_stream(run_id)
    kept = parent_states(runtime).take(run_id)
    pristine: RunState | None = None
    if kept is not None:
        state, type_, data = kept
        if state.version > 0:
            events = runtime.journal.read_stream(stream, state.version - 1)
            first = events[0] if events else None
            if first is not None and (first.version, first.type, first.data) == (
                state.version,
                type_,
                data,
            ):
                pristine = fold(events[1:], state)
    if pristine is None:
        pristine = fold(runtime.journal.read_stream(stream))
        if not waiting_fan_out(pristine):
            return pristine, None
    return clone(pristine), pristine


def clone(state: RunState) -> RunState:
    """A copy of ``state`` a body may change: every value copied, except the bookkeeping of
    the fan-outs (those still waiting get new dicts, the children's outcomes in them shared:
    no body sees those before the fan-out is done; those done are shared whole; and
    ``map_children`` hands out copies of the results)."""
    positions: dict[Any, Position] = {}
    for pos, record in state.positions.items():
        fan = record.fanout
        if fan is not None and record.status == "waiting":
            twin = copy.copy(record)
            twin.fanout = FanOut(
                fan.total,
                fan.at_most,
                dict(fan.started),
                dict(fan.ended),
                set(fan.failed),
                dict(fan.flying),
            )
            positions[pos] = twin
        elif fan is not None and record.status == "completed":
            # A fan-out that is done is never changed again, and its results are handed
            # out as copies: shared, not copied on each delivery (10,000 outcomes, say).
            positions[pos] = copy.copy(record)
        else:
            positions[pos] = copy.deepcopy(record)
    twin_state = copy.copy(state)
    twin_state.positions = positions
    for name in ("message", "claim", "signals", "parked", "outcome", "branch_calls", "unsent"):
        setattr(twin_state, name, copy.deepcopy(getattr(state, name)))
    return twin_state
