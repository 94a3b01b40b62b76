"""The Celery app the chaos harness runs in real ``celery beat`` and ``celery worker`` processes.

Configured from the environment (``tests/chaos/run.py`` sets it for every child):

* ``CHAOS_BROKER``  -- Redis URL (the harness's own ``redis-server``, restarted during the run);
* ``CHAOS_JOURNAL`` -- the journal (a fresh PostgreSQL database);
* ``CHAOS_LEDGER``  -- libpq URL of the external ledger (another database the harness owns);
* ``CHAOS_STEP_SLEEP`` -- seconds each step spends "doing its work" (so kills land inside steps).

The durable task ``chaos.job`` has four steps; each one records the call in ``chaos_calls``
(who, which attempt), counts it in ``chaos_ledger.calls`` and then applies its effect once per
idempotency key (``chaos_effects``, unique key): the way a payment API with idempotency keys
behaves. The harness compares those rows with the journal.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
from celery import Celery

from celery_durable import Durable, Retry, ScheduledRun, step_context

app = Celery("chaos", broker=os.environ.get("CHAOS_BROKER", "redis://127.0.0.1:6379/15"))
app.conf.update(
    broker_transport_options={
        # Redelivery of a killed worker's messages within the run (celery-facts §5).
        "visibility_timeout": float(os.environ.get("CHAOS_VISIBILITY", "10")),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    worker_hijack_root_logger=False,
    beat_max_loop_interval=1,
    durable_leader_lease=float(os.environ.get("CHAOS_LEADER_LEASE", "3")),
    durable_run_lease=float(os.environ.get("CHAOS_RUN_LEASE", "20")),
    durable_check_interval=5,
    worker_cancel_long_running_tasks_on_connection_loss=True,
)
if os.environ.get("CHAOS_PARTITIONS"):
    app.conf.durable_partitions = int(os.environ["CHAOS_PARTITIONS"])  # D10
durable = Durable(app, os.environ.get("CHAOS_JOURNAL"))

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS chaos_ledger (
    key TEXT PRIMARY KEY, calls INTEGER NOT NULL DEFAULT 0, effects INTEGER NOT NULL DEFAULT 0,
    refused INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS chaos_calls (
    id BIGSERIAL PRIMARY KEY, key TEXT NOT NULL, attempt INTEGER NOT NULL, pid INTEGER NOT NULL,
    ppid INTEGER NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT now(), done BOOLEAN NOT NULL DEFAULT
    false);
CREATE TABLE IF NOT EXISTS chaos_effects (key TEXT PRIMARY KEY, at TIMESTAMPTZ DEFAULT now());
"""

_conn: dict[int, psycopg.Connection[Any]] = {}


def _ledger() -> psycopg.Connection[Any]:
    """One autocommit connection per process (made again after a fork or an error)."""
    conn = _conn.get(os.getpid())
    if conn is None or conn.closed:
        conn = psycopg.connect(os.environ["CHAOS_LEDGER"], autocommit=True, connect_timeout=10)
        _conn.clear()
        _conn[os.getpid()] = conn
    return conn


def _ledger_execute(sql: str, params: tuple[Any, ...]) -> Any:
    try:
        return _ledger().execute(sql, params).fetchone()
    except psycopg.OperationalError:
        _conn.clear()
        raise


def apply_effect(step: int) -> int:
    """The external side effect of one step, keyed by the step's idempotency key (S4)."""
    ctx = step_context()
    key = ctx.idempotency_key
    row = _ledger_execute(
        "INSERT INTO chaos_calls (key, attempt, pid, ppid) VALUES (%s, %s, %s, %s) RETURNING id",
        (key, ctx.attempt, os.getpid(), os.getppid()),
    )
    _ledger_execute(
        "INSERT INTO chaos_ledger (key, calls) VALUES (%s, 1) ON CONFLICT (key) DO UPDATE "
        "SET calls = chaos_ledger.calls + 1 RETURNING calls",
        (key,),
    )
    time.sleep(float(os.environ.get("CHAOS_STEP_SLEEP", "0.05")))
    # The external system dedupes by idempotency key: a second call is refused, not applied.
    # One statement, so a kill cannot fall between the effect and its count.
    _ledger_execute(
        "WITH applied AS (INSERT INTO chaos_effects (key) VALUES (%s) ON CONFLICT (key) "
        "DO NOTHING RETURNING key), n AS (SELECT count(*) AS c FROM applied) "
        "UPDATE chaos_ledger SET effects = effects + n.c, refused = refused + 1 - n.c FROM n "
        "WHERE chaos_ledger.key = %s RETURNING chaos_ledger.key",
        (key, key),
    )
    _ledger_execute("UPDATE chaos_calls SET done = true WHERE id = %s RETURNING id", (row[0],))
    return step


# Ledger hiccups are retried; a kill is not a failure (the run is replayed instead).
_RETRY = Retry.times(5, initial=0.5, cap=2.0, retry_on=(psycopg.OperationalError,))


@durable.step(name="reserve", retry=_RETRY)
def reserve() -> int:
    return apply_effect(0)


@durable.step(name="charge", retry=_RETRY)
def charge() -> int:
    return apply_effect(1)


@durable.step(name="ship", retry=_RETRY)
def ship() -> int:
    return apply_effect(2)


@durable.step(name="notify", retry=_RETRY)
def notify() -> int:
    return apply_effect(3)


@durable.task(name="chaos.job")
def job(run: ScheduledRun) -> list[int]:
    return [reserve(), charge(), ship(), notify()]
