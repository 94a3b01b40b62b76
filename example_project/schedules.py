"""The schedules of the example project, created idempotently at every start (A1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from celery_durable import MONDAY, CatchUp, Daily, Durable, Weekly
from celery_durable.core.rules import Rule
from example_project.settings import ZONE


@dataclass(frozen=True)
class Job:
    """One schedule: its ID, task, input, rule and catch-up policy."""

    id: str
    task: str
    input: Any
    rule: Rule
    catch_up: CatchUp
    options: dict[str, Any] = field(default_factory=dict)


JOBS = (
    # After downtime only the latest missed night is backed up: older snapshots add nothing.
    Job("nightly-backup", "example.backup", "documents", Daily("02:00", ZONE), CatchUp.LATEST),
    # After downtime every missed Monday is invoiced: each week is owed.
    Job("invoice-ada", "example.invoice", "Ada", Weekly([MONDAY], "08:00", ZONE), CatchUp.ALL),
)


def ensure_schedules(durable: Durable) -> None:
    """Create every job's schedule; one that exists with the same content is left as it is."""
    for job in JOBS:
        durable.schedules.create(job.id, job.task, job.input, job.rule, job.catch_up, **job.options)
