"""``manage.py durable_runs SCHEDULE_ID``: the runs of a schedule, newest first."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_durable.contrib.django import get_durable
from celery_durable.contrib.django.admin import run_rows
from celery_durable.core.ids import printable
from celery_durable.errors import DurableError
from celery_durable.presentation import utc_label


class Command(BaseCommand):
    help = "List the runs of a durable schedule with their states and outcomes."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("schedule_id")
        parser.add_argument("--limit", type=int, default=20, help="Runs shown (default 20).")
        parser.add_argument("--json", action="store_true", help="Print JSON.")

    def handle(self, *args: Any, schedule_id: str, limit: int, **options: Any) -> None:
        durable = get_durable()
        try:
            if durable.schedules.state(schedule_id) is None:
                raise CommandError(f"no durable schedule {schedule_id!r}")
            rows = run_rows(durable, durable.schedules.runs(schedule_id, limit=limit))
        except DurableError as exc:
            raise CommandError(str(exc)) from None
        if options["json"]:
            data = [
                {
                    "run_id": r.run.run_id,
                    "due": r.run.due.isoformat(),
                    "state": r.state,
                    "reason": r.run.reason,
                    "outcome": r.outcome or None,
                    "detail": r.detail or None,
                }
                for r in rows
            ]
            self.stdout.write(json.dumps(data, indent=2))
            return
        for r in rows:
            line = f"{r.run.run_id}  {utc_label(r.run.due)}  {r.state}"
            if r.outcome:
                line += f"  {r.outcome}"
            if r.detail:
                line += f"  {r.detail}"
            self.stdout.write(printable(line))  # stored data: no raw control characters
