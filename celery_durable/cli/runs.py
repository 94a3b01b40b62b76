"""``celery durable runs …``: list runs and show one, from the schedules' decisions and the
journals of durable runs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import click

from celery_durable.cli.common import (
    DurableGroup,
    display_zone,
    echo,
    emit_json,
    fields,
    json_option,
    not_found,
    option,
    session,
    shown,
    table,
)
from celery_durable.cli.detail import durable_json
from celery_durable.cli.views import run_json
from celery_durable.core.ids import printable
from celery_durable.core.read_models import NOT_STARTED, project_run
from celery_durable.presentation import local_text, short, utc_text

SCHEDULE_STATES = ("decided", "started", "skipped", "failed_to_start")
RUN_STATUSES = (
    "queued",
    "running",
    "suspended",
    "finished",
    "faulted",
    "cancelled",
    "parked",
    "missed",
    "failed_to_start",
)
STATES = SCHEDULE_STATES + RUN_STATUSES

_SHORT = 60


@click.group(cls=DurableGroup, name="runs")
def runs() -> None:
    """Inspect the runs of schedules and of durable tasks."""


# -- reading ---------------------------------------------------------------------------------


def _runs_of(api: Any, schedule_id: str) -> list[Any]:
    return list(api.runs(schedule_id))


def status_in(rows: Mapping[str, Mapping[str, Any]], run_id: str) -> str | None:
    """The run-table ``status`` of ``run_id`` in ``rows`` (``None``: no row)."""
    row = rows.get(run_id)
    return None if row is None else str(row["status"])


def _row_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """A durable run that no schedule decided (started with ``.delay``)."""
    return {
        "run_id": row["run_id"],
        "schedule_id": None,
        "due": None,
        "due_local": None,
        "state": row["status"],
        "schedule_state": None,
        "task": row["task"],
        "reason": None,
        "decided_at": None,
        "started_at": None,
        "error": None,
        "outcome": None,
    }


@runs.command(name="list")
@option("--schedule", "schedule_id", metavar="ID", help="Only the runs of this schedule.")
@option("--state", type=click.Choice(STATES, case_sensitive=False), help="Only runs in this state.")
@option(
    "--limit",
    type=click.IntRange(0),
    default=50,
    show_default=True,
    help="Show at most this many (0: all), newest first.",
)
@json_option
def list_(schedule_id: str | None, state: str | None, limit: int) -> None:
    """List runs, newest first: the runs schedules decided and other durable runs."""
    current = session()
    durable = current.durable
    api = durable.schedules
    if schedule_id is not None:
        view = api.state(schedule_id)
        if view is None:
            raise not_found(f"schedule {shown(schedule_id)} not found")
        schedule_views = [view]
    else:
        schedule_views = api.list(include_deleted=True)
    zones = {v.id: display_zone(v, current.app) for v in schedule_views}
    # Any: ``Schedules.list`` shadows ``list`` in the library's annotations (mypy).
    views: list[Any] = [r for v in schedule_views for r in _runs_of(api, v.id)]
    rows = durable.runs.rows(None if schedule_id is None else [v.run_id for v in views])
    states = {v.run_id: project_run(v, status_in(rows, v.run_id)).state for v in views}
    items: list[tuple[datetime, dict[str, Any], Any]] = [
        (v.due, run_json(v, states[v.run_id], zones.get(v.schedule_id)), v) for v in views
    ]
    if schedule_id is None:
        known = set(states)
        items += [(r["updated_at"], _row_json(r), None) for k, r in rows.items() if k not in known]
    if state is not None:
        items = [item for item in items if item[1]["state"] == state.lower()]
    items.sort(key=lambda item: item[0], reverse=True)
    if limit:
        items = items[:limit]
    if current.json:
        emit_json([data for _, data, _ in items])
        return
    if not items:
        echo("No runs.")
        return
    table_rows = []
    # Why a run did not start (a missed start deadline, an overlap skip, a failure to start).
    reasons = any(data["schedule_state"] in NOT_STARTED for _, data, _ in items)
    for _, data, view in items:
        zone = zones.get(data["schedule_id"]) if data["schedule_id"] else None
        due = view.due if view is not None else None
        row = [data["run_id"], data["state"], utc_text(due), local_text(due, zone)]
        row.append(data["task"] or "-")
        if reasons:
            row.append(data["error"] if data["schedule_state"] in NOT_STARTED else "")
        table_rows.append(row)
    headers = ("RUN ID", "STATE", "DUE (UTC)", "DUE (LOCAL)", "TASK")
    echo(table((*headers, "REASON") if reasons else headers, table_rows))


# -- one run in detail ---------------------------------------------------------------------------


def _schedule_run(durable: Any, run_id: str) -> tuple[Any, Any]:
    """(schedule view, run view) when ``run_id`` is a run a schedule decided, else Nones."""
    from celery_durable.core.ids import parse_run_id
    from celery_durable.errors import InvalidSchedule

    try:
        schedule_id, _due = parse_run_id(run_id)
    except InvalidSchedule:
        return None, None
    schedule = durable.schedules.state(schedule_id)
    if schedule is None:
        return None, None
    for view in durable.schedules.runs(schedule_id):
        if view.run_id == run_id:
            return schedule, view
    return schedule, None


def _short(value: Any) -> str:
    return short(value, _SHORT)


def _iso(text: str | None) -> str:
    if text is None:
        return "-"
    from celery_durable.core.codec import time_from_json

    return utc_text(time_from_json(text))


@runs.command()
@click.argument("run_id")
@json_option
def show(run_id: str) -> None:
    """Show RUN_ID: its decision and start, and for durable runs each step with its
    attempts and errors."""
    from celery_durable.core.ids import run_stream

    current = session()
    durable = current.durable
    schedule, view = _schedule_run(durable, run_id)
    events = durable.journal.read_stream(run_stream(run_id))
    row = durable.runs.row(run_id)
    if view is None and not events and row is None:
        raise not_found(f"run {shown(run_id)} not found")
    zone = display_zone(schedule, current.app) if schedule is not None else None
    run_data = None
    if view is not None:
        shown_state = project_run(view, None if row is None else str(row["status"])).state
        run_data = run_json(view, shown_state, zone)
    durable_data = durable_json(events, row) if events or row is not None else None
    if durable_data is not None:
        kids = durable.children(run_id) if events else []
        durable_data["children"] = [{"run_id": rid, "state": st} for rid, st in kids]
    if current.json:
        state = run_data["state"] if run_data else (durable_data or {}).get("status")
        emit_json(
            {"run_id": run_id, "state": state, "schedule_run": run_data, "durable": durable_data}
        )
        return
    _print_run(run_id, view, schedule, zone, run_data, durable_data)


CHILDREN_SHOWN = 50
"""``runs show`` lists this many children (W13); ``--json`` gives them all."""


def _print_children(children: list[dict[str, Any]]) -> None:
    counts = Counter(child["state"] for child in children)
    summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    echo(f"\nChildren ({len(children)}: {summary})")
    rows = [(printable(c["run_id"]), c["state"]) for c in children[:CHILDREN_SHOWN]]
    echo(table(("RUN", "STATE"), rows))
    if len(children) > CHILDREN_SHOWN:
        echo(f"… and {len(children) - CHILDREN_SHOWN} more (--json lists them all)")


def _print_run(
    run_id: str,
    view: Any,
    schedule: Any,
    zone: str | None,
    run_data: dict[str, Any] | None,
    d: dict[str, Any] | None,
) -> None:
    lines: list[tuple[str, Any]] = [("Run", run_id)]
    if view is not None and run_data is not None:
        decided = f"{utc_text(view.decided_at)}  (reason: {view.reason})"
        lines += [
            ("Schedule", f"{schedule.id}  ({schedule.rule.describe()})"),
            ("Due", f"{utc_text(view.due)}  ({local_text(view.due, zone)})"),
            ("Decided", decided),
            ("Enqueued", utc_text(view.started_at) if view.started_at else None),
            ("State", run_data["state"]),
            ("Error", view.error),
        ]
    if d is not None:
        outcome = d["outcome"]
        shown = None
        if outcome is not None:
            if outcome["type"] == "finished":
                shown = f"finished: {_short(outcome['value'])}"
            elif outcome["type"] == "cancelled":
                shown = "cancelled"
            else:
                shown = f"{outcome['type']}: {outcome['error_type']}: {outcome['error']}"
        suspended = None
        if d["suspended"]:
            suspended = f"{d['suspended_reason'] or 'waiting'} until {_iso(d['suspended_until'])}"
            if d["waiting_for"]:
                suspended += f" or signal {d['waiting_for']!r}"
        pending = ", ".join(f"{k} ({n})" for k, n in sorted(d["signals_pending"].items()))
        lines += [
            ("Task", d["task"]),
            ("Parent", printable(d["parent"]) if d.get("parent") else None),
            ("Status", d["status"] if view is None else f"{d['status']} (durable run)"),
            ("Started", _iso(d["started_at"]) if d["started_at"] else None),
            ("Claimed by", f"{d['owner']} until {_iso(d['lease_until'])}" if d["owner"] else None),
            ("Suspended", suspended),
            ("Cancel", "requested" if d["cancel_requested"] else None),
            ("Signals", pending or None),
            ("Outcome", shown),
        ]
    echo(fields(lines))
    if d is not None and d.get("children"):
        _print_children(d["children"])
    if d is None or not d["steps"]:
        return
    echo("\nSteps")
    rows = []
    for step in d["steps"]:
        if step["error"] is not None:
            last = f"{step['error']['error_type']}: {step['error']['message']}"
        elif step["until"] is not None and step["status"] in ("sleeping", "waiting"):
            last = f"until {_iso(step['until'])}"
        else:
            last = _short(step["result"]) if step["status"] == "completed" else ""
        rows.append(
            (step["position"], step["name"], step["kind"], step["status"], step["attempts"], last)
        )
    echo(table(("POS", "NAME", "KIND", "STATUS", "ATTEMPTS", "RESULT / ERROR"), rows))
    failures = [(s["position"], a) for s in d["steps"] for a in s["failed_attempts"]]
    if failures:
        echo("\nFailed attempts")
        echo(
            table(
                ("POS", "ATTEMPT", "AT (UTC)", "ERROR", "RETRY AT (UTC)"),
                [
                    (
                        pos,
                        a["attempt"],
                        _iso(a["at"]),
                        f"{a['error_type']}: {a['message']}",
                        _iso(a["retry_at"]),
                    )
                    for pos, a in failures
                ],
            )
        )
