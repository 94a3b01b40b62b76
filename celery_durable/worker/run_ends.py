"""Worker side of the overlap policies: tell the schedule when a tracked run ends (D7).

The dispatcher marks a run's message with the header ``durable_track_end`` when the
schedule's overlap policy is not ``ALLOW``. After such a task has run, a ``task_postrun``
handler appends ``RunEnded`` to the schedule's stream. A retry is not an end; a durable task
ends when its journal says so (a sleep or a retry gives the worker back without ending).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals

from celery_durable.control import run_ended
from celery_durable.core.ids import parse_due
from celery_durable.core.schedule_aggregate import MarkEnded
from celery_durable.message import DUE_HEADER, SCHEDULE_HEADER, TRACK_END_HEADER
from celery_durable.runtime import Runtime
from celery_durable.schedules import ScheduleStore

log = logging.getLogger("celery_durable.ends")

_TERMINAL = {"SUCCESS": "finished", "FAILURE": "faulted", "REVOKED": "cancelled"}


def install() -> None:
    """Connect the handler once per process (idempotent)."""
    signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="celery_durable.ends")


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
        log.exception("could not record the end of run %s of schedule %s", task_id, schedule_id)
