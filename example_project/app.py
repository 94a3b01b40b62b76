"""The Celery app of the example project: one app, one journal, three durable tasks.

``celery -A example_project.app worker`` and ``celery -A example_project.app beat -S durable``
run it; ``python -m example_project`` starts both for a short demo. The tasks are durable
(``@durable.task``): their steps are journaled, so a run that is delivered again, or retried
after a failed step, does not repeat a step that already completed.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from celery import Celery

from celery_durable import Durable, Retry, ScheduledRun, sleep, step_context
from example_project.settings import ZONE, Settings
from example_project.standins import BackupStore, Billing

settings = Settings.from_env()
settings.make_dirs()

app = Celery("example_project", broker=settings.broker_url)
app.conf.update(
    timezone=ZONE,
    broker_transport=settings.broker_transport,
    broker_transport_options=settings.broker_transport_options,
    broker_connection_retry_on_startup=True,
    durable_url=settings.journal_url,
    # Outcomes of durable runs are read from the journal (durable.result): no result backend.
    task_ignore_result=True,
    # Durable tasks acknowledge late; with that, one message at a time per worker process.
    worker_prefetch_multiplier=1,
)
durable = Durable(app)

backup_store = BackupStore(settings.data_dir / "backups.db")
billing = Billing(settings.data_dir / "billing.db")

INVOICE_AMOUNT_CENTS = 12_500


# -- nightly backup -----------------------------------------------------------------------------


@durable.task(name="example.backup")
def backup(run: ScheduledRun) -> dict[str, Any]:
    """Copy the files of the folder ``run.input`` (relative to the data folder) to the store."""
    files = list_files(str(settings.data_dir / run.input))
    stored = store_snapshot(run.input, files)
    return {"folder": run.input, "files": len(files), "stored": stored}


@durable.step
def list_files(folder: str) -> list[dict[str, Any]]:
    """Name, size and SHA-256 of each file: journaled, so a replay sees the same snapshot."""
    found = []
    for path in sorted(Path(folder).iterdir()):
        if path.is_file():
            data = path.read_bytes()
            found.append(
                {"name": path.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            )
    return found


@durable.step(retry=Retry.times(5))
def store_snapshot(folder: str, files: list[dict[str, Any]]) -> bool:
    """Send the snapshot with the step's idempotency key: a repeated request stores nothing."""
    return backup_store.put(step_context().idempotency_key, folder, files)


# -- weekly invoice -----------------------------------------------------------------------------


def invoice_number(customer: str, due: datetime) -> str:
    """``<customer>-<ISO year>-W<ISO week>`` of the due time in Oslo, e.g. ``Ada-2026-W47``."""
    year, week, _ = due.astimezone(ZoneInfo(ZONE)).isocalendar()
    return f"{customer}-{year}-W{week:02d}"


@durable.task(name="example.invoice")
def invoice(run: ScheduledRun) -> dict[str, Any]:
    """Invoice customer ``run.input`` for the week of the run's due time, once per week."""
    number = invoice_number(run.input, run.due)
    issued = issue_invoice(number, run.input)
    return {"invoice": number, "issued": issued}


@durable.step(retry=Retry.times(5))
def issue_invoice(number: str, customer: str) -> bool:
    """The invoice number is the billing system's idempotency key: one invoice per week."""
    return billing.issue(number, customer, INVOICE_AMOUNT_CENTS)


# -- demo ---------------------------------------------------------------------------------------


@durable.task(name="example.demo")
def demo(run: ScheduledRun) -> dict[str, Any]:
    """A step that fails once and is retried 2 s later, then a durable 1.5 s sleep.

    Both waits give the worker back and come back through a broker countdown.
    """
    reply = flaky_call(run.input)
    sleep(1.5)
    return reply


@durable.step(retry=Retry.times(3, initial=2.0))
def flaky_call(text: str) -> dict[str, Any]:
    """Fails on the first attempt, as a remote call sometimes does; succeeds on the second."""
    attempt = step_context().attempt
    if attempt == 1:
        raise ConnectionError("simulated network error")
    return {"reply": text, "attempts": attempt}
