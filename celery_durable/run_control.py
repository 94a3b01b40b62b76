"""Talking to durable runs from outside (W4, W7): outcomes, results, cancel and signals.

Everything here reads the run's journal stream, never a Celery result backend. Writes are
appends at the version read, so a signal or a cancel request racing with the run's own events
is ordered by the journal: a signal appended after the run ended cannot exist.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from celery_durable.core.codec import check_json_value
from celery_durable.core.ids import run_stream
from celery_durable.core.journal import NewEvent
from celery_durable.core.outcomes import Outcome, raise_for
from celery_durable.core.run_aggregate import (
    FORMAT,
    RUN_CANCEL_REQUESTED,
    SIGNAL_RECEIVED,
    RunState,
    fold,
    parked_outcome,
)
from celery_durable.errors import DurableError, RunEnded
from celery_durable.message import Resend
from celery_durable.store.conflicts import retry_on_conflict
from celery_durable.store.runs import QUEUED

if TYPE_CHECKING:
    from celery_durable.runtime import Runtime


def _read(runtime: Runtime, run_id: str, state: RunState | None = None) -> RunState:
    state = state if state is not None else RunState()
    # A server that is away: the store raises JournalUnavailable (one line, password masked).
    return fold(runtime.journal.read_stream(run_stream(run_id), state.version), state)


def _sent(runtime: Runtime, run_id: str) -> bool:
    """Whether the run's message was sent and no worker has taken it yet: its row is
    ``queued`` (a child whose start its parent stored, W10, or a run the dispatcher sent).
    Such a run has started for its caller (``start_child`` returned its handle) though its
    own stream is still empty: it is waited for and can be cancelled (W7, W12)."""
    row = runtime.runs.row(run_id)
    return row is not None and row.get("status") == QUEUED


def outcome_of(state: RunState) -> Outcome | None:
    """The outcome recorded in ``state`` (a parked run counts as ``Faulted``, kind ``parked``)."""
    return state.outcome if state.outcome is not None else parked_outcome(state)


def outcome(runtime: Runtime, run_id: str, timeout: float | None = None) -> Outcome:
    """Wait for the run to end and return ``Finished``, ``Faulted`` or ``Cancelled`` (W7).

    ``timeout=None`` waits for ever. Raises ``TimeoutError`` when the time passes, and
    ``LookupError`` when by then the run has never started (nor been sent: a child whose
    start is stored counts as started).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    state = RunState()
    pause = 0.02
    while True:
        state = _read(runtime, run_id, state)
        found = outcome_of(state)
        if found is not None:
            return found
        if deadline is not None and time.monotonic() >= deadline:
            if not state.started and not _sent(runtime, run_id):
                raise LookupError(f"no durable run {run_id!r} has started")
            raise TimeoutError(f"run {run_id!r} did not end within {timeout:g} s")
        remaining = None if deadline is None else deadline - time.monotonic()
        time.sleep(max(0.0, min(pause, remaining if remaining is not None else pause)))
        pause = min(pause * 1.5, 0.5)


def result(runtime: Runtime, run_id: str, timeout: float | None = None) -> Any:
    """The value of a finished run; raises ``RunFaulted``/``RunCancelled`` (W7)."""
    return raise_for(run_id, outcome(runtime, run_id, timeout))


def run_ended(runtime: Runtime, run_id: str) -> str | None:
    """``finished``, ``faulted`` or ``cancelled`` once a durable run ended, else ``None``."""
    try:
        found = outcome(runtime, run_id, timeout=0)
    except (TimeoutError, LookupError):
        return None
    return type(found).__name__.lower()


def _append(runtime: Runtime, run_id: str, make: Any) -> tuple[RunState, bool]:
    """Append ``make(state)`` (a NewEvent or ``None``) at the version read; retry on conflict."""
    stream = run_stream(run_id)
    state = _read(runtime, run_id)

    def attempt() -> bool:
        new = make(state)
        if new is None:
            return False
        runtime.journal.append(stream, state.version, [new])
        return True

    def reread() -> None:
        _read(runtime, run_id, state)  # folds into ``state`` in place

    stored = retry_on_conflict(attempt, reread=reread, what=f"run {run_id!r}")
    return state, stored


def _wake(runtime: Runtime, state: RunState, run_id: str) -> None:
    message = state.message
    if message is None or not message.get("task"):
        return
    Resend.from_json(run_id, message["task"], message).send(runtime.app)


def signal(runtime: Runtime, run_id: str, name: str, payload: Any = None) -> None:
    """Store a signal for the run; a run waiting for ``name`` is sent again at once (W4).

    Signals sent before the run reaches its wait (even before it starts) are kept; waits
    consume them oldest first. Raises :class:`RunEnded` when the run has ended.
    """
    if not isinstance(name, str) or not name:
        raise TypeError("a signal name must be a non-empty str")
    check_json_value(
        payload, f"the payload of signal {name!r}", max_bytes=runtime.config.max_input_bytes,
        error=DurableError,
    )  # fmt: skip
    now = runtime.now()

    def make(state: RunState) -> NewEvent:
        if state.ended:
            raise RunEnded(
                f"run {run_id!r} has ended; it takes no signal ({name!r} refused)",
                run_id=run_id,
                signal=name,
            )
        from celery_durable.core.codec import time_to_json

        return NewEvent(
            type=SIGNAL_RECEIVED,
            data={"v": FORMAT, "name": name, "payload": payload, "sent_at": time_to_json(now)},
        )

    state, _ = _append(runtime, run_id, make)
    # The state is exact as of our append: had the run suspended after it, its suspension
    # would have conflicted with our signal and it would have seen the signal instead.
    if state.suspended and state.suspended_wait == name:
        _wake(runtime, state, run_id)


def cancel(runtime: Runtime, run_id: str) -> bool:
    """Ask the run to stop (W7): the body sees ``StepFailed`` (kind ``cancelled``) at the
    next step it reaches, may run cleanup steps, and ends ``Cancelled`` unless it returns.

    Returns ``False`` when the run had ended already or a cancel was already requested.
    Raises ``LookupError`` for a run that never started. A run sent but not yet taken by a
    worker (a child whose start its parent stored) takes the request too: it then ends
    cancelled without running its body (W12), and a parent waiting for it sees kind
    ``cancelled``.
    """
    sent: list[bool] = []

    def make(state: RunState) -> NewEvent | None:
        if not state.started:
            if not sent:
                sent.append(_sent(runtime, run_id))
            if not sent[0]:
                raise LookupError(f"no durable run {run_id!r} has started")
        if state.ended or state.cancel_requested:
            return None
        return NewEvent(type=RUN_CANCEL_REQUESTED, data={"v": FORMAT})

    state, stored = _append(runtime, run_id, make)
    if stored and state.suspended:
        _wake(runtime, state, run_id)
    return stored
