"""The ``celery durable`` command (Celery's ``celery.commands`` plugin entry point) and
``python -m celery_durable``, which takes ``-A/--app`` itself and offers the same commands.

Commands are documented in docs/cli.md; exit codes in :mod:`celery_durable.cli.common`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from importlib import import_module
from typing import Any

import click

from celery_durable.cli.common import DurableGroup, invalid, option, start_session

__all__ = ["bound_group", "durable", "main"]

_COMMANDS: dict[str, tuple[str, str]] = {
    "schedules": ("schedules", "schedules"),
    "blackouts": ("blackouts", "blackouts"),
    "runs": ("runs", "runs"),
    "run": ("run", "run"),
    "replay": ("replay_check", "replay"),
    "index": ("admin", "index"),
    "db": ("admin", "db"),
    "health": ("health", "health"),
    "beats": ("partitions", "beats"),
    "partitions": ("partitions", "partitions"),
    "import": ("importing", "import_group"),
    "prune": ("admin", "prune"),
}
"""Each command's name → its module under ``celery_durable.cli`` and the click object there."""


class _CommandsOnDemand(DurableGroup):
    """A root group that imports a command's module when the command is looked up (to run
    it, or by ``--help``, which looks up every one); listing the names imports nothing.

    Celery imports its ``celery.commands`` plugins with every ``celery`` command, ``celery
    beat`` and ``celery worker`` included: those never run one of ours, so they should not pay
    for importing the commands and the read models behind them.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in _COMMANDS:
            module, attribute = _COMMANDS[cmd_name]
            command = getattr(import_module(f"celery_durable.cli.{module}"), attribute)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


def _global_options(fun: Any) -> Any:
    fun = option(
        "--traceback", is_flag=True, hidden=True, help="Show the traceback of unexpected errors."
    )(fun)
    fun = option(
        "--json", "as_json", is_flag=True, help="Print JSON instead of tables (any command)."
    )(fun)
    return option(
        "--url",
        metavar="URL",
        help="Journal URL; default: app.conf.durable_url, then $CELERY_DURABLE_URL.",
    )(fun)


@click.group(cls=_CommandsOnDemand, name="durable")
@_global_options
@click.pass_context
def durable(ctx: click.Context, url: str | None, as_json: bool, traceback: bool) -> None:
    """Durable schedules and runs: the journal of celery_durable."""
    # ctx.obj is Celery's CLIContext under `celery`; invoked on its own, use the current app.
    app = getattr(ctx.obj, "app", None)
    # Without -A (or $CELERY_APP) Celery hands over its default app, which has no tasks and
    # no journal of its own.
    given = ctx.find_root().params.get("app") is not None
    start_session(ctx, app or _default_app(), url, as_json, traceback, app_given=given)


@click.group(cls=_CommandsOnDemand, name="celery_durable")
@option(
    "-A",
    "--app",
    "app_name",
    metavar="MODULE",
    envvar="CELERY_APP",
    help="The Celery app, as for 'celery -A' (also $CELERY_APP).",
)
@option("--workdir", type=click.Path(file_okay=False), help="Change to this directory first.")
@_global_options
@click.pass_context
def main(
    ctx: click.Context,
    app_name: str | None,
    workdir: str | None,
    url: str | None,
    as_json: bool,
    traceback: bool,
) -> None:
    """Durable schedules and runs (the commands of 'celery -A APP durable')."""
    if workdir:
        os.chdir(workdir)
    # As under `celery durable`: without -A, Celery's default app, usable only with a journal
    # named by --url or $CELERY_DURABLE_URL (docs/cli.md, "Which journal").
    app = _load_app(app_name) if app_name else _default_app()
    start_session(ctx, app, url, as_json, traceback, app_given=app_name is not None)


def bound_group(group: click.Group, app: Callable[[], Any], name: str) -> click.Group:
    """``group``'s own commands under a root taking the global options, for the app ``app()``.

    The Django management command ``durable_schedules`` is this over ``schedules``: the same
    click commands, so the same options, output, exit codes and confirmations as
    ``celery -A proj durable schedules``.
    """

    @click.group(cls=DurableGroup, name=name, commands=dict(group.commands), help=group.help)
    @_global_options
    @click.pass_context
    def root(ctx: click.Context, url: str | None, as_json: bool, traceback: bool) -> None:
        start_session(ctx, app(), url, as_json, traceback)

    return root


def _default_app() -> Any:
    """Celery's default app: what ``celery`` without ``-A`` hands to its sub-commands."""
    from celery import current_app

    return current_app._get_current_object()


def _load_app(name: str) -> Any:
    from celery.app.utils import find_app

    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `celery -A` does, a module in "." is found
    try:
        return find_app(name)
    except Exception as exc:
        raise invalid(f"cannot load the Celery app {name!r}: {type(exc).__name__}: {exc}") from None
