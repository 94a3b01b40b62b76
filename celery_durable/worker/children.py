"""Child runs (W10-W13): a durable run starts other durable runs and waits for them durably.

A child's start is a position of the parent: ``ChildStarted`` is appended to the parent's
stream together with the child's row in the run table (one transaction), and only then is the
child's message sent, with the child's run ID as task id and the parent's run ID in the
:data:`~celery_durable.message.PARENT_HEADER`. A parent restarted after that commit finds the
start stored and does not start anything again. If the delivery that stored a start wrote
nothing after it (it died between the commit and the send: ``RunState.unsent``), the parent's
next delivery sends again each such child that no worker has claimed yet (a second message of
a run does nothing: W1), so no beat is needed for that; a message lost later (a broker that
drops it) is sent again by the dispatcher's stale-run re-send (D8).

Waiting gives the worker back as a durable sleep does (W4): the parent stores ``RunSuspended``
(reason ``child``). Who wakes it: the child's worker. The unit of work that stores the child's
outcome also marks the suspended parent's row woken, and that child sends the parent's message
again once it is stored (so a parent resumes without beat); children ending after it find the
mark and send nothing, until the parent suspends again (one delivery of the parent sees many
ends). A wake-up lost on the way is covered by the parent's row, which asks the dispatcher to
send the parent again one run lease later (``durable_run_lease``). After storing its
suspension the parent looks at its children once more, so a child that ended in between (and
found the parent's row not suspended) is not missed: the parent wakes itself the same way.
A worker process keeps the state of a parent it suspended (:mod:`.parent_states`), so that the
parent's next delivery reads only the events stored since.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from contextlib import nullcontext
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from celery.canvas import Signature

from celery_durable.core.branches import position_order
from celery_durable.core.children import (
    CHILD,
    CHILD_ENDED,
    CHILD_STARTED,
    CHILD_WAIT,
    CHILDREN,
    FAN_OUT_STARTED,
    MAX_RUN_ID_LENGTH,
    ChildHandle,
    FanOut,
    child_error,
    child_position,
    child_run_id,
    outcome_json,
)
from celery_durable.core.codec import check_json_value
from celery_durable.core.ids import printable, run_stream
from celery_durable.core.journal import NewEvent
from celery_durable.core.outcomes import Outcome
from celery_durable.core.run_aggregate import (
    FORMAT,
    RUN_CANCEL_REQUESTED,
    RUN_CANCELLED,
    RUN_FAULTED,
    RUN_FINISHED,
    RUN_PARKED,
    STEP_COMPLETED,
    STEP_FAILED,
    PositionId,
    RunState,
    fold,
    parked_outcome,
)
from celery_durable.errors import DurableError, StepFailed
from celery_durable.fast_publish import send_resends
from celery_durable.message import FIRST_SEND_HEADER, PARENT_HEADER, Resend
from celery_durable.store.conflicts import retry_on_conflict
from celery_durable.store.runs import QUEUED, SUSPENDED
from celery_durable.worker.context import Changed, RunContext, WaitFor, current_run
from celery_durable.worker.parent_states import parent_states
from celery_durable.worker.steps import cancelled, step_failed
from celery_durable.worker.traced import traced

if TYPE_CHECKING:
    from celery_durable.runtime import Runtime

log = logging.getLogger("celery_durable.runs")

CHILD_SEND_BATCH = 200
"""Children's messages buffered at most before the transport sends them (Redis pipeline)."""

ENDINGS = (RUN_FINISHED, RUN_FAULTED, RUN_CANCELLED, RUN_PARKED)
"""The events that end a run (or park it): what a parent reads of its children (W11)."""

__all__ = [
    "ChildHandle",
    "child_states",
    "map_children",
    "start_child",
    "wait_child",
    "wake_parent",
]


# -- checks (before anything is stored) ----------------------------------------------------


def _parent_run(what: str) -> RunContext:
    run = current_run()
    if run is None or run.in_step:
        raise DurableError(
            f"{what}() can only be called inside a durable task's body (not outside a durable "
            "run, and not inside a step)"
        )
    if run.inline_waits:
        # A branch cannot give the worker back while it waits (W9), and waiting for a child
        # is exactly that: refused, as a long durable sleep in a branch is.
        raise DurableError(
            f"{what}() cannot be called inside a parallel branch of run {run.run_id!r}: "
            "start children from the body itself (map_children fans out across workers)"
        )
    if run.eager and run.runtime.app.conf.task_always_eager:
        # A child is a message for a worker (W10): with task_always_eager no worker takes
        # it, and the parent, run inline, would wait for it for ever.
        raise DurableError(
            f"{what}() needs a worker to run the child, and task_always_eager runs run "
            f"{run.run_id!r} inline with none: in tests, run parents and children with "
            "celery_durable.testing.DurableHarness (its worker runs both)"
        )
    return run


def _durable_task(runtime: Runtime, task: Any, what: str) -> str:
    """The name of ``task``, checked to be a registered durable task of this app.

    A signature is refused: its name would be taken and its arguments and options dropped
    (the child's arguments are given to the call itself)."""
    if isinstance(task, Signature):
        raise TypeError(
            f"{what}() takes a durable task or its name, not a signature "
            f"({task.task!r}): give the child's arguments to {what}() itself"
        )
    name = runtime.task_name(task)
    runtime.require_task(name)  # UnknownTask (A7)
    if not runtime.is_durable(name):
        raise TypeError(
            f"{what}() needs a durable task (made with @durable.task); {name!r} is a plain "
            "Celery task"
        )
    return name


def _check_input(runtime: Runtime, args: Any, kwargs: Any, what: str) -> None:
    limit = runtime.config.max_input_bytes
    check_json_value(list(args), f"the arguments of {what}", max_bytes=limit, error=DurableError)
    check_json_value(
        dict(kwargs), f"the keyword arguments of {what}", max_bytes=limit, error=DurableError
    )


def _check_call(runtime: Runtime, name: str, args: Any, kwargs: Any, what: str) -> None:
    """Refuse arguments the child's task cannot take, as its ``apply_async`` would
    (``task.__header__``; not checked when the task has ``typing=False``).

    Checked at every delivery, before the call takes a position, whatever the journal holds
    (as the JSON check): a refused call takes no position, so a check skipped on replay
    because a later call's start is stored there would shift every later position."""
    task = runtime.app.tasks.get(name)
    header = getattr(task, "__header__", None)
    if header is None or getattr(task, "typing", True) is False:
        return
    try:
        header(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{what} cannot be called with these arguments: {exc}") from None


def _line_position(run: RunContext, position: PositionId, what: str) -> int:
    """The parent's position of a child start: always on the body's line (children are
    refused inside branches, see :func:`_parent_run`)."""
    if not isinstance(position, int):
        raise DurableError(
            f"{what}() at position {position} of run {run.run_id!r}: child runs start from the "
            "body's own line, not from inside a parallel branch"
        )
    return position


def _check_run_id(rid: str, what: str) -> None:
    """Refuse a child run ID the journal cannot hold (its stream ``run/<run ID>`` must fit
    the 255-character stream column), before anything is stored."""
    if len(rid) > MAX_RUN_ID_LENGTH:
        shown = printable(rid if len(rid) <= 80 else f"{rid[:40]}…{rid[-30:]}")
        raise DurableError(
            f"{what}(): the child run ID {shown!r} would have {len(rid)} characters; a run ID "
            f"has at most {MAX_RUN_ID_LENGTH} (the journal's stream column holds 255 with "
            "'run/'): give the parent a shorter run ID or nest fewer levels of children"
        )


# -- starting --------------------------------------------------------------------------------


def _resend(run: RunContext, child: str, task: str, args: Any, kwargs: Any) -> Resend:
    return Resend(
        run_id=child,
        task=task,
        args=list(args),
        kwargs=dict(kwargs),
        headers={PARENT_HEADER: run.run_id, FIRST_SEND_HEADER: True},
    )


def _store_starts(run: RunContext, events: list[NewEvent], sends: list[Resend]) -> None:
    """Append ``events`` with the children's rows in one unit of work, then send them."""
    run.append(events, sent=sends)
    run.runtime.fault("after-child-start")  # crash tests: the starts are stored, not yet sent
    _send(run.runtime, sends)


def _send(runtime: Runtime, sends: list[Resend]) -> None:
    """Send children's first messages on one producer, in one batch where the transport has
    them (Redis: one round trip per ``CHILD_SEND_BATCH`` messages), each but the first of a
    shape built from the message Celery built for that first (``fast_publish.send_resends``,
    W11, measured 2026-12-06). A child's result is its journal's (its parent reads it there,
    as ``durable.result`` does): Celery's result backend is not written for it
    (``ignore_result``, which Celery keeps on the run's later messages)."""
    if not sends:
        return
    app = runtime.app
    try:
        with app.producer_or_acquire() as producer:
            batch = getattr(producer, "batch", None)
            with batch(max_size=CHILD_SEND_BATCH) if batch is not None else nullcontext():
                send_resends(app, producer, sends, ignore_result=True)
    except Exception as exc:
        # The rows say these children were sent: the stale-run re-send (D8) sends them, and
        # the parent's next delivery sends those no worker has claimed (_send_unsent).
        log.warning(
            "could not send %d child run(s) (%s: %s); the dispatcher sends them again",
            len(sends), type(exc).__name__, exc,
        )  # fmt: skip


def _send_unsent(run: RunContext, children: list[str]) -> None:
    """Send again those of ``children`` whose start the delivery that stored it may not have
    sent (it wrote nothing after the start: it died between the commit and the send) and that
    no worker has claimed (their row is still ``queued``). A second message of a run does
    nothing (W1), so a parent resumes a lost start without the dispatcher. The replay check
    (a context that ``sends`` nothing) skips this."""
    if not getattr(run, "sends", True) or not run.state.unsent:
        return
    waiting = set(run.state.unsent)
    maybe_lost = [rid for rid in children if rid in waiting]
    if not maybe_lost:
        return
    resends = run.runtime.runs.queued(maybe_lost)
    if resends:
        log.info(
            "run %r: sending again %d child run(s) whose start may not have been sent",
            run.run_id, len(resends), extra={"run_id": run.run_id},
        )  # fmt: skip
        _send(run.runtime, resends)


def _task_name(_runtime: Any, task: Any, *_: Any, **__: Any) -> str:
    """The name a child-run span carries: the child's task."""
    return str(getattr(task, "name", task))


def _child_at(run: RunContext, _runtime: Any, handle: Any) -> tuple[Any, Any]:
    """The position and record of the child ``wait_child`` waits for (its span's place)."""
    position = child_position(run.run_id, getattr(handle, "run_id", ""))
    return position, None if position is None else run.state.positions.get(position)


@traced(CHILD, name=_task_name)
def start_child(
    runtime: Runtime, task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> ChildHandle:
    """Start ``task(*args, **kwargs)`` as a child run; return its handle once the start is
    stored (W10). Replay returns the same handle without starting anything."""
    run = _parent_run("start_child")
    name = _durable_task(runtime, task, "start_child")
    _check_input(runtime, args, kwargs, f"child task {name!r}")
    _check_call(runtime, name, args, kwargs, f"child task {name!r}")
    upcoming = _line_position(run, run.peek()[0], "start_child")
    _check_run_id(child_run_id(run.run_id, upcoming), "start_child")
    position, record = run.reach(name, CHILD)
    rid = child_run_id(run.run_id, _line_position(run, position, "start_child"))
    if record is not None:
        _send_unsent(run, [rid])
        return ChildHandle(rid)
    if run.state.cancel_pending:
        raise cancelled(run, position, name, CHILD)
    started = run.event(CHILD_STARTED, position, name=name, kind=CHILD, child=rid)
    _store_starts(run, [started], [_resend(run, rid, name, args, kwargs)])
    return ChildHandle(rid)


@traced(CHILD, at=_child_at)
def wait_child(runtime: Runtime, handle: ChildHandle) -> Any:
    """The result of a child started by this run, waiting for it durably (W10).

    A faulted child raises ``StepFailed`` (kind ``child``, the child's error inside); a
    cancelled one ``StepFailed`` (kind ``cancelled``). A cancel of the waiting parent cancels
    the child (W12).
    """
    run = _parent_run("wait_child")
    if not isinstance(handle, ChildHandle):
        raise TypeError(f"wait_child() takes a ChildHandle, not {type(handle).__name__}")
    position = child_position(run.run_id, handle.run_id)
    record = None if position is None else run.state.positions.get(position)
    if position is None or record is None or record.kind != CHILD:
        raise DurableError(
            f"run {handle.run_id!r} is not a child started by run {run.run_id!r} (W10)"
        )
    while True:
        if record.status == "completed":
            return record.result
        if record.status == "failed":
            raise step_failed(run.run_id, position, record.name, record.error or {}, 0)
        if run.state.cancel_pending:
            _cancel(run, [handle.run_id])
            raise cancelled(run, position, record.name, CHILD)
        found = _outcomes(runtime, [handle.run_id])
        if found:
            data = outcome_json(found[handle.run_id])
            try:
                run.append(
                    [
                        run.event(
                            CHILD_ENDED, position, name=record.name, kind=CHILD,
                            child=handle.run_id, outcome=data,
                        )
                    ]
                )  # fmt: skip
            except Changed:  # pragma: no cover - append without abort_if never raises it
                continue
            continue
        _suspend(run, [handle.run_id])


def child(runtime: Runtime, task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Start ``task`` as a child run and return its result (W10)."""
    return wait_child(runtime, start_child(runtime, task, args, kwargs))


@traced(CHILDREN, name=_task_name)
def map_children(runtime: Runtime, task: Any, inputs: Iterable[Any], at_most: int) -> list[Any]:
    """One child run of ``task`` per input (``task(input)``), at most ``at_most`` started and
    not ended at a time; the results in input order (W11)."""
    if isinstance(at_most, bool) or not isinstance(at_most, int):
        raise TypeError(f"at_most must be an int, not {type(at_most).__name__}")
    if at_most < 1:
        raise ValueError(f"at_most must be at least 1, not {at_most}")
    run = _parent_run("map_children")
    name = _durable_task(runtime, task, "map_children")
    if isinstance(inputs, str | bytes):
        raise TypeError("map_children() takes an iterable of inputs, not a single str")
    items = list(inputs)
    if items:  # every child is called task(input): one input's call says it for all
        _check_call(runtime, name, (items[0],), {}, f"each input of map_children({name!r})")
    upcoming = _line_position(run, run.peek()[0], "map_children")
    _check_run_id(child_run_id(run.run_id, upcoming, max(len(items) - 1, 0)), "map_children")
    position, record = run.reach(name, CHILDREN)
    if record is None:
        # Every input is checked before anything is stored; a later delivery checks only the
        # inputs it starts (the fan-out is stored: its inputs were checked then).
        _check_inputs(runtime, name, items, range(len(items)))
        if run.state.cancel_pending:
            raise cancelled(run, position, name, CHILDREN)
        if not items:
            run.append([run.event(STEP_COMPLETED, position, name=name, kind=CHILDREN, result=[])])
            return []
        run.append(
            [
                run.event(
                    FAN_OUT_STARTED, position, name=name, kind=CHILDREN,
                    total=len(items), at_most=at_most,
                )
            ]
        )  # fmt: skip
        record = run.state.positions[position]
    line = _line_position(run, position, "map_children")
    first_pass = True
    while True:
        if record.status == "completed":
            # A copy: the children's outcomes stay as stored for the next delivery's replay
            # (.parent_states), whatever the body does with the list it gets.
            return copy.deepcopy(list(record.result))
        if record.status == "failed":
            raise step_failed(run.run_id, position, name, record.error or {}, 0)
        fan = record.fanout
        if fan is None or fan.total != len(items):
            raise DurableError(
                f"map_children({name!r}) at position {position} of run {run.run_id!r} was "
                f"started with {fan.total if fan else 0} inputs; the body now gives {len(items)}"
            )
        if first_pass:
            _send_unsent(run, [rid for _, rid in fan.in_flight()])
            first_pass = False
        if _fan_out_once(run, line, name, fan, items):
            return copy.deepcopy(fan.results())


def _check_inputs(runtime: Runtime, name: str, items: list[Any], indices: range) -> None:
    for i in indices:
        _check_input(runtime, (items[i],), {}, f"input {i} of map_children({name!r})")


def _fan_out_once(run: RunContext, position: int, name: str, fan: FanOut, items: list[Any]) -> bool:
    """Record the children that ended, start the next ones; ``True`` once all finished.
    Raises ``StepFailed`` for a failed child or a cancel, ``Suspend`` to wait.

    What the journal already says comes first: every child ended (a cancel that arrives
    afterwards finds the position done, W7), or a child's failure recorded by a delivery that
    died before storing the step's failure."""
    runtime = run.runtime
    if fan.done() and fan.first_failure() is None:
        return True
    recorded = fan.first_failure()
    if recorded is not None:
        _index, rid, data = recorded
        _cancel(run, [r for _, r in fan.in_flight()])
        raise _failed(run, position, name, rid, child_error(rid, data))
    flying = fan.in_flight()
    if run.state.cancel_pending:
        _cancel(run, [rid for _, rid in flying])
        raise cancelled(run, position, name, CHILDREN)
    found = _outcomes(runtime, [rid for _, rid in flying]) if flying else {}
    events: list[NewEvent] = []
    failed: tuple[str, dict[str, Any]] | None = None
    for index, rid in flying:
        outcome = found.get(rid)
        if outcome is None:
            continue
        data = outcome_json(outcome)
        events.append(
            run.event(
                CHILD_ENDED, position, name=name, kind=CHILDREN, child=rid, index=index,
                outcome=data,
            )
        )  # fmt: skip
        if failed is None and data["state"] != "finished":
            failed = (rid, data)
    if failed is not None:
        run.append(events)
        rid, data = failed
        # No more children start; the ones still running are no longer waited for.
        _cancel(run, [r for _, r in fan.in_flight()])
        error = child_error(rid, data)
        raise _failed(run, position, name, rid, error)
    sends: list[Resend] = []
    ended_after = len(fan.ended) + len(events)
    room = fan.at_most - (len(fan.started) - ended_after)
    first = len(fan.started)
    starting = range(first, min(fan.total, first + max(0, room)))
    _check_inputs(runtime, name, items, starting)
    for index in starting:
        rid = child_run_id(run.run_id, position, index)
        events.append(
            run.event(CHILD_STARTED, position, name=name, kind=CHILDREN, child=rid, index=index)
        )
        sends.append(_resend(run, rid, name, (items[index],), {}))
    if events:
        _store_starts(run, events, sends)
    if fan.done():
        return True
    # (a child that ended since the look above is seen by _suspend's own look afterwards)
    flying = fan.in_flight()
    _suspend(run, [rid for _, rid in flying], wake_after(len(flying), fan.total - len(fan.started)))
    return False


def _failed(
    run: RunContext, position: int, name: str, child: str, error: dict[str, Any]
) -> StepFailed:
    run.append(
        [
            run.event(
                STEP_FAILED, position, name=name, kind=CHILDREN, attempts=0, child=child, **error
            )
        ]
    )
    return step_failed(run.run_id, position, name, error, 0)


# -- waiting ---------------------------------------------------------------------------------


def _suspend(run: RunContext, children: list[str], wake_after: int = 1) -> None:
    """Give the worker back until ``wake_after`` of ``children`` end (or one fails); raises
    ``Suspend`` (or returns when a cancel request arrived meanwhile, so that the caller looks
    again and raises ``StepFailed``)."""
    runtime = run.runtime
    safety = run.now() + timedelta(seconds=runtime.config.run_lease)
    waiting = WaitFor(children=tuple(children), wake_after=max(1, min(wake_after, len(children))))
    try:
        suspend = run.suspend(None, CHILD_WAIT, wake_at=safety, wait_for=waiting)
    except Changed:
        return  # a cancel request arrived: the caller sees it
    pristine = getattr(run, "pristine", None)
    last = run.last_stored
    if pristine is not None and last is not None and pristine.version == run.state.version:
        # The next delivery (in this process, most likely) reads only what comes after.
        parent_states(runtime).keep(run.run_id, pristine, last)
    # Children that ended between our look and the suspension found the parent's row not
    # suspended and counted nothing: the suspension's own look at them woke the parent.
    woke = run.woke_self
    if woke is not None:
        Resend.from_json(woke.run_id, woke.task, woke.to_json()).send(runtime.app)
    raise suspend


def wake_after(in_flight: int, left_to_start: int) -> int:
    """How many of the ``in_flight`` children must end before a fan-out's parent is sent
    again (W11): all of them once no input is left to start; otherwise a quarter of them, so
    that at least three quarters of ``at_most`` stay in flight while the parent sleeps, and a
    parent of a wide fan-out wakes once per batch of ends rather than once per end. A child
    that does not finish wakes the parent at once, whatever the count."""
    if left_to_start <= 0:
        return max(1, in_flight)
    return max(1, in_flight // 4)


def _outcomes(runtime: Runtime, children: list[str]) -> dict[str, Outcome]:
    """The outcomes of those of ``children`` that ended: their ending events, read in one
    query for all of them (only the runs that ended have one)."""
    ends = runtime.journal.read_streams([run_stream(rid) for rid in children], types=ENDINGS)
    found: dict[str, Outcome] = {}
    for rid in children:
        events = ends.get(run_stream(rid))
        if not events:
            continue
        state = fold(events)  # (only the ends: the outcome is all that is wanted)
        outcome = state.outcome if state.outcome is not None else parked_outcome(state)
        if outcome is not None:
            found[rid] = outcome
    return found


def _read(runtime: Runtime, run_id: str, state: RunState | None = None) -> RunState:
    events = runtime.journal.read_stream(run_stream(run_id), 0 if state is None else state.version)
    return fold(events, state)


# -- ends and cancellation ---------------------------------------------------------------------


def wake_parent(run: RunContext) -> None:
    """Called by a child's worker once the child's outcome is stored: send the parent again
    when it is waiting (a lost wake-up is covered by the parent's row, see the module doc).

    The unit of work that stored the child's end marked the parent's row woken when it was
    suspended and not marked yet (``wake=`` of :meth:`RunContext.append`): only that child
    sends the parent, the ones ending after it until the parent suspends again send nothing
    (the parent sees their ends on the delivery already sent, or, ending while it runs, just
    after its next suspension). When that unit did not look at the row (an end stored by the
    claim, or a commit whose reply was lost), the row is read and a suspended parent sent."""
    parent = run.state.parent
    if not parent:
        return
    runtime = run.runtime
    try:
        if run.wake_known:
            woke = run.woke
            if woke is not None:
                Resend.from_json(woke.run_id, woke.task, woke.to_json()).send(runtime.app)
            return
        row = runtime.runs.row(parent)
        if row is None or row.get("status") != SUSPENDED:
            return
        resend = runtime.runs.resend_of(parent)
        if resend is not None:
            resend.send(runtime.app)
    except Exception as exc:
        log.warning(
            "run %r: could not wake its parent %r (%s: %s); the dispatcher will",
            run.run_id, parent, type(exc).__name__, exc,
        )  # fmt: skip


def _cancel(run: RunContext, children: list[str]) -> None:
    """:func:`cancel_children` from a body; the replay check (which ``sends`` nothing) only
    replays, it cancels nothing."""
    if getattr(run, "sends", True):
        cancel_children(run.runtime, children)


def cancel_children(runtime: Runtime, children: list[str]) -> None:
    """Ask each child to stop (W12), also one whose start is stored but not yet run: it then
    ends cancelled without running its body. A suspended child is sent again to see it."""
    for rid in children:
        state = RunState()
        stream = run_stream(rid)

        def attempt(state: RunState = state, stream: str = stream) -> bool:
            if state.ended or state.cancel_requested:
                return False
            runtime.journal.append(
                stream, state.version, [NewEvent(type=RUN_CANCEL_REQUESTED, data={"v": FORMAT})]
            )
            return True

        def reread(state: RunState = state, rid: str = rid) -> None:
            _read(runtime, rid, state)

        _read(runtime, rid, state)
        try:
            stored = retry_on_conflict(attempt, reread=reread, what=f"run {rid!r}")
        except Exception as exc:
            log.warning("could not cancel child run %r: %s: %s", rid, type(exc).__name__, exc)
            continue
        if stored and state.suspended and state.message and state.message.get("task"):
            Resend.from_json(rid, state.message["task"], state.message).send(runtime.app)


def child_states(runtime: Runtime, run_id: str) -> list[tuple[str, str]]:
    """``(run ID, state)`` of every child the run started, in start order (W13). The state is
    the child's row status (``queued``, ``running``, ``suspended``, ``finished`` …)."""
    state = _read(runtime, run_id)
    if not state.started:
        row = runtime.runs.row(run_id)
        if row is None or row.get("status") != QUEUED:
            raise LookupError(f"no durable run {run_id!r} has started")
        return []  # sent (a child whose start is stored), not yet taken by a worker
    ids: list[str] = []
    for _pos, record in sorted(state.positions.items(), key=lambda i: position_order(i[0])):
        if record.child is not None:
            ids.append(record.child)
        elif record.fanout is not None:
            ids.extend(rid for _, rid in sorted(record.fanout.started.items()))
    rows = runtime.runs.statuses(ids)
    return [(rid, rows.get(rid, "queued")) for rid in ids]
