"""``celery durable replay --check``: would the current code replay the stored runs? (W6)."""

from __future__ import annotations

from datetime import datetime, timezone

import click

from celery_durable.cli import parse
from celery_durable.cli.common import (
    FAILED,
    CliError,
    echo,
    emit_json,
    invalid,
    json_option,
    not_found,
    option,
    printable,
    session,
    shown,
)


@click.command(name="replay")
@option("--check", is_flag=True, help="Report runs that would take another path (required).")
@option("--schedule", "schedule", metavar="ID", help="Only the runs of this schedule.")
@option("--run", "run_id", metavar="RUN_ID", help="Only this run (ended or still going).")
@option(
    "--since",
    metavar="WHEN",
    help="Only ended runs that ended since then: a duration back from now (7d, 12h) or an "
    "instant (runs still going are all checked).",
)
@option(
    "--limit",
    type=click.IntRange(1),
    help="At most this many ended runs, last ended first (runs still going are all checked).",
)
@json_option
def replay(
    check: bool, schedule: str | None, run_id: str | None, since: str | None, limit: int | None
) -> None:
    """Replay durable runs against the current code, storing and sending nothing.

    Runs still going (running, or suspended in a sleep, a signal wait or waiting for
    children: the runs a deploy continues, W14) and ended runs are checked. Every run whose
    body would now ask for another step than the journal holds at some position (the run
    would be parked, W6) is listed with that position; exit 1 if there is one, 0 otherwise.
    Runs that take the old branch of a ``patched`` marker (W14) are listed too (they replay:
    exit 0), and so are runs that cannot be replayed here ("cannot replay": a secret input
    this process cannot read, P5; they were not checked, exit 0). A run still going is
    replayed up to the position it reaches next. Steps do not
    run; code outside steps runs as on any replay.
    """
    from celery_durable.worker.replay import check_report

    if not check:
        raise invalid("give --check: the replay command only checks (it never runs steps)")
    if run_id is not None and (schedule is not None or since is not None):
        raise invalid("--run names one run: it cannot be combined with --schedule or --since")
    current = session()
    durable = current.durable
    if run_id is not None and durable.runs.row(run_id) is None:
        raise not_found(f"no durable run {shown(run_id)} has started")
    since_at = None if since is None else _since(since, durable.now())
    found, old, cannot = check_report(
        durable.runtime, schedule=schedule, run_id=run_id, since=since_at, limit=limit
    )
    if current.json:
        emit_json(
            {
                "divergent": [d.to_json() for d in found],
                "old_branch": [o.to_json() for o in old],
                "cannot_replay": [c.to_json() for c in cannot],
            }
        )
    else:
        for divergence in found:
            echo(printable(str(divergence)))
        for branch in old:
            echo(printable(str(branch)))
        for unchecked in cannot:
            echo(printable(str(unchecked)))
        if not found and not cannot:
            echo("every checked run replays on the stored path")
        elif not found:
            echo("every other checked run replays on the stored path")
    if found:
        raise CliError(f"{len(found)} run(s) would now take another path (W6)", FAILED)


def _since(text: str, now: datetime) -> datetime:
    if text.strip()[:1].isdigit() and "-" not in text and ":" not in text:
        return now - parse.duration(text, "--since")
    return parse.instant(text, "--since", None).astimezone(timezone.utc)
