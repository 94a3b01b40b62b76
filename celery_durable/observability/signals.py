"""Signals a project can subscribe to, in Celery's style (``signal.connect(receiver)``).

They are sent by the process that stores the event, after it is stored. Receivers get keyword
arguments; a receiver that raises is logged and does not disturb the dispatcher.

- ``run_decided``: ``schedule``, ``run_id``, ``due``, ``lag`` (seconds from due to decision),
  ``reason`` (``rule``, ``backfill``, ``trigger``)
- ``run_started``: ``schedule``, ``run_id``, ``due``, ``lag`` (seconds from due to enqueue)
- ``run_skipped``: ``schedule``, ``run_id``, ``due``, ``reason`` (``overlap``, or ``blackout
  <name>`` for a due time or a send moment inside a blackout window, P4)
- ``run_failed_to_start``: ``schedule``, ``run_id``, ``due``, ``error``
- ``run_late``: ``schedule``, ``run_id``, ``due``, ``lateness`` (seconds from due to decision):
  a run the rule made due, decided more than ``durable_late_after`` after its due time (O4)
- ``runs_missed``: ``schedule``, ``count`` (``None`` when too many to count), ``through``,
  ``lateness`` (seconds from ``through`` to the decision): due times dropped by catch-up (O4)
- ``run_deadline_missed``: ``schedule``, ``run_id``, ``due``, ``reason`` (P1: a run that never
  started by its start deadline; sent by the dispatcher or by the worker that saw it late)
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from celery.utils.dispatch import Signal

from celery_durable.core.codec import time_to_json
from celery_durable.core.ids import run_id
from celery_durable.core.schedule_events import (
    RunDecided,
    RunDeferred,
    RunFailedToStart,
    RunMissed,
    RunSent,
    RunSkipped,
    RunsMissed,
)

if TYPE_CHECKING:
    from celery_durable.core.schedule_events import ScheduleEvent

log = logging.getLogger("celery_durable.dispatcher")

run_decided = Signal(
    name="durable_run_decided", providing_args={"schedule", "run_id", "due", "lag", "reason"}
)
run_started = Signal(
    name="durable_run_started", providing_args={"schedule", "run_id", "due", "lag"}
)
run_skipped = Signal(
    name="durable_run_skipped", providing_args={"schedule", "run_id", "due", "reason"}
)
run_failed_to_start = Signal(
    name="durable_run_failed_to_start", providing_args={"schedule", "run_id", "due", "error"}
)
run_late = Signal(name="durable_run_late", providing_args={"schedule", "run_id", "due", "lateness"})
runs_missed = Signal(
    name="durable_runs_missed", providing_args={"schedule", "count", "through", "lateness"}
)
run_deadline_missed = Signal(
    name="durable_run_deadline_missed", providing_args={"schedule", "run_id", "due", "reason"}
)


def announce(
    sender: object, sid: str, event: ScheduleEvent, *, late_after: float | None = None
) -> None:
    """Log a stored schedule event with structured fields and send its signal.

    With ``late_after`` (seconds), a run the rule made due and decided later than that is
    also logged as late and signalled (O4).
    """
    if isinstance(event, RunDecided):
        lag = (event.at - event.due).total_seconds()
        if late_after is not None and lag > late_after and event.reason == "rule":
            _late(sender, sid, event, lag)
        if not (run_decided.receivers or log.isEnabledFor(logging.INFO)):
            return  # nobody listens: a burst announces thousands of these
        fields = {"schedule": sid, "run_id": event.run_id, "due": event.due, "lag": lag}
        log.info(
            "decided run %r of schedule %r (due %s, lag %.3fs)",
            event.run_id, sid, time_to_json(event.due), lag, extra=fields,
        )  # fmt: skip
        run_decided.send(sender=sender, reason=event.reason, **fields)
    elif isinstance(event, RunSent):
        if not (run_started.receivers or log.isEnabledFor(logging.DEBUG)):
            return
        lag = (event.at - event.due).total_seconds()
        fields = {"schedule": sid, "run_id": run_id(sid, event.due), "due": event.due, "lag": lag}
        log.debug("enqueued run %r (lag %.3fs)", fields["run_id"], lag, extra=fields)
        run_started.send(sender=sender, **fields)
    elif isinstance(event, RunSkipped):
        fields = {"schedule": sid, "run_id": run_id(sid, event.due), "due": event.due}
        log.info("skipped run %r: %s", fields["run_id"], event.reason, extra=fields)
        run_skipped.send(sender=sender, reason=event.reason, **fields)
    elif isinstance(event, RunDeferred):
        fields = {"schedule": sid, "run_id": run_id(sid, event.due), "due": event.due}
        log.info(
            "run %r waits until %s: its send moment fell inside blackout %s",
            fields["run_id"], time_to_json(event.until), event.blackout, extra=fields,
        )  # fmt: skip
    elif isinstance(event, RunFailedToStart):
        fields = {"schedule": sid, "run_id": run_id(sid, event.due), "due": event.due}
        run_failed_to_start.send(sender=sender, error=event.error, **fields)
    elif isinstance(event, RunMissed):
        fields = {"schedule": sid, "run_id": run_id(sid, event.due), "due": event.due}
        log.warning("run %s missed its start deadline: %s", fields["run_id"], event.reason,
                    extra=fields)  # fmt: skip
        run_deadline_missed.send(sender=sender, reason=event.reason, **fields)
    elif isinstance(event, RunsMissed):
        log.info(
            "schedule %r: %s missed due time(s) up to %s dropped by its catch-up policy",
            sid, "many" if event.count is None else event.count, time_to_json(event.through),
            extra={"schedule": sid, "count": event.count},
        )  # fmt: skip
        lateness = max(0.0, (event.at - event.through).total_seconds())
        runs_missed.send(
            sender=sender, schedule=sid, count=event.count, through=event.through, lateness=lateness
        )


def _late(sender: object, sid: str, event: RunDecided, lateness: float) -> None:
    """O4: a run decided more than ``durable_late_after`` after its due time."""
    fields = {"schedule": sid, "run_id": event.run_id, "due": event.due, "lateness": lateness}
    log.warning(
        "run %r of schedule %r decided %.1fs after its due time %s (late)",
        event.run_id, sid, lateness, time_to_json(event.due), extra=fields,
    )  # fmt: skip
    run_late.send(sender=sender, **fields)


__all__ = [
    "announce",
    "run_deadline_missed",
    "run_decided",
    "run_failed_to_start",
    "run_late",
    "run_skipped",
    "run_started",
    "runs_missed",
]
