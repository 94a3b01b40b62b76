"""Claiming a durable run on delivery: read its stream once, decide, store the claim (W1, W8).

Every delivery of a durable task's message reads the run's stream once and decides, with the
pure :func:`~celery_durable.core.run_aggregate.on_delivery`, whether to return a stored outcome,
to leave the run to another delivery, to go back to sleep, or to claim the run and replay the
body. The claim is an event appended at the version read, with the run's row, in one unit of
work (:meth:`~.context.RunContext.write`): of two deliveries at once only one wins (W8); the
other finishes without running a step.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery_durable.core.codec import check_json_value
from celery_durable.core.ids import run_stream
from celery_durable.core.journal import NewEvent
from celery_durable.core.run_aggregate import (
    RUN_CANCELLED,
    RUN_STARTED,
    Busy,
    Ended,
    NotYet,
    Proceed,
    RunState,
    fold,
    on_delivery,
)
from celery_durable.errors import DurableError, JournalError, JournalUnavailable
from celery_durable.message import (
    DEADLINE_HEADER,
    FIRST_SEND_HEADER,
    PARENT_HEADER,
    message_json,
    unreadable_secret,
)
from celery_durable.secret_lookup import secret_lookup
from celery_durable.store.conflicts import retry_on_conflict
from celery_durable.store.runs import CANCELLED
from celery_durable.worker.context import RunContext, claim_row
from celery_durable.worker.owners import owner_alive
from celery_durable.worker.parent_states import read_state
from celery_durable.worker.run_ends import (
    MISSED_LATE_DELIVERY,
    past_deadline,
    record_failed_to_start,
    record_missed,
)

if TYPE_CHECKING:
    from celery_durable.runtime import Runtime

__all__ = ["DEFAULT_SHORT_SLEEP", "Later", "claimed", "short_sleep_limit"]

log = logging.getLogger("celery_durable.tasks")

DEFAULT_SHORT_SLEEP = 60.0
"""Default of ``durable_short_sleep``: longer waits are left to the dispatcher."""


def short_sleep_limit(app: Any) -> float:
    """Longest wait sent back by a broker countdown: ``durable_short_sleep`` (60 s), kept under
    half of Redis' visibility timeout, which would otherwise redeliver the waiting message."""
    limit = float(app.conf.get("durable_short_sleep") or DEFAULT_SHORT_SLEEP)
    options = app.conf.get("broker_transport_options") or {}
    visibility = options.get("visibility_timeout") if isinstance(options, Mapping) else None
    if visibility:
        limit = min(limit, float(visibility) / 2)
    return limit


class OwnedElsewhere(Exception):
    """Another live delivery owns the run (W8): this one does nothing and stores nothing."""


class Later(Exception):
    """Look at the run again at ``until`` (``None``: when a signal or a cancel comes)."""

    def __init__(self, until: datetime | None) -> None:
        super().__init__(until)
        self.until = until


def claimed(
    task: Any,
    run_id: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    eager: bool,
    owner: str,
) -> RunContext | None:
    """Read the run and store this delivery's claim: the claimed run (its state ``ended``
    when the run had ended already: nothing is stored then), or ``None`` when the run is not
    to start (past its start deadline, P1; a secret it cannot read, P5). Raises
    :class:`OwnedElsewhere` when another live delivery owns it (W8), :class:`Later` when the
    run is to be looked at again later."""
    runtime: Runtime = task.runtime
    journal = runtime.journal
    stream = run_stream(run_id)
    request = task.request
    if _first_send(request):
        # A child's first message: its stream is empty but for a rare second delivery, which
        # the claim's conflict finds (``reread`` below); one read fewer per child (W11).
        state, pristine = RunState(), None
    else:
        state, pristine = read_state(runtime, run_id)
    run = RunContext(
        runtime,
        run_id=run_id,
        task=task.name,
        owner=owner,
        state=state,
        short_sleep=short_sleep_limit(task.app),
        eager=eager,
    )
    run.pristine = pristine
    if not state.started and past_deadline(task.request, runtime.now()):
        # P1: a run that has not started by its start deadline never starts.
        record_missed(runtime, task, task.request, MISSED_LATE_DELIVERY)
        return None
    if not state.started:
        # P5, D5: every secret of the input is read before the body runs; one that cannot be
        # read fails the run's start (the body never sees a half-resolved input).
        unreadable = unreadable_secret(args, secret_lookup(task.app))
        if unreadable is not None:
            record_failed_to_start(runtime, task, task.request, f"SecretUnavailable: {unreadable}")
            return None

    def claim() -> tuple[bool, Ended | None]:
        """``(True, what to return)`` when this delivery is done, ``(False, None)`` once claimed."""
        now = runtime.now()
        decision = on_delivery(state, now, owner_alive, owner=owner)
        if isinstance(decision, Ended):
            log.info("run %r has ended already; returning its stored outcome", run_id)
            return True, decision
        if isinstance(decision, Busy):
            limit = run.short_sleep
            if (decision.until - now).total_seconds() <= limit:
                raise Later(decision.until)
            log.info(
                "run %r is owned by %s; this delivery does nothing (W8)", run_id, decision.owner
            )
            raise OwnedElsewhere(decision.owner)
        if isinstance(decision, NotYet):
            raise Later(decision.until)
        if not isinstance(decision, Proceed):
            raise DurableError(f"run {run_id!r}: unexpected delivery decision {decision!r}")
        _claim(run, task, args, kwargs, now)
        return False, None

    def reread() -> None:
        run.pristine = None  # (only this delivery's own events are folded into it)
        fold(journal.read_stream(stream, state.version), state)

    try:
        done, value = retry_on_conflict(claim, reread=reread, what=f"run {run_id!r}: claim")
    except JournalError:
        raise
    except DurableError as exc:
        # No claim stored, so nothing of the run ran: keep the message (W1).
        raise JournalUnavailable(str(exc)) from exc
    if isinstance(value, Ended):
        # A redelivery of a run that ended (W1): its state says so, and the caller returns
        # the stored outcome, after waking a child's parent (W10).
        return run
    return None if done else run


def _first_send(request: Any) -> bool:
    """Whether this delivery is of a child's first message, as its parent sent it
    (:data:`~celery_durable.message.FIRST_SEND_HEADER`, not a broker's redelivery, not
    carrying a start deadline to check against the stored start)."""
    if not getattr(request, FIRST_SEND_HEADER, None):
        return False
    if getattr(request, "retries", None):
        return False
    info = getattr(request, "delivery_info", None) or {}
    return not info.get("redelivered") and not getattr(request, DEADLINE_HEADER, None)


def _claim(run: RunContext, task: Any, args: Any, kwargs: Any, now: datetime) -> None:
    claim, until = run.claim_event(now)
    events: list[NewEvent] = []
    row = claim_row(run.owner, until)
    if not run.state.started:
        check_json_value(list(args), f"the arguments of run {run.run_id!r}", error=DurableError)
        check_json_value(
            dict(kwargs), f"the keyword arguments of run {run.run_id!r}", error=DurableError
        )
        message = message_json(args, kwargs, _options_of(task.request))
        parent = getattr(task.request, PARENT_HEADER, None)
        started: dict[str, Any] = {"task": task.name, **message}
        if isinstance(parent, str) and parent:
            started["parent"] = parent
        events.append(run.event(RUN_STARTED, **started))
        if "parent" in started:
            message["headers"] = {PARENT_HEADER: parent}
        row.update(task=task.name, message=message)
    events.append(claim)
    if not run.state.started and run.state.cancel_requested:
        # A child cancelled before it started (W12): it ends without running its body.
        events.append(run.event(RUN_CANCELLED))
        row.update(status=CANCELLED, owner=None, lease_until=None)
    run.stored(events, run.write(events, row, now))
    run.lease_until = until


def _options_of(request: Any) -> dict[str, Any]:
    """Routing kept for a re-send: the queue (routing key) and priority of this delivery."""
    info = getattr(request, "delivery_info", None) or {}
    options: dict[str, Any] = {}
    if info.get("routing_key"):
        options["queue"] = info["routing_key"]
    if info.get("priority") is not None:
        options["priority"] = info["priority"]
    return options
