"""``celery durable blackouts …``: show, set and clear the global blackout windows (P4).

The global windows live in the journal; a running beat reads a change before its next
decision. ``durable_blackouts`` in the app's settings replaces them when beat starts.
"""

from __future__ import annotations

from typing import Any

import click

from celery_durable.cli import parse
from celery_durable.cli.audit import audit, reason_option
from celery_durable.cli.common import (
    DurableGroup,
    creates_journal,
    echo,
    emit_json,
    json_option,
    session,
    table,
)


@click.group(cls=DurableGroup, name="blackouts")
def blackouts() -> None:
    """The blackout windows every schedule honours (P4)."""


def _print(windows: Any, changed: bool | None = None, done: str = "set") -> None:
    """The windows (and, after a command, whether it changed them: ``done`` says how)."""
    current = session()
    if current.json:
        data: dict[str, Any] = {"blackouts": [w.describe() for w in windows]}
        if changed is not None:
            data["changed"] = changed
        emit_json(data)
        return
    if changed is False:
        echo("global blackout windows unchanged")
    elif changed:
        echo(f"global blackout windows {done}")
    if windows:
        echo(table(("NAME", "WINDOW"), [(w.name, w.describe()) for w in windows]))
    else:
        echo("no global blackout windows")


@blackouts.command()
@json_option
def show() -> None:
    """List the global blackout windows."""
    _print(session().durable.blackouts.get())


@blackouts.command(name="set")
@click.argument("windows", nargs=-1, required=True, metavar="WINDOW...")
@reason_option
@json_option
@creates_journal
def set_(windows: tuple[str, ...], reason: str | None) -> None:
    """Replace the global windows with WINDOW... (each as --blackout takes it)."""
    parsed = [parse.blackout(text, "WINDOW") for text in windows]
    api = session().durable.blackouts
    changed = api.set(parsed, **audit(reason))
    _print(api.get(), changed)


@blackouts.command()
@reason_option
@json_option
def clear(reason: str | None) -> None:
    """Remove every global blackout window."""
    api = session().durable.blackouts
    changed = api.clear(**audit(reason))
    _print(api.get(), changed, done="cleared")
