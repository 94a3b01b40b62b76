"""The Celery app that end-to-end durable-task tests run in real ``celery worker`` processes.

Configured from the environment (the test sets it for each worker subprocess):

* ``E2E_BROKER``  -- broker URL (Redis);
* ``E2E_JOURNAL`` -- journal URL (SQLite file or PostgreSQL schema);
* ``E2E_CALLS``   -- path of a SQLite file where steps record each execution (the "external
  store the test owns"): ``calls(what, key, attempt, at, pid)``;
* ``E2E_GATE``    -- a file: ``gated`` blocks in its step until it exists;
* ``E2E_VISIBILITY`` -- Redis ``visibility_timeout`` (seconds; small for crash tests);
* ``E2E_QUEUE``   -- the queue the tasks go to and the worker consumes (default ``celery``): a
  name of the test's own on a shared RabbitMQ vhost;
* ``E2E_BODY``    -- which version of ``changing`` is deployed (non-determinism test);
* ``E2E_LEASE``   -- ``durable_run_lease`` seconds;
* ``E2E_ENGINE_OPTIONS`` -- ``durable_engine_options`` as JSON.

Run with ``celery -A tests.support.durable_apps worker``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from celery import Celery

from celery_durable import Durable
from celery_durable.core.retry import Retry
from celery_durable.worker.context import step_context
from celery_durable.worker.primitives import sleep, wait_signal

app = Celery("durable_e2e", broker=os.environ.get("E2E_BROKER", "redis://127.0.0.1:6379/0"))
_transport: dict[str, Any] = {}
if os.environ.get("E2E_VISIBILITY") and app.conf.broker_url.startswith("redis"):
    _transport = {
        "visibility_timeout": float(os.environ["E2E_VISIBILITY"]),
        # kombu 5.7: sweep for unacked messages every second (celery-facts §5).
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }
app.conf.update(
    broker_transport_options=_transport,
    task_default_queue=os.environ.get("E2E_QUEUE", "celery"),
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    durable_run_lease=float(os.environ.get("E2E_LEASE", "300")),
    durable_engine_options=json.loads(os.environ.get("E2E_ENGINE_OPTIONS", "{}")),
)
durable = Durable(app, os.environ.get("E2E_JOURNAL", "sqlite:///e2e.db"))


# -- the external store --------------------------------------------------------------------


def _calls() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["E2E_CALLS"], timeout=30, isolation_level=None)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS calls (what TEXT, key TEXT, attempt INT, at REAL, pid INT)"
    )
    return conn


def record(what: str, key: str = "", attempt: int = 0) -> None:
    conn = _calls()
    try:
        conn.execute(
            "INSERT INTO calls VALUES (?, ?, ?, ?, ?)",
            (what, key, attempt, time.time(), os.getpid()),
        )
    finally:
        conn.close()


def calls(path: str | Path, what: str | None = None) -> list[tuple[Any, ...]]:
    """Rows of the external store (for the test)."""
    if not Path(path).exists():
        return []
    conn = sqlite3.connect(str(path), timeout=30)
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS calls (what TEXT, key TEXT, attempt INT, at REAL, pid INT)"
        )
        if what is None:
            return conn.execute("SELECT * FROM calls ORDER BY at").fetchall()
        return conn.execute("SELECT * FROM calls WHERE what = ? ORDER BY at", (what,)).fetchall()
    finally:
        conn.close()


def _mark(what: str) -> Any:
    ctx = step_context()
    record(what, ctx.idempotency_key, ctx.attempt)
    return ctx


# -- crash: five steps, the third waits for the gate -------------------------------------------


@durable.step(name="one")
def one() -> int:
    _mark("step1")
    return 1


@durable.step(name="two")
def two() -> int:
    _mark("step2")
    return 2


@durable.step(name="gated")
def gated() -> int:
    _mark("step3")
    gate = Path(os.environ["E2E_GATE"])
    while not gate.exists():
        time.sleep(0.05)
    return 3


@durable.step(name="four")
def four() -> int:
    _mark("step4")
    return 4


@durable.step(name="five")
def five() -> int:
    _mark("step5")
    return 5


@durable.task(name="e2e.five_steps")
def five_steps() -> list[int]:
    return [one(), two(), gated(), four(), five()]


# -- durable sleep on a concurrency-1 worker ---------------------------------------------------


@durable.step(name="stamp")
def stamp(label: str) -> float:
    now = time.time()
    record(label, step_context().idempotency_key)
    return now


@durable.task(name="e2e.sleeper")
def sleeper(seconds: float) -> list[float]:
    before = stamp("before_sleep")
    sleep(seconds)
    after = stamp("after_sleep")
    return [before, after]


@app.task(name="e2e.quick")
def quick(label: str) -> None:
    record(label)


# -- signals ----------------------------------------------------------------------------------


@durable.task(name="e2e.waiter")
def waiter(name: str, timeout: float | None) -> Any:
    stamp("waiting")
    return {"got": wait_signal(name, timeout)}


# -- retries across a restart ------------------------------------------------------------------


@durable.step(
    name="flaky",
    retry=Retry(attempts=10, initial=2.0, multiplier=1.0, deadline=5.0, retry_on=(OSError,)),
)
def flaky() -> str:
    _mark("flaky")
    raise OSError("still failing")


@durable.task(name="e2e.retrying")
def retrying() -> str:
    return flaky()


@durable.step(name="refuses", retry=Retry.times(5, dont_retry_on=(PermissionError,)))
def refuses() -> str:
    _mark("refuses")
    raise PermissionError("no")


@durable.task(name="e2e.not_retryable")
def not_retryable() -> str:
    return refuses()


# -- non-determinism: the deployed body changes between deliveries ---------------------------


@durable.step(name="first")
def first() -> str:
    _mark("first")
    return "a"


@durable.step(name="second_v1")
def second_v1() -> str:
    _mark("second_v1")
    return "b"


@durable.step(name="second_v2")
def second_v2() -> str:
    _mark("second_v2")
    return "b2"


@durable.task(name="e2e.changing")
def changing() -> list[str]:
    a = first()
    b = second_v1() if os.environ.get("E2E_BODY", "1") == "1" else second_v2()
    return [a, b, gated_then("done")]


@durable.step(name="gated_then")
def gated_then(value: str) -> str:
    _mark("gated_then")
    gate = Path(os.environ["E2E_GATE"])
    while not gate.exists():
        time.sleep(0.05)
    return value


# -- two deliveries of one run at once ----------------------------------------------------------


@durable.step(name="slow")
def slow(i: int) -> int:
    _mark(f"slow{i}")
    time.sleep(0.3)
    return i


@durable.task(name="e2e.twice")
def twice() -> list[int]:
    return [slow(0), slow(1), slow(2)]


# -- the journal's server drops idle connections between two steps ------------------------------


@durable.step(name="charge")
def charge() -> str:
    _mark("charge")
    return "charged"


@durable.step(name="ship")
def ship() -> str:
    _mark("ship")
    return "shipped"


@durable.task(name="e2e.charge_then_ship")
def charge_then_ship() -> list[str]:
    charged = charge()
    record("between")  # work outside any step: the journal connection sits idle in the pool
    gate = Path(os.environ["E2E_GATE"])
    while not gate.exists():
        time.sleep(0.05)
    return [charged, ship()]
