"""``celery durable import django-celery-beat|redbeat``: bring schedules over (SPEC I1, I2).

Every entry is checked before any is stored: when one is refused, nothing is stored (exit 2)
unless ``--skip-invalid``. ``--dry-run`` prints the same report and stores nothing. Running an
import again stores only what changed and says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from celery_durable.cli.common import (
    INVALID,
    CliError,
    creates_journal,
    echo,
    emit_json,
    invalid,
    json_option,
    option,
    session,
    table,
)
from celery_durable.presentation import utc_text

__all__ = ["import_group"]

SHOWN_ERROR = 160
"""Characters of a refusal shown in the table (the JSON has it whole)."""


@click.group("import")
def import_group() -> None:
    """Bring schedules of django-celery-beat or RedBeat into the journal (I1, I2)."""


def _common(fun: Any) -> Any:
    fun = creates_journal(fun)  # an import (also --dry-run) starts a journal where none is
    fun = option("--skip-invalid", is_flag=True, help="Import the valid entries; list the rest.")(
        fun
    )
    fun = option("--dry-run", is_flag=True, help="Show what would be done; store nothing.")(fun)
    return json_option(fun)


def _ignored(app: Any) -> dict[str, str]:
    """Entries ``-S durable`` brings over itself: ``beat_schedule`` (B1), backend cleanup (B7)."""
    found = {
        str(name): "comes from beat_schedule: -S durable imports it itself (B1)"
        for name in (app.conf.beat_schedule or {})
    }
    found.setdefault("celery.backend_cleanup", "installed by -S durable itself when needed (B7)")
    return found


def _scrubbed(read: Callable[[], Any], url: str, what: str) -> Any:
    """``read()``; an error becomes one line without the URL's password."""
    from celery_durable.store.journal.urls import password_of

    try:
        return read()
    except Exception as exc:
        message = f"cannot read {what}: {type(exc).__name__}: {exc}"
        password = password_of(url)
        if password:
            message = message.replace(password, "***")
        raise CliError(message) from None


@import_group.command("django-celery-beat")
@option(
    "--database-url",
    metavar="URL",
    help="Read the rows by database URL (SQLite, PostgreSQL, MySQL); inside a Django project "
    "they are read through its ORM.",
)
@_common
def django_celery_beat(database_url: str | None, dry_run: bool, skip_invalid: bool) -> None:
    """Copy django-celery-beat's PeriodicTask rows into durable schedules (I1)."""
    from celery_durable.importers import django_beat

    current = session()
    durable = current.durable
    if database_url:
        rows = _scrubbed(lambda: django_beat.rows_from_url(database_url), database_url, "the rows")
    elif _django_has_beat():
        rows = django_beat.rows_from_orm()
    else:
        raise invalid(
            "give --database-url URL (the database of django-celery-beat's tables), or run "
            "'manage.py durable_import_beat' inside the Django project"
        )
    entries, unreadable = django_beat.entries(rows)
    _run(durable, entries, unreadable, django_beat.SOURCE, None, dry_run, skip_invalid)


def _django_has_beat() -> bool:
    import sys

    if "django" not in sys.modules:
        return False
    from django.apps import apps

    return apps.ready and apps.is_installed("django_celery_beat")


@import_group.command("redbeat")
@option("--redis-url", metavar="URL", help="RedBeat's Redis; default: redbeat_redis_url, broker.")
@option("--key-prefix", metavar="PREFIX", help="RedBeat's key prefix; default: redbeat_key_prefix.")
@_common
def redbeat(
    redis_url: str | None, key_prefix: str | None, dry_run: bool, skip_invalid: bool
) -> None:
    """Copy RedBeat's entries in Redis into durable schedules, with their last runs (I2)."""
    from celery_durable.importers import redbeat as source

    current = session()
    durable = current.durable
    conf = durable.runtime.app.conf
    url = redis_url or conf.get("redbeat_redis_url") or conf.get("broker_url")
    if not url or not str(url).startswith(("redis://", "rediss://", "unix://")):
        raise invalid("give --redis-url URL (RedBeat's Redis)")
    prefix = key_prefix or conf.get("redbeat_key_prefix") or "redbeat:"
    entries, unreadable = _scrubbed(
        lambda: source.read_entries(str(url), prefix), str(url), "RedBeat's entries"
    )
    _run(durable, entries, unreadable, source.SOURCE, prefix, dry_run, skip_invalid)


def _run(
    durable: Any,
    entries: list[Any],
    unreadable: dict[str, str],
    source: str,
    where_from: str | None,
    dry_run: bool,
    skip_invalid: bool,
) -> None:
    from celery_durable.importers.plan import run_import

    result = run_import(
        durable.runtime,
        durable.schedules,
        entries,
        source=source,
        dry_run=dry_run,
        skip_invalid=skip_invalid,
        where_from=where_from,
        ignored=_ignored(durable.runtime.app),
        unreadable=unreadable,
    )
    refused = result.refused
    if session().json:
        emit_json(result.to_json())
    else:
        echo(report_table(result))
        echo(summary(result, dry_run))
    if refused and not skip_invalid:
        raise CliError(
            f"{len(refused)} of {len(result.items)} {source} entries refused; nothing stored "
            "(fix them, or import the rest with --skip-invalid)",
            INVALID,
        )


def report_table(result: Any) -> str:
    """Row, schedule ID, action, rule in words, next run (UTC and local), notes and refusals."""
    rows = []
    for item in [*result.items, *result.removed]:
        text = "; ".join(
            [*item.notes, *(f"changed: {c}" for c in item.changes)]
            + ([f"paused: {item.paused}"] if item.paused else [])
        )
        if item.error:
            error = item.error if len(item.error) <= SHOWN_ERROR else item.error[:SHOWN_ERROR] + "…"
            text = f"REFUSED: {error}"
        local = item.to_json()["next_due_local"]
        rows.append(
            [
                item.name,
                item.schedule_id or "-",
                item.action,
                item.rule or "-",
                utc_text(item.next_due),
                f"{local[:19].replace('T', ' ')} {item.zone}" if local else "-",
                text,
            ]
        )
    return table(
        ["row", "schedule ID", "action", "rule", "next (UTC)", "next (local)", "notes"], rows
    )


def summary(result: Any, dry_run: bool) -> str:
    counts = ", ".join(f"{n} {action}" for action, n in sorted(result.counts().items()))
    if dry_run:
        state = "dry run: nothing stored"
    elif not result.applied:
        state = "nothing stored"
    elif set(result.counts()) - {"refused"} <= {"unchanged", "skip"}:
        state = "nothing to store"
    else:
        state = "stored"
    return f"{result.source}: {counts or 'no entries'} ({state})"
