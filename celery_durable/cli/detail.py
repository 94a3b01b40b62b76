"""The detail of a durable run, read from its journal stream: status, outcome, and each
position of its body with its attempts and errors (``runs show``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_durable.presentation import utc_json


def _steps(events: list[Any], state: Any) -> list[dict[str, Any]]:
    """Each position of a durable run with its attempts and errors, from its events."""
    from celery_durable.core import run_aggregate as replay
    from celery_durable.core.branches import position_order

    steps: dict[int | str, dict[str, Any]] = {}
    for event in events:
        data = event.data
        if "position" not in data or event.type == replay.RUN_PARKED:
            continue
        position = replay.position_id(data["position"])
        step = steps.setdefault(
            position,
            {
                "position": position,
                "name": data.get("name"),
                "kind": data.get("kind"),
                "status": "started",
                "attempts": 0,
                "started_at": utc_json(event.recorded_at),
                "ended_at": None,
                "result": None,
                "error": None,
                "until": None,
                "failed_attempts": [],
            },
        )
        if event.type == replay.STEP_ATTEMPT_FAILED:
            step["failed_attempts"].append(
                {
                    "attempt": data.get("attempt"),
                    "at": utc_json(event.recorded_at),
                    "failure": data.get("failure"),
                    "error_type": data.get("error_type"),
                    "message": data.get("message"),
                    "retry_at": data.get("retry_at"),
                }
            )
        elif event.type in (replay.STEP_COMPLETED, replay.SIGNAL_CONSUMED):
            step["ended_at"] = utc_json(event.recorded_at)
            step["attempts"] = int(data.get("attempt") or len(step["failed_attempts"]) + 1)
        elif event.type == replay.STEP_FAILED:
            step["ended_at"] = utc_json(event.recorded_at)
            step["attempts"] = int(data.get("attempts") or len(step["failed_attempts"]))
            step["error"] = {
                "failure": data.get("failure"),
                "error_type": data.get("error_type"),
                "message": data.get("message"),
            }
        elif event.type == replay.SIGNAL_TIMED_OUT:
            step["ended_at"] = utc_json(event.recorded_at)
        elif event.type in (replay.SLEEP_STARTED, replay.SIGNAL_WAIT_STARTED):
            step["until"] = data.get("wake_at") or data.get("until")
    for position, step in steps.items():
        record = state.positions.get(position)
        if record is not None:
            step["status"] = record.status
            if record.status == "completed":
                step["result"] = record.result
        if not step["attempts"]:
            step["attempts"] = len(step["failed_attempts"]) + (
                1 if step["status"] in ("started", "completed") and step["kind"] == "step" else 0
            )
    return [steps[p] for p in sorted(steps, key=position_order)]


def _outcome_json(state: Any) -> dict[str, Any] | None:
    from celery_durable.core.outcomes import Faulted, Finished
    from celery_durable.run_control import outcome_of

    found = outcome_of(state)
    if found is None:
        return None
    if isinstance(found, Finished):
        return {"type": "finished", "value": found.value}
    if isinstance(found, Faulted):
        kind = "parked" if found.kind == "parked" else "faulted"
        return {
            "type": kind,
            "error": found.error,
            "error_type": found.error_type,
            "kind": found.kind,
        }
    return {"type": "cancelled"}


def durable_json(events: list[Any], row: Mapping[str, Any] | None) -> dict[str, Any]:
    from celery_durable.core import run_aggregate as replay
    from celery_durable.message import sent_parent

    state = replay.fold(events)
    started = next((e for e in events if e.type == replay.RUN_STARTED), None)
    message = state.message or {}
    outcome = _outcome_json(state)
    status = row["status"] if row is not None else (outcome["type"] if outcome else "running")
    return {
        "task": state.task or (row["task"] if row is not None else None),
        "status": status,
        "parent": state.parent or sent_parent(None if row is None else row.get("message")),
        "started_at": utc_json(started.recorded_at) if started is not None else None,
        "updated_at": utc_json(row["updated_at"]) if row is not None else None,
        "args": message.get("args"),
        "kwargs": message.get("kwargs"),
        "owner": state.claim.owner if state.claim is not None else None,
        "lease_until": utc_json(state.claim.lease_until) if state.claim is not None else None,
        "suspended": state.suspended,
        "suspended_until": utc_json(state.suspended_until) if state.suspended else None,
        "suspended_reason": state.suspended_reason if state.suspended else None,
        "waiting_for": state.suspended_wait if state.suspended else None,
        "cancel_requested": state.cancel_requested,
        "signals_pending": {name: len(q) for name, q in state.signals.items() if q},
        "outcome": outcome,
        "parked": (
            None if state.parked is None else {k: v for k, v in state.parked.items() if k != "v"}
        ),
        "steps": _steps(events, state),
    }
