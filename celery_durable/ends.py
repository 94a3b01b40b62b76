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

from celery_durable.ids import parse_due
from celery_durable.schedule import MarkEnded

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
    if request is None or not getattr(request, "durable_track_end", False):
        return
    outcome = _TERMINAL.get(str(state))
    if outcome is None:
        return
    from celery_durable.durable import Durable

    durable = Durable.for_app(task.app)
    if getattr(task, "__durable__", False):
        outcome = durable.run_ended(str(task_id))
        if outcome is None:
            return  # suspended (sleep, retry wait, signal): the run goes on
    schedule_id = getattr(request, "durable_schedule", None)
    due_text = getattr(request, "durable_due", None)
    if not schedule_id or not due_text:
        return
    try:
        due = parse_due(due_text)
        durable._store.execute(
            schedule_id, lambda now: MarkEnded(due=due, outcome=str(outcome), now=now)
        )
    except Exception:  # never fail the task because the end could not be recorded
        log.exception("could not record the end of run %r of schedule %r", task_id, schedule_id)
