"""``celery durable run …``: read the result of a durable run, cancel it, signal it."""

from __future__ import annotations

import json
from typing import Any

import click

from celery_durable.cli import parse
from celery_durable.cli.common import (
    NOT_ENDED,
    RUN_NOT_OK,
    CliError,
    DurableGroup,
    emit_json,
    invalid,
    json_option,
    not_found,
    option,
    session,
)


@click.group(cls=DurableGroup, name="run")
def run() -> None:
    """Act on one durable run: read its result, cancel it, signal it."""


@run.command()
@click.argument("run_id")
@option(
    "--timeout",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    help="Seconds to wait for the run to end (0: look once).",
)
@option("--wait", is_flag=True, help="Wait until the run ends, however long it takes.")
@json_option
def result(run_id: str, timeout: float, wait: bool) -> None:
    """Print the result of durable run RUN_ID as JSON.

    Exit 5 when it faulted or was cancelled, 6 when it has not ended yet, 3 when it never
    started.
    """
    from celery_durable.core.outcomes import Cancelled, Finished

    current = session()
    try:
        found = current.durable.outcome(run_id, None if wait else timeout)
    except LookupError:
        raise not_found(f"no durable run {run_id!r} has started") from None
    except TimeoutError:
        waited = "" if not timeout else f" within {timeout:g} s"
        raise CliError(f"run {run_id!r} has not ended{waited}", NOT_ENDED) from None
    if isinstance(found, Finished):
        if current.json:
            emit_json({"run_id": run_id, "outcome": "finished", "value": found.value})
        else:
            click.echo(json.dumps(found.value, indent=2, ensure_ascii=False))
        return
    if isinstance(found, Cancelled):
        data: dict[str, Any] = {"run_id": run_id, "outcome": "cancelled"}
        message = f"run {run_id!r} was cancelled"
    else:
        kind = "parked" if found.kind == "parked" else "faulted"
        data = {
            "run_id": run_id,
            "outcome": kind,
            "error": found.error,
            "error_type": found.error_type,
            "kind": found.kind,
        }
        message = f"run {run_id!r} {kind}: {found.error_type}: {found.error}"
    if current.json:
        emit_json(data)
    raise CliError(message, RUN_NOT_OK)


@run.command()
@click.argument("run_id")
@json_option
def cancel(run_id: str) -> None:
    """Ask durable run RUN_ID to stop: its body sees a cancelled StepFailed at its next step."""
    current = session()
    try:
        stored = current.durable.cancel(run_id)
    except LookupError:
        raise not_found(f"no durable run {run_id!r} has started") from None
    if current.json:
        emit_json({"run_id": run_id, "cancel_requested": stored})
    elif stored:
        click.echo(f"cancel requested for run {run_id!r}")
    else:
        click.echo(f"run {run_id!r} has ended or a cancel was already requested; nothing done")


@run.command()
@click.argument("run_id")
@click.argument("name")
@option("--payload", metavar="JSON", help="The signal's payload (JSON; default null).")
@json_option
def signal(run_id: str, name: str, payload: str | None) -> None:
    """Send signal NAME to durable run RUN_ID (kept until the run waits for it)."""
    current = session()
    if not name.strip():
        raise invalid("the signal name must not be blank")
    value = None if payload is None else parse.json_value(payload, "--payload")
    current.durable.signal(run_id, name, value)
    if current.json:
        emit_json({"run_id": run_id, "signal": name, "stored": True})
    else:
        click.echo(f"signal {name!r} stored for run {run_id!r}")
