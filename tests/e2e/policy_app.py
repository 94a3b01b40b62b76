"""A Celery project for end-to-end tests of the timing policies (SPEC §5d: P1–P3).

Configured from the environment: ``E2E_BROKER`` (Redis or RabbitMQ URL), ``CELERY_DURABLE_URL``
(journal), ``E2E_SINK`` (Redis URL of the list ``e2e:ran`` where the task records its run ID
and the moment it began), ``E2E_QUEUE`` (the queue: unique per test on a shared vhost),
``E2E_LEASE`` (dispatcher lease seconds) and ``E2E_POLICY``:

* ``deadline`` — ``beat_schedule`` entry ``every-second`` (``schedule: 1.0``) with the option
  ``start_deadline: timedelta(seconds=5)``;
* ``durable-deadline`` — entry ``durable-every-second``: the durable task ``e2e.policy_durable``
  every second with ``start_deadline: 3`` (seconds);
* anything else — no ``beat_schedule``: the test creates schedules through the API.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import redis
from celery import Celery

from celery_durable import Durable, ScheduledRun, run_id

app = Celery("policy_app", broker=os.environ["E2E_BROKER"])
app.conf.update(
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    beat_max_loop_interval=1,
    durable_leader_lease=float(os.environ.get("E2E_LEASE", "10")),
    task_default_queue=os.environ.get("E2E_QUEUE", "celery"),
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
)
durable = Durable(app)
_sink = redis.Redis.from_url(os.environ["E2E_SINK"])


@app.task(name="e2e.policy_tick", bind=True)
def tick(self, *args: object, **kwargs: object) -> None:
    _sink.rpush("e2e:ran", json.dumps({"id": self.request.id, "at": time.time()}))


@durable.task(name="e2e.policy_durable")
def durable_tick(run: ScheduledRun) -> None:
    _sink.rpush("e2e:ran", json.dumps({"id": run_id(run.schedule, run.due), "at": time.time()}))


if os.environ.get("E2E_POLICY") == "durable-deadline":
    app.conf.beat_schedule = {
        "durable-every-second": {
            "task": "e2e.policy_durable",
            "schedule": 1.0,
            "options": {"start_deadline": 3},
        },
    }
if os.environ.get("E2E_POLICY") == "deadline":
    app.conf.beat_schedule = {
        "every-second": {
            "task": "e2e.policy_tick",
            "schedule": 1.0,
            "options": {"start_deadline": timedelta(seconds=5)},
        },
    }
