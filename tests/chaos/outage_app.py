"""The Celery app of the outage tests (``tests/dispatch/test_outages.py``): beat and a worker.

Environment: ``OUTAGE_BROKER`` (Redis URL, possibly through a TCP proxy), ``CELERY_DURABLE_URL``
(the journal, possibly through a TCP proxy), ``OUTAGE_RUN_LEASE`` (``durable_run_lease``).
Schedules are created by the test through the public API.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_durable import Durable, ScheduledRun

app = Celery("outage", broker=os.environ.get("OUTAGE_BROKER", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    worker_hijack_root_logger=False,
    beat_max_loop_interval=1,
    durable_leader_lease=3,
    durable_check_interval=5,
    durable_run_lease=float(os.environ.get("OUTAGE_RUN_LEASE", "10")),
    broker_transport_options={
        "visibility_timeout": 10,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
)
durable = Durable(app)


@app.task(name="outage.plain")
def plain(*args: object) -> None:
    return None


@durable.step(name="work")
def work(due: str) -> str:
    return due


@durable.task(name="outage.job")
def job(run: ScheduledRun) -> str:
    return work(run.due.isoformat())
