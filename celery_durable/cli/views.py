"""How schedules and runs look on the command line: their JSON forms (stable keys, listed in
docs/cli.md), status words and table rows."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from celery_durable.cli.common import (
    display_zone,
    table,
)
from celery_durable.core.read_models import NOT_STARTED
from celery_durable.message import describe_origin, origin_label
from celery_durable.presentation import local_json, local_text, status_of, utc_json, utc_text


def is_overdue(view: Any, now: datetime) -> bool:
    """Whether the schedule's next due time has passed (no run decided for it yet)."""
    return view.next_due is not None and view.next_due < now


def schedule_json(view: Any, app: Any, now: datetime | None = None) -> dict[str, Any]:
    """The stable JSON form of a schedule (keys documented in docs/cli.md); ``overdue`` is
    judged at ``now`` (``False`` without it)."""
    zone = display_zone(view, app)
    return {
        "id": view.id,
        "task": view.task,
        "input": view.input,
        "rule": view.rule.to_json(),
        "rule_text": view.rule.describe(),
        "zone": zone,
        "catch_up": view.catch_up.value,
        "overlap": view.overlap.value,
        **policy_json(view),
        "options": dict(view.options),
        "status": status_of(view),
        "paused": view.paused,
        "deleted": view.deleted,
        "complete": view.complete,
        "next_due": utc_json(view.next_due),
        "next_due_local": local_json(view.next_due, zone),
        "next_run": utc_json(view.next_run),
        "blackouts": [w.describe() for w in view.blackouts],
        "on_blackout": view.on_blackout.value,
        "overdue": now is not None and is_overdue(view, now),
        "origin": origin_label(view.task, view.options),
        "origin_text": describe_origin(view.task, view.options),
        "anchor": utc_json(view.anchor),
        "created_at": utc_json(view.created_at),
        "runs_decided": view.runs_decided,
        "last_run": utc_json(view.last_due),
        "pending": view.pending,
        "version": view.version,
    }


def policy_json(view: Any) -> dict[str, float | None]:
    """The timing policies (P1–P3) in seconds, ``None`` when off."""
    return {
        name: None if value is None else value.total_seconds()
        for name in ("start_deadline", "jitter", "catch_up_window")
        for value in [getattr(view, name)]
    }


def upcoming(view: Any, count: int) -> list[datetime]:
    """The next ``count`` due times from the schedule's next one (fewer when bounded)."""
    due = view.next_due
    rule = view.rule
    left = None if rule.max_runs is None else max(rule.max_runs - view.runs_decided, 0)
    found: list[datetime] = []
    while due is not None and len(found) < count and (left is None or len(found) < left):
        found.append(due)
        due = rule.next_after(due, anchor=view.anchor)
    return found


def fates(view: Any, dues: list[datetime], global_windows: Any) -> list[Any]:
    """What becomes of each of ``dues`` under the schedule's own and the global windows
    (P4; jitter and start deadline considered, one run per blackout)."""
    from celery_durable.core.blackout_plan import fates as plan
    from celery_durable.core.blackouts import OnBlackout

    defer = view.on_blackout is OnBlackout.DEFER
    windows = (*view.blackouts, *global_windows)
    timing = {"jitter": view.jitter, "deadline": view.start_deadline}
    return list(plan(view.id, dues, windows, defer=defer, **timing))


def run_json(view: Any, state: str, zone: str | None) -> dict[str, Any]:
    """The stable JSON form of one run of a schedule."""
    return {
        "run_id": view.run_id,
        "schedule_id": view.schedule_id,
        "due": utc_json(view.due),
        "due_local": local_json(view.due, zone),
        "state": state,
        "schedule_state": view.state,
        "task": view.task,
        "reason": view.reason,
        "decided_at": utc_json(view.decided_at),
        "started_at": utc_json(view.started_at),
        "error": view.error,
        "outcome": view.outcome,
    }


def run_rows(
    views: list[Any], states: Mapping[str, str], zones: Mapping[str, str], *, with_schedule: bool
) -> str:
    rows = []
    # Why a run did not start (a missed start deadline, an overlap skip, a failure to start).
    reasons = any(v.state in NOT_STARTED for v in views)
    for view in views:
        zone = zones.get(view.schedule_id)
        row = [view.run_id, states[view.run_id], utc_text(view.due), local_text(view.due, zone)]
        row.append(view.task or "-")
        if reasons:
            row.append(view.error if view.state in NOT_STARTED else "")
        rows.append(row)
    headers = ("RUN ID", "STATE", "DUE (UTC)", "DUE (LOCAL)", "TASK")
    return table((*headers, "REASON") if reasons else headers, rows)
