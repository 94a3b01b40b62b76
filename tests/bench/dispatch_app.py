"""Celery project used by ``bench_dispatch.py``: the app its beat subprocesses run.

``celery -A tests.bench.dispatch_app beat -S celery_durable.beat:DurableScheduler`` with the
working directory at the repository root. Configured only through environment variables:

* ``BENCH_BROKER``       Redis URL of the broker (default ``redis://127.0.0.1:6379/9``)
* ``CELERY_DURABLE_URL`` the journal (read by ``Durable``)
* ``BENCH_MARK_FILE``    file that gets the wall-clock time of the ``beat_init`` signal
  (sent by ``celery.beat.Service.start`` once the scheduler, incl. ``setup_schedule()``, is built)
* ``BENCH_POLL_S``       ``durable_poll_interval`` (default: the library's default)

The app has no ``beat_schedule``: every schedule is written into the journal by the driver
before beat starts, so beat's start-up cost is the dispatcher's own (index load), nothing else.
"""

from __future__ import annotations

import os
import time

from celery import Celery
from celery.signals import beat_init

from celery_durable import Durable

BROKER = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/9")

app = Celery("dispatch_app", broker=BROKER)
app.conf.update(
    timezone="UTC",
    enable_utc=True,
    broker_connection_retry_on_startup=True,
    beat_schedule={},
    worker_hijack_root_logger=False,
)
if os.environ.get("BENCH_POLL_S"):
    app.conf.durable_poll_interval = float(os.environ["BENCH_POLL_S"])
if os.environ.get("BENCH_PARTITIONS"):
    app.conf.durable_partitions = int(os.environ["BENCH_PARTITIONS"])

durable = Durable(app)


@app.task(name="bench.noop")
def noop(*args: object, **kwargs: object) -> None:
    return None


@beat_init.connect
def _mark_ready(sender: object = None, **kwargs: object) -> None:
    path = os.environ.get("BENCH_MARK_FILE")
    if path:
        with open(path, "w") as f:
            f.write(repr(time.time()))
