"""A Celery project for the end-to-end test of secret inputs (SPEC P5).

Configured from the environment: ``E2E_BROKER`` (Redis URL), ``CELERY_DURABLE_URL`` (journal),
``E2E_RECEIVED`` (a folder where tasks write what they received: the one place a secret's value
may appear). The schedules are created by the test before beat starts.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery import Celery

from celery_durable import Durable, ScheduledRun

app = Celery("secret_app", broker=os.environ["E2E_BROKER"])
app.conf.update(
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    beat_max_loop_interval=1,
    durable_leader_lease=10.0,
    # A setting the worker and beat read a ``setting:`` secret from.
    E2E_SETTING_TOKEN=os.environ.get("E2E_SETTING_TOKEN", ""),
)
durable = Durable(app)


def _write(run_id: str, text: str) -> None:
    folder = Path(os.environ["E2E_RECEIVED"])
    (folder / run_id.replace(":", "_")).write_text(text, encoding="utf-8")


@app.task(name="secret.plain", bind=True)
def plain(self, token: str, *, region: str = "", setting: str = "") -> None:
    _write(self.request.id, f"{token}|{region}|{setting}")


@app.task(name="secret.flaky", bind=True)
def flaky(self, token: str) -> None:
    """Fails once and retries (``Task.retry``: Celery publishes the message again)."""
    if self.request.retries == 0:
        raise self.retry(countdown=3)
    _write(self.request.id + "-retried", token)


@app.task(name="secret.slow", bind=True)
def slow(self, token: str) -> None:
    """Busy for a while, so that ``celery inspect active`` and ``reserved`` find it."""
    time.sleep(2)
    _write(self.request.id, token)


@durable.task(name="secret.durable")
def durable_job(run: ScheduledRun) -> str:
    @durable.step(name="use")
    def use() -> str:
        _write(run.schedule + "@durable", str(run.input["token"]))
        return "used"  # a step result is stored: never the value itself

    return use()
