"""``celery durable index rebuild`` and ``celery durable db init``."""

from __future__ import annotations

import click

from celery_durable.cli.common import DurableGroup, emit_json, json_option, option, session


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
def init(sql: bool) -> None:
    """Create the journal's tables (idempotent) and record the schema version."""
    from celery_durable.store.journal.schema import SCHEMA_VERSIONS, ddl, metadata
    from celery_durable.store.journal.urls import normalize_url, redact

    current = session()
    url = current.durable.config.url
    dialect = normalize_url(url).get_backend_name()
    if sql:
        text = ddl(url)
        if current.json:
            emit_json({"url": redact(url), "dialect": dialect, "sql": text})
        else:
            click.echo(f"-- celery_durable schema for {dialect} ({redact(url)})\n")
            click.echo(text.rstrip("\n"))
        return
    current.durable.journal.ensure_ready()
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
