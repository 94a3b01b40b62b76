"""The Celery app of the child-run end-to-end tests (W10, W11), run in real ``celery worker``s.

Configured from the environment: ``E2E_BROKER`` (Redis, also the result backend of the chord
the test compares with), ``E2E_JOURNAL``, ``E2E_LEASE`` (``durable_run_lease``) and
``E2E_VISIBILITY`` (Redis' visibility timeout, small so that a killed worker's messages come
back soon). Each child's step counts its executions in Redis (``INCR kids:<input>``), outside
the journal. Parents are routed to the ``parents`` queue, children and the chord's members to
``kids``, so a test knows which worker holds which.

Run with ``celery -A tests.support.children_app worker -Q parents,kids``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from celery_durable import Durable

BROKER = os.environ.get("E2E_BROKER", "redis://127.0.0.1:6379/0")

app = Celery("children_e2e", broker=BROKER, backend=BROKER)
_transport: dict[str, Any] = {}
if os.environ.get("E2E_VISIBILITY"):
    _transport = {
        "visibility_timeout": float(os.environ["E2E_VISIBILITY"]),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }
app.conf.update(
    broker_transport_options=_transport,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    durable_run_lease=float(os.environ.get("E2E_LEASE", "300")),
    task_routes={"kids.fan_out": {"queue": "parents"}, "kids.*": {"queue": "kids"}},
)
durable = Durable(app, os.environ.get("E2E_JOURNAL", "sqlite:///children-e2e.db"))
_redis = redis.Redis.from_url(BROKER)


@durable.step(name="square")
def _square(x: int) -> int:
    _redis.incr(f"kids:{x}")
    time.sleep(0.01)  # some work: a kill lands while children are running
    return x * x


@durable.task(name="kids.square")
def square(x: int) -> int:
    """One child: one step."""
    return _square(x)


@durable.task(name="kids.fan_out")
def fan_out(n: int, at_most: int) -> list[int]:
    """The parent: one child per input, at most ``at_most`` at a time."""
    return list(durable.map_children(square, range(n), at_most=at_most))


@app.task(name="kids.plain_square")
def plain_square(x: int) -> int:
    """The chord's member (the peer the test compares with)."""
    return x * x


@app.task(name="kids.collect")
def collect(results: list[int]) -> list[int]:
    return list(results)
