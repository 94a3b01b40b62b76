"""The Celery app of the child-run end-to-end tests (W10, W11), run in real ``celery worker``s.

Configured from the environment:

* ``E2E_BROKER`` -- the broker (Redis or RabbitMQ);
* ``E2E_BACKEND`` -- the result backend of the chord the test compares with (Redis);
* ``E2E_JOURNAL`` -- the journal (PostgreSQL schema or SQLite file);
* ``E2E_COUNTS`` -- a file where each child's step appends ``start <input> <pid>`` and
  ``end <input> <pid>`` under an ``fcntl`` lock: executions counted outside the journal and
  outside the broker;
* ``E2E_GATE`` -- a file: the step of input ``E2E_GATED`` waits until it exists (the test kills
  the worker running it in the meantime);
* ``E2E_QUEUE`` -- a prefix for the queue names (``<prefix>parents``, ``<prefix>kids``), unique
  per test, so that nothing of another test is consumed on a shared RabbitMQ vhost;
* ``E2E_WORK`` -- seconds of work (a sleep) in each child's step and in each of the chord's
  members alike, so that the two do the same work (0.01 unless given);
* ``E2E_LEASE`` (``durable_run_lease``) and ``E2E_VISIBILITY`` (Redis' visibility timeout,
  small so that a killed worker's messages come back soon; also the life of the lock of
  kombu's sweep of them, which a worker killed while sweeping leaves behind).

Parents (``kids.fan_out``, ``kids.one_child``) go to the ``parents`` queue, children and the
chord's members to ``kids``, so a test knows which worker holds which. Run with
``celery -A tests.support.children_app worker``.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from celery import Celery

from celery_durable import Durable

BROKER = os.environ.get("E2E_BROKER", "redis://127.0.0.1:6379/0")
QUEUE = os.environ.get("E2E_QUEUE", "")
PARENTS = f"{QUEUE}parents"
KIDS = f"{QUEUE}kids"

app = Celery("children_e2e", broker=BROKER, backend=os.environ.get("E2E_BACKEND", BROKER))
_transport: dict[str, Any] = {}
if os.environ.get("E2E_VISIBILITY") and BROKER.startswith("redis"):
    _transport = {
        "visibility_timeout": float(os.environ["E2E_VISIBILITY"]),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
        # A worker killed while it sweeps unacknowledged messages back leaves the sweep's
        # lock behind, for 300 s by default: no worker sweeps until it expires.
        "unacked_mutex_expire": float(os.environ["E2E_VISIBILITY"]),
    }
WORK = float(os.environ.get("E2E_WORK", "0.01"))
ROUTES = {
    "kids.fan_out": {"queue": PARENTS},
    "kids.one_child": {"queue": PARENTS},
    "kids.*": {"queue": KIDS},
}
app.conf.update(
    broker_transport_options=_transport,
    # A solo worker on RabbitMQ with a prefetch multiplier of 1 was seen to leave a delivered
    # message unread for about 10 s at a time (Celery 5.7, kombu 5.7: docs/howto-children.md).
    worker_prefetch_multiplier=4,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    durable_run_lease=float(os.environ.get("E2E_LEASE", "300")),
    task_routes=ROUTES,
    task_default_queue=KIDS,
)
durable = Durable(app, os.environ.get("E2E_JOURNAL", "sqlite:///children-e2e.db"))


def note(what: str, x: int) -> None:
    """Append ``what x pid`` to the counts file, under an exclusive lock (nothing without
    ``E2E_COUNTS``: the benchmark counts nothing, as the chord's members do not)."""
    path = os.environ.get("E2E_COUNTS")
    if not path:
        return
    with open(path, "a", encoding="ascii") as counts:
        fcntl.flock(counts, fcntl.LOCK_EX)
        try:
            counts.write(f"{what} {x} {os.getpid()}\n")
            counts.flush()
        finally:
            fcntl.flock(counts, fcntl.LOCK_UN)


def counted(path: str | Path, what: str = "start") -> Counter[int]:
    """How often each input's step reached ``what`` (``start`` or ``end``): for the test."""
    found: Counter[int] = Counter()
    if not Path(path).exists():
        return found
    with open(path, encoding="ascii") as counts:
        fcntl.flock(counts, fcntl.LOCK_SH)
        try:
            lines = counts.read().splitlines()
        finally:
            fcntl.flock(counts, fcntl.LOCK_UN)
    for line in lines:
        kind, x, _pid = line.split()
        if kind == what:
            found[int(x)] += 1
    return found


def pids_of(path: str | Path, x: int) -> list[int]:
    """The processes whose step of input ``x`` started, in order."""
    if not Path(path).exists():
        return []
    with open(path, encoding="ascii") as counts:
        lines = counts.read().splitlines()
    return [
        int(pid)
        for kind, i, pid in (line.split() for line in lines)
        if (kind, i) == ("start", str(x))
    ]


@durable.step(name="square")
def _square(x: int) -> int:
    note("start", x)
    if str(x) == os.environ.get("E2E_GATED"):
        gate = Path(os.environ["E2E_GATE"])
        while not gate.exists():  # the worker running this step is killed here
            time.sleep(0.05)
    time.sleep(WORK)  # some work
    note("end", x)
    return x * x


@durable.task(name="kids.square")
def square(x: int) -> int:
    """One child: one step."""
    return _square(x)


@durable.task(name="kids.fan_out")
def fan_out(n: int, at_most: int) -> list[int]:
    """The parent: one child per input, at most ``at_most`` at a time."""
    return list(durable.map_children(square, range(n), at_most=at_most))


@durable.task(name="kids.one_child")
def one_child(x: int) -> int:
    """A parent of one child, waited for at once (W10)."""
    return int(durable.child(square, x))


@app.task(name="kids.plain_square")
def plain_square(x: int) -> int:
    """The chord's member (the peer the test compares with): the same work as a child's step."""
    time.sleep(WORK)
    return x * x


@app.task(name="kids.collect")
def collect(results: list[int]) -> list[int]:
    return list(results)
