"""Signals a project can subscribe to, in Celery's style (``signal.connect(receiver)``).

They are sent by the process that stores the event, after it is stored. Receivers get keyword
arguments; a receiver that raises is logged and does not disturb the dispatcher.

- ``run_decided``: ``schedule``, ``run_id``, ``due``, ``lag`` (seconds from due to decision),
  ``reason`` (``rule``, ``backfill``, ``trigger``)
- ``run_started``: ``schedule``, ``run_id``, ``due``, ``lag`` (seconds from due to enqueue)
- ``run_skipped``: ``schedule``, ``run_id``, ``due``, ``reason``
- ``run_failed_to_start``: ``schedule``, ``run_id``, ``due``, ``error``
- ``runs_missed``: ``schedule``, ``count`` (``None`` when too many to count), ``through``
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

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
runs_missed = Signal(name="durable_runs_missed", providing_args={"schedule", "count", "through"})

__all__ = ["run_decided", "run_failed_to_start", "run_skipped", "run_started", "runs_missed"]
