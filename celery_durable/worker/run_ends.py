"""Worker side of the schedule policies: tracked ends (D7), missed start deadlines (P1) and
durable runs that cannot start (D5: a secret input the worker cannot read, P5).

The dispatcher marks a run's message with the header ``durable_track_end`` when the
schedule's overlap policy is not ``ALLOW``. After such a task has run, a ``task_postrun``
handler appends ``RunEnded`` to the schedule's stream. A retry is not an end; a durable task
ends when its journal says so (a sleep or a retry gives the worker back without ending).

A run with a start deadline carries Celery's ``expires`` header set to it. A worker that
receives the message later discards it without running it (Celery's own expiry) and a
``task_revoked`` handler records ``RunMissed`` with the reason, so every due time is accounted
for. (The expiry is a header, not a RabbitMQ per-message TTL: a broker dropping the message
silently would leave the run unaccounted for.)
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from celery import signals

from celery_durable.core.codec import time_to_json
from celery_durable.core.ids import parse_due
from celery_durable.core.schedule_aggregate import MarkEnded, MarkFailedToStart, MarkMissed
from celery_durable.message import DEADLINE_HEADER, DUE_HEADER, SCHEDULE_HEADER, TRACK_END_HEADER
from celery_durable.run_control import run_ended
from celery_durable.runtime import Runtime
from celery_durable.schedules import ScheduleStore
from celery_durable.store.runs import FAILED_TO_START

log = logging.getLogger("celery_durable.ends")

_TERMINAL = {"SUCCESS": "finished", "FAILURE": "faulted", "REVOKED": "cancelled"}


def install() -> None:
    """Connect the handler once per process (idempotent)."""
    signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="celery_durable.ends")
    signals.task_revoked.connect(
        _on_revoked, weak=False, dispatch_uid="celery_durable.ends.revoked"
    )


MISSED_IN_QUEUE = "start deadline passed while the message waited for a worker"
"""Reason recorded for a plain run whose message expired before a worker took it (P1)."""

MISSED_LATE_DELIVERY = "start deadline passed before a worker began the durable run"
"""Reason recorded for a durable run delivered after its deadline without having started."""


def _on_revoked(sender: Any = None, request: Any = None, expired: bool = False, **_: Any) -> None:
    if not expired or request is None or sender is None:
        return
    if not header(request, DEADLINE_HEADER):
        return  # a user's own ``expires``: not a start deadline
    record_missed(Runtime.for_app(sender.app), sender, request, MISSED_IN_QUEUE)


def header(request: Any, name: str) -> Any:
    """A message header of a task request: an attribute in a worker (protocol 2 merges the
    headers into the request), in ``request.headers`` for ``apply()``."""
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value


def past_deadline(request: Any, now: datetime) -> bool:
    """Whether a delivery carries a start deadline (P1) that has passed."""
    text = header(request, DEADLINE_HEADER)
    return bool(text) and now >= parse_due(str(text))


def record_missed(runtime: Runtime, task: Any, request: Any, reason: str) -> bool:
    """Record that a sent run never started before its deadline (P1); never raises.

    A durable run's row is ended first; when the run had started (or ended) already nothing is
    recorded. Returns whether the miss was recorded.
    """
    schedule_id = header(request, SCHEDULE_HEADER)
    due_text = header(request, DUE_HEADER)
    run_id = str(getattr(request, "id", "") or "")
    if not schedule_id or not due_text:
        return False
    try:
        due = parse_due(due_text)
        if getattr(task, "__durable__", False) and not runtime.runs.mark_missed(
            run_id, task.name, runtime.now()
        ):
            return False
        ScheduleStore(runtime).execute(
            schedule_id,
            lambda now: MarkMissed(due=due, reason=reason, now=now, sent=True),
        )
    except Exception:  # the worker goes on; the run simply stays "started" in the journal
        log.exception("could not record the missed run %s of schedule %s", run_id, schedule_id)
        return False
    return True  # logged and signalled by the store (``signals.run_deadline_missed``)


def record_failed_to_start(runtime: Runtime, task: Any, request: Any, error: str) -> bool:
    """D5, P5: a durable run whose start the worker refuses (a secret input it cannot read)
    is recorded as failed to start — its row ended, and ``RunFailedToStart`` on its schedule
    when the message names one — and logged once with schedule, due time, task and the error
    (which names the reference, never a value). Never raises; returns whether this call
    recorded it (a second delivery of the message finds it recorded, and is silent).
    """
    schedule_id = header(request, SCHEDULE_HEADER)
    due_text = header(request, DUE_HEADER)
    run_id = str(getattr(request, "id", "") or "")
    due = None
    try:
        if not runtime.runs.mark_unstarted(run_id, task.name, runtime.now(), FAILED_TO_START):
            return False
        if schedule_id and due_text:
            due = parse_due(due_text)
            runtime_due = due
            ScheduleStore(runtime).execute(
                schedule_id,
                lambda now: MarkFailedToStart(due=runtime_due, error=error, now=now, sent=True),
            )
    except Exception:  # the worker goes on; the run stays "queued" and is sent again (D8)
        log.exception("could not record that run %s cannot start", run_id)
        return False
    log.error(
        "run %r of schedule %r (due %s, task %r) can never start: %s",
        run_id, schedule_id, "-" if due is None else time_to_json(due), task.name, error,
        extra={"schedule": schedule_id, "run_id": run_id, "due": due, "task": task.name},
    )  # fmt: skip
    return True


def _on_postrun(
    sender: Any = None,
    task_id: str | None = None,
    task: Any = None,
    state: str | None = None,
    **_: Any,
) -> None:
    request = getattr(task, "request", None)
    if request is None or not getattr(request, TRACK_END_HEADER, False):
        return
    outcome = _TERMINAL.get(str(state))
    if outcome is None:
        return
    runtime = Runtime.for_app(task.app)
    if getattr(task, "__durable__", False):
        outcome = run_ended(runtime, str(task_id))
        if outcome is None:
            return  # suspended (sleep, retry wait, signal): the run goes on
    schedule_id = getattr(request, SCHEDULE_HEADER, None)
    due_text = getattr(request, DUE_HEADER, None)
    if not schedule_id or not due_text:
        return
    try:
        due = parse_due(due_text)
        ScheduleStore(runtime).execute(
            schedule_id, lambda now: MarkEnded(due=due, outcome=str(outcome), now=now)
        )
    except Exception:  # never fail the task because the end could not be recorded
        log.exception("could not record the end of run %r of schedule %r", task_id, schedule_id)
