"""A Celery project for end-to-end tests of the durable beat scheduler.

Configured from the environment: ``E2E_BROKER`` (Redis URL), ``CELERY_DURABLE_URL`` (journal),
``E2E_SINK`` (Redis URL of the list where tasks record what they received), ``E2E_BEAT``
(``every`` — one schedule every second; ``stock`` — a classic beat_schedule with crontab and
interval entries and plain tasks with arguments).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

import redis
from celery import Celery
from celery.schedules import crontab

from celery_durable import Durable

app = Celery("beat_app", broker=os.environ["E2E_BROKER"])
app.conf.update(
    timezone="Europe/Oslo",
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    beat_max_loop_interval=1,
    durable_leader_lease=float(os.environ.get("E2E_LEASE", "10")),
    durable_prune_interval=float(os.environ.get("E2E_PRUNE_INTERVAL", "300")),
)
if os.environ.get("E2E_PARTITIONS"):
    app.conf.durable_partitions = int(os.environ["E2E_PARTITIONS"])
durable = Durable(app)
_sink = redis.Redis.from_url(os.environ["E2E_SINK"])


@app.task(name="e2e.tick", bind=True)
def tick(self, *args: object, **kwargs: object) -> None:
    headers = {k: getattr(self.request, k, None) for k in ("durable_schedule", "durable_due")}
    _sink.rpush(
        "e2e:received",
        json.dumps({"id": self.request.id, "args": args, "kwargs": kwargs, "headers": headers}),
    )


if os.environ.get("E2E_BEAT") == "every":
    app.conf.beat_schedule = {
        "every-second": {
            "task": "e2e.tick",
            "schedule": 1.0,
            "args": ["s"],
            "options": {"catch_up": "all"},
        },
    }
elif os.environ.get("E2E_BEAT") == "stock":
    app.conf.beat_schedule = {
        "each-minute-cron": {"task": "e2e.tick", "schedule": crontab(), "args": ["cron", 1]},
        "interval-2s": {
            "task": "e2e.tick",
            "schedule": timedelta(seconds=2),
            "args": ("interval",),
            "kwargs": {"n": 2},
            "options": {"expires": 60},
        },
    }
elif os.environ.get("E2E_BEAT") == "many":
    # E2E_SCHEDULES entries of one second each, for the partition tests (D10).
    app.conf.beat_schedule = {
        f"many-{i:03d}": {
            "task": "e2e.tick",
            "schedule": 1.0,
            "options": {"catch_up": "all"},
        }
        for i in range(int(os.environ.get("E2E_SCHEDULES", "300")))
    }
