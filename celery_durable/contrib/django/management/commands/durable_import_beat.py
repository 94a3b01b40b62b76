"""``manage.py durable_import_beat [--dry-run] [--skip-invalid] [--json]`` (SPEC I1).

The very click command of ``celery -A proj durable import django-celery-beat``, run inside the
project: the rows are read through Django's ORM, the journal is the one the Django integration
resolves (``CELERY_DURABLE_URL``, else the default database).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from celery_durable.contrib.django.management.commands.durable_schedules import (
    Command as SchedulesCommand,
)


class Command(SchedulesCommand):
    help = "Copy django-celery-beat's PeriodicTask rows into durable schedules (see --help)."
    name = "durable_import_beat"

    def _group(self) -> tuple[Any, list[str]]:
        from celery_durable.cli.importing import import_group

        return import_group, ["django-celery-beat"]

    def add_arguments(self, parser: CommandParser) -> None:
        # For call_command("durable_import_beat", "--dry-run"): from the command line click
        # parses the arguments itself (run_from_argv).
        for flag in FLAGS:
            parser.add_argument(flag, action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        given = [f for f in FLAGS if options.get(f[2:].replace("-", "_"))]
        super().handle(*args, *given, **options)


FLAGS = ("--dry-run", "--skip-invalid", "--json")
