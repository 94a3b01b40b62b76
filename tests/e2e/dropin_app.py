"""A realistic project's ``beat_schedule``, run by stock beat and by ``-S durable`` (SPEC §5a).

Configured from the environment: ``E2E_BROKER`` (Redis or RabbitMQ URL), ``E2E_SINK`` (Redis
URL of the list where the worker records each message it runs), ``CELERY_DURABLE_URL`` (the
journal), ``E2E_ROLE`` (``worker`` registers the task that beat does not know), ``E2E_DROP``
(entry names left out of ``beat_schedule``, comma-separated: the removal test).

Every task records what it received, with its entry's name as first argument, so the test can
compare the messages of the two schedulers entry by entry.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from typing import Any

import redis
from celery import Celery
from celery.schedules import BaseSchedule, crontab, schedstate, schedule, solar
from kombu import Queue

from celery_durable import Durable

SETTINGS: dict[str, Any] = {
    "broker_url": os.environ["E2E_BROKER"],
    "timezone": "Europe/Oslo",
    "task_queues": [Queue("celery"), Queue("reports")],
    # No celery.backend_cleanup in either scheduler here: B7 is compared on its own.
    "result_expires": None,
    "beat_max_loop_interval": 1,
    "broker_connection_retry_on_startup": True,
    "worker_hijack_root_logger": False,
}
app = Celery("dropin_app")
app.config_from_object(SETTINGS)
durable = Durable(app)
_sink = redis.Redis.from_url(os.environ["E2E_SINK"])

# Two days ahead at 12:30, the same in every process of a run. Not further: RabbitMQ refuses
# a message whose TTL (Celery sets it from `expires`) exceeds 2**32 - 1 ms, about 49 days.
EXPIRES_AT = (datetime.now(timezone.utc) + timedelta(days=2)).replace(
    hour=12, minute=30, second=0, microsecond=0
)


def record(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """What the worker received: arguments, headers and the message options it can see."""
    request = task.request
    delivery = request.delivery_info or {}
    seen = {
        "id": request.id,
        "task": task.name,
        "args": list(args),
        "kwargs": kwargs,
        "headers": request.headers,
        "queue": delivery.get("routing_key"),
        "exchange": delivery.get("exchange"),
        "priority": delivery.get("priority"),
        "expires": request.expires,
        "eta": request.eta,
        "timelimit": list(request.timelimit or ()),
        "ignore_result": request.ignore_result,
        "shadow": request.shadow,
        "callbacks": request.callbacks,
    }
    _sink.rpush("e2e:dropin", json.dumps(seen, default=str))


@app.task(name="proj.work", bind=True)
def work(self: Any, *args: Any, **kwargs: Any) -> None:
    record(self, args, kwargs)


if os.environ.get("E2E_ROLE") == "worker":

    @app.task(name="proj.worker_only", bind=True)
    def worker_only(self: Any, *args: Any, **kwargs: Any) -> None:
        record(self, args, kwargs)


class EveryFewSeconds(BaseSchedule):
    """A custom schedule as projects write them: ``is_due`` only."""

    def __init__(self, seconds: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seconds = seconds

    def is_due(self, last_run_at: datetime) -> schedstate:
        elapsed = (self.now() - last_run_at).total_seconds()
        if elapsed >= self.seconds:
            return schedstate(True, self.seconds)
        return schedstate(False, self.seconds - elapsed)

    def __repr__(self) -> str:
        return f"<every {self.seconds}s, custom>"


def entry(name: str, sched: Any, **more: Any) -> dict[str, Any]:
    return {"task": "proj.work", "schedule": sched, "args": [name], **more}


SCHEDULE: dict[str, dict[str, Any]] = {
    "cron-lists": entry("cron-lists", crontab(minute=list(range(60)), hour=range(24))),
    "cron-names": entry(
        "cron-names",
        crontab(day_of_week="Sunday,monday,TUE,wed-sat", month_of_year="January-dec"),
        kwargs={"tag": "names"},
    ),
    "interval": entry("interval", timedelta(seconds=3), kwargs={"n": 1, "nested": [1, [2]]}),
    "seconds": entry("seconds", 4.0, args=["seconds", ("tuple", 1)]),
    "relative": entry("relative", schedule(timedelta(seconds=5), relative=True)),
    "solar": entry("solar", solar("sunset", -33.87, 151.21)),
    "custom": entry("custom", EveryFewSeconds(4)),
    "worker-only": {"task": "proj.worker_only", "schedule": 3.0, "args": ["worker-only"]},
    "headers": entry("headers", 3.0, options={"headers": {"tenant": "acme", "trace": 7}}),
    "queue": entry("queue", 3.0, options={"queue": "reports", "priority": 3}),
    "expires-at": entry("expires-at", 3.0, options={"expires": EXPIRES_AT}),
    "limits": entry(
        "limits",
        3.0,
        options={
            "expires": 120,
            "time_limit": 60,
            "soft_time_limit": 50,
            "ignore_result": True,
            "shadow": "limits-shadow",
        },
    ),
    "weekly ~ report": entry("weekly ~ report", 3.0),
}
dropped = set(filter(None, os.environ.get("E2E_DROP", "").split(",")))
app.conf.beat_schedule = {k: v for k, v in SCHEDULE.items() if k not in dropped}
