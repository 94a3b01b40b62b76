"""``celery durable index rebuild``, ``celery durable db init`` and ``celery durable prune``."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, TextIO

import click

from celery_durable.cli.common import (
    DurableGroup,
    creates_journal,
    emit_json,
    invalid,
    json_option,
    option,
    session,
)
from celery_durable.cli.parse import duration
from celery_durable.presentation import utc_json, utc_text

if TYPE_CHECKING:
    from celery_durable.store.retention import PruneProgress

PROGRESS_EVERY = 0.2
"""Seconds between two redraws of prune's progress line."""


@click.group(cls=DurableGroup, name="index")
def index() -> None:
    """Maintain the schedule index (one row per schedule, read by the dispatcher)."""


@index.command()
@json_option
def rebuild() -> None:
    """Drop the index rows and fold every schedule event again.

    Safe while beat runs: the dispatcher reads the rows and the events stored after them.
    """
    current = session()
    durable = current.durable
    states = durable.index.rebuild(durable.now())
    position = durable.index.position()
    if current.json:
        emit_json({"action": "rebuild", "schedules": len(states), "position": position})
    else:
        click.echo(f"schedule index rebuilt: {len(states)} schedule(s), position {position}")


@click.group(cls=DurableGroup, name="db")
def db() -> None:
    """Create the journal's tables, or print the SQL that creates them."""


@db.command()
@option("--sql", is_flag=True, help="Print the DDL for the URL's dialect; connect to nothing.")
@json_option
@creates_journal
def init(sql: bool) -> None:
    """Create the journal's tables (idempotent) and record the schema version."""
    from celery_durable.store.journal.schema import SCHEMA_VERSIONS, ddl, ddl_notes, metadata
    from celery_durable.store.journal.urls import normalize_url, redact

    current = session()
    url = current.durable.config.url
    dialect = normalize_url(url).get_backend_name()
    if sql:
        text = ddl(url)
        if current.json:
            emit_json({"url": redact(url), "dialect": dialect, "sql": text})
        else:
            click.echo(f"-- celery_durable schema for {dialect} ({redact(url)})")
            for note in ddl_notes(url):
                click.echo(f"-- {note}")
            click.echo()
            click.echo(text.rstrip("\n"))
        return
    current.durable.runtime.sql_journal.ensure_ready()
    tables = sorted(metadata.tables)
    if current.json:
        emit_json(
            {
                "url": redact(url),
                "dialect": dialect,
                "tables": tables,
                "schema_versions": dict(SCHEMA_VERSIONS),
            }
        )
    else:
        click.echo(f"journal ready at {redact(url)}: {len(tables)} tables")


@click.command()
@option(
    "--older-than",
    metavar="DURATION",
    help="Remove runs due longer ago than this (90s, 12h, 30d); default: durable_retention.",
)
@option("--dry-run", is_flag=True, help="Count what would be removed; remove nothing.")
@json_option
def prune(older_than: str | None, dry_run: bool) -> None:
    """Remove the records of runs that are over and older than the retention (O1).

    One call removes everything eligible, also runs recorded late (a backfill, a catch-up
    after downtime), in small batches, each one short transaction: safe while beat runs. What
    deciding needs (each schedule's state, its life-cycle events, unfinished runs) is kept.
    On a terminal, a progress line on stderr shows how far it got.
    """
    current = session()
    age = duration(older_than, "--older-than") if older_than is not None else None
    if age is not None and age <= timedelta(0):
        raise invalid(f"--older-than must be positive, not {older_than!r}")
    stderr = sys.stderr
    shown = _progress_line(stderr) if stderr.isatty() else None
    try:
        report = current.durable.prune(age, dry_run=dry_run, progress=shown)
    finally:
        if shown is not None:
            stderr.write("\r\033[K")  # the line goes: the result follows on stdout
            stderr.flush()
    if current.json:
        emit_json({**report.to_json(), "horizon": utc_json(report.horizon)})
        return
    verb = "would remove" if dry_run else "removed"
    click.echo(
        f"{verb}: {report.schedule_events} schedule event(s), {report.runs} durable run(s) "
        f"with {report.run_events} event(s); {report.snapshots} snapshot(s) "
        f"(runs due before {utc_text(report.horizon)})"
    )


def _progress_line(stream: TextIO) -> Callable[[PruneProgress], None]:
    """A callback that redraws one line on ``stream``, at most every ``PROGRESS_EVERY`` s."""
    last = 0.0

    def show(progress: PruneProgress) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last < PROGRESS_EVERY:
            return
        last = now
        report = progress.report
        verb = "counted" if report.dry_run else "removed"
        if progress.phase == "runs":
            where = f"durable runs: {report.runs:,} {verb}"
        else:
            where = f"schedule events: position {progress.position:,} of {progress.head:,}"
        stream.write(
            f"\rprune: {where}; {report.schedule_events:,} schedule event(s) {verb}, "
            f"{report.events_read:,} read\033[K"
        )
        stream.flush()

    return show
