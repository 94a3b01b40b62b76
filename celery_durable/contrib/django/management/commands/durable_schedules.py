"""``manage.py durable_schedules list|show|pause|resume|delete|trigger``: thin library calls.

The same verbs as ``celery -A proj durable schedules``; the journal and Celery app are the
ones the Django integration resolves (``CELERY_DURABLE_URL``, else the default database).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_durable.contrib.django import get_durable
from celery_durable.contrib.django.admin import (
    TIMING_LABELS,
    local_text,
    status_of,
    timing_parts,
    utc_text,
)
from celery_durable.core.policies import POLICY_FIELDS
from celery_durable.core.read_models import ScheduleView
from celery_durable.errors import DurableError


def schedule_json(view: ScheduleView) -> dict[str, Any]:
    """The JSON form of a schedule printed by ``--json``."""
    return {
        "id": view.id,
        "task": view.task,
        "rule": view.rule.to_json(),
        "input": view.input,
        "status": status_of(view),
        "catch_up": view.catch_up.value,
        "overlap": view.overlap.value,
        **{
            name: None if span is None else span.total_seconds()
            for name in POLICY_FIELDS
            for span in [getattr(view, name)]
        },
        "next_due": None if view.next_due is None else view.next_due.isoformat(),
        "runs_decided": view.runs_decided,
    }


class Command(BaseCommand):
    help = "List durable schedules, or pause, resume, delete or trigger them."

    def add_arguments(self, parser: CommandParser) -> None:
        verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
        listing = verbs.add_parser("list", help="List schedules (not deleted ones, unless --all).")
        listing.add_argument("--all", action="store_true", help="Include deleted schedules.")
        listing.add_argument("--json", action="store_true", help="Print JSON.")
        show = verbs.add_parser("show", help="Show one schedule.")
        show.add_argument("schedule_id")
        show.add_argument("--json", action="store_true", help="Print JSON.")
        for verb, text in (
            ("pause", "Pause schedules: no run starts until resumed."),
            ("resume", "Resume paused schedules from their next due time."),
            ("delete", "Delete schedules for good (their IDs can never be used again)."),
            ("trigger", "Start one run of each schedule now, outside its rule."),
        ):
            sub = verbs.add_parser(verb, help=text)
            sub.add_argument("schedule_ids", nargs="+", metavar="SCHEDULE_ID")

    def handle(self, *args: Any, verb: str, **options: Any) -> None:
        durable = get_durable()
        if verb == "list":
            views = durable.schedules.list(include_deleted=options["all"])
            if options["json"]:
                self.stdout.write(json.dumps([schedule_json(v) for v in views], indent=2))
                return
            rows = [
                (v.id, status_of(v), v.task, v.rule.describe(), utc_text(v.next_due)) for v in views
            ]
            self._table(("ID", "STATUS", "TASK", "RULE", "NEXT RUN (UTC)"), rows)
            return
        if verb == "show":
            view = durable.schedules.state(options["schedule_id"])
            if view is None:
                raise CommandError(f"no durable schedule {options['schedule_id']!r}")
            if options["json"]:
                self.stdout.write(json.dumps(schedule_json(view), indent=2))
                return
            for label, value in (
                ("ID", view.id),
                ("Status", status_of(view)),
                ("Task", view.task),
                ("Rule", view.rule.describe()),
                ("Input", json.dumps(view.input)),
                ("Catch-up", view.catch_up.name),
                ("Overlap", view.overlap.name),
                *zip(TIMING_LABELS, timing_parts(view), strict=True),
                ("Next run (UTC)", utc_text(view.next_due)),
                ("Next run (local)", local_text(view.next_due)),
                ("Runs decided", view.runs_decided),
            ):
                self.stdout.write(f"{label + ':':<18}{value}")
            return
        failed = 0
        for sid in options["schedule_ids"]:
            try:
                result = getattr(durable.schedules, verb)(sid)
            except DurableError as exc:
                failed += 1
                self.stderr.write(f"{sid}: {exc}")
                continue
            past = {"pause": "paused", "resume": "resumed", "delete": "deleted"}
            done = f"triggered run {result}" if verb == "trigger" else past[verb]
            self.stdout.write(f"{sid}: {done}")
        if failed:
            raise CommandError(f"{failed} of {len(options['schedule_ids'])} failed")

    def _table(self, headers: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
        cells = [headers, *[tuple(str(c) for c in row) for row in rows]]
        widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
        for row in cells:
            line = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
            self.stdout.write(line.rstrip())
