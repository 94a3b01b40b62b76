"""``manage.py durable_schedules …``: the ``schedules`` commands of ``celery -A proj durable``.

Not a copy: the very click commands of docs/cli.md (list, show, create, change, pause, resume,
delete, trigger, backfill) with their options, output, exit codes and confirmations, run on the
Celery app and journal the Django integration resolves (``CELERY_DURABLE_APP``, else Celery's
current app; ``CELERY_DURABLE_URL``, else the default database).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser

# Options ``manage.py`` itself has read before the command runs (with or without ``=value``).
_DJANGO_GLOBAL = ("--settings", "--pythonpath")


def _without_django_options(args: list[str]) -> list[str]:
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _DJANGO_GLOBAL:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in _DJANGO_GLOBAL)):
            kept.append(arg)
    return kept


class Command(BaseCommand):
    help = "The 'schedules' commands of 'celery -A proj durable' (see --help)."
    name = "durable_schedules"
    requires_system_checks: list[str] = []

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # For call_command: everything after the command name goes to click untouched.
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.add_argument("args", nargs=argparse.REMAINDER)
        return parser

    def run_from_argv(self, argv: list[str]) -> NoReturn:
        """``manage.py durable_schedules ARGS``: click parses ARGS (``--help`` included)."""
        prog = f"{os.path.basename(argv[0])} {argv[1]}"
        raise SystemExit(self._run(_without_django_options(argv[2:]), prog))

    def handle(self, *args: Any, **options: Any) -> None:
        """``call_command("durable_schedules", "list", stdout=…)``; non-zero exit → CommandError."""
        code = self._run([str(a) for a in args], f"manage.py {self.name}")
        if code:
            raise CommandError(f"{self.name} exited with {code}", returncode=code)

    def _group(self) -> tuple[Any, list[str]]:
        """The click group run, and the arguments put before the user's."""
        from celery_durable.cli.schedules import schedules

        return schedules, []

    def _run(self, args: list[str], prog: str) -> int:
        from celery_durable.cli import bound_group
        from celery_durable.contrib.django import celery_app

        wrapped, before = self._group()
        group = bound_group(wrapped, celery_app, prog.split()[-1])
        args = [*before, *args]
        with (
            contextlib.redirect_stdout(self.stdout._out),
            contextlib.redirect_stderr(self.stderr._out),
        ):
            try:
                group.main(args=args, prog_name=prog, standalone_mode=True)
            except SystemExit as exc:
                return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return 0
