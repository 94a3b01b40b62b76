"""Who and why on the command line (O5): ``--reason`` on the commands that change a schedule,
the OS user as their author, and ``celery durable schedules history ID``."""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from celery_durable.cli.common import (
    echo,
    emit_json,
    json_option,
    not_found,
    option,
    session,
    shown,
    table,
)
from celery_durable.core.audit import check_audit
from celery_durable.errors import InvalidSchedule
from celery_durable.presentation import utc_json, utc_text

F = TypeVar("F", bound=Callable[..., Any])


def reason_option(fun: F) -> F:
    """``--reason TEXT``: why, stored with the command and shown by ``history`` (O5)."""
    return option(
        "--reason",
        metavar="TEXT",
        help="Why: stored with the command, with your OS user as its author (see history).",
    )(fun)


def os_user() -> str:
    """The OS user running the command (``getpass.getuser``), the author of what it stores.

    A process whose user has no name (a container running as a bare UID), or a name the
    history cannot hold (``$LOGNAME`` with a control character, over 200 characters: ``by``
    refuses it, and the command line has no other way to give one), is named by its UID.
    """
    try:
        name = getpass.getuser()
        check_audit(name, None)
    except (OSError, KeyError, InvalidSchedule):  # nameless, or a name `by` refuses
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return name


def audit(reason: str | None) -> dict[str, str | None]:
    """The ``by``/``reason`` keyword arguments of a schedule command made from the CLI."""
    return {"by": os_user(), "reason": reason}


@click.command()
@click.argument("schedule_id")
@option("--last", "last", type=click.IntRange(1, None), help="Only the newest N entries.")
@json_option
def history(schedule_id: str, last: int | None) -> None:
    """Show who created, changed, paused, resumed, deleted, triggered or backfilled
    SCHEDULE_ID, when and why.

    Oldest first; CHANGED names the settings a create or change set (the JSON output gives
    their values before and after, and the runs of a trigger or backfill).
    """
    current = session()
    entries = current.durable.schedules.history(schedule_id)
    if not entries:
        raise not_found(f"schedule {shown(schedule_id)} not found")
    if last is not None:
        entries = entries[-last:]
    if current.json:
        emit_json(
            [
                {
                    "at": utc_json(e.at),
                    "action": e.action,
                    "by": e.by,
                    "reason": e.reason,
                    "changes": {
                        name: {"before": before, "after": after}
                        for name, (before, after) in e.changes.items()
                    },
                }
                for e in entries
            ]
        )
        return
    rows = [
        (
            utc_text(e.at),
            e.action,
            e.by or "-",
            ", ".join(e.changes) if e.action in ("created", "changed") else "-",
            e.reason or "-",
        )
        for e in entries
    ]
    echo(table(("TIME (UTC)", "ACTION", "BY", "CHANGED", "REASON"), rows))
