"""A small Celery project for the CLI tests: ``celery -A tests.e2e.cli_app durable …``.

The journal comes from ``CELERY_DURABLE_URL`` (or the CLI's ``--url``); the broker is
in-memory, since the CLI only reads and writes the journal.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_durable import Durable

app = Celery("cli_app", broker="memory://")
app.conf.update(timezone="Europe/Oslo", task_ignore_result=True)
durable = Durable(app)


@app.task(name="cli.backup")
def backup(*args: Any, **kwargs: Any) -> None:
    """A plain task."""


@app.task(name="cli.needs_folder")
def needs_folder(folder: str) -> None:
    """A plain task with a required argument."""


@durable.task(name="cli.invoice")
def invoice(run: Any) -> str:
    """A durable task."""
    return f"invoice for {run.input}"
