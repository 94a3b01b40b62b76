"""Who changed a schedule and why (O5): checking the audit fields, reading the history back.

Each command (create, change, pause, resume, delete, trigger, backfill) may carry ``by`` (who)
and ``reason`` (why); they are stored on the command's events (a trigger's or backfill's
``RunDecided`` keeps the reason as ``note``: its ``reason`` names the kind of decision). The
history is those events in order, each with what it changed; the runs of one backfill make one
entry. Pure: the events are read by the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from celery_durable.core.ids import check_text, first_control
from celery_durable.core.schedule_events import (
    Audited,
    Content,
    RunDecided,
    ScheduleChanged,
    ScheduleCreated,
    ScheduleDeleted,
    ScheduleEvent,
    SchedulePaused,
    ScheduleResumed,
)
from celery_durable.core.secrets import SECRETS_OPTION, shown_input, shown_options
from celery_durable.errors import InvalidSchedule

MAX_BY_LENGTH = 200
"""Longest ``by`` accepted (a user name, an e-mail address, a service name)."""

MAX_REASON_LENGTH = 1000
"""Longest ``reason`` accepted."""


def check_audit(by: str | None, reason: str | None) -> None:
    """Refuse an unstorable ``by`` or ``reason`` before anything is stored (``InvalidSchedule``).

    Both are optional; given, each must be non-blank text without control or format characters
    (a newline would forge a line of the history, an ESC drive a terminal).
    """
    for value, what, limit in ((by, "by", MAX_BY_LENGTH), (reason, "reason", MAX_REASON_LENGTH)):
        if value is None:
            continue
        check_text(value, what, max_length=limit, rule="O5")
        char = first_control(value)
        if char is not None:
            raise InvalidSchedule(
                f"{what} contains the control or format character U+{ord(char):04X}",
                field=what,
                rule="O5",
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryEntry:
    """One command stored on a schedule: when, which, who, why and what it changed (O5)."""

    at: datetime
    action: str
    """``created``, ``changed``, ``paused``, ``resumed``, ``deleted``, ``triggered`` or
    ``backfilled``."""
    by: str | None = None
    reason: str | None = None
    changes: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    """Field name → (before, after), in the content's JSON form; only what differs."""


_ACTIONS: dict[type, str] = {
    ScheduleCreated: "created",
    ScheduleChanged: "changed",
    SchedulePaused: "paused",
    ScheduleResumed: "resumed",
    ScheduleDeleted: "deleted",
}


def content_changes(before: Content | None, after: Content) -> dict[str, tuple[Any, Any]]:
    """The content fields that differ, with their JSON values before and after.

    Input, args and kwargs read as ``schedules.state`` shows them (P5): references as
    :class:`~celery_durable.core.secrets.Secret`, the user's own dicts unescaped, no mark.
    """
    old = {} if before is None else before.to_json()
    new = after.to_json()
    # Compared as stored, but for the mark (a Secret equals the lookalike dict it is not);
    # shown as read.
    old_shown, new_shown = _shown(old), _shown(new)
    return {
        name: (old_shown.get(name), new_shown.get(name))
        for name in [*new, *(k for k in old if k not in new)]
        if _unmarked(old, name) != _unmarked(new, name)
    }


def _unmarked(content: Mapping[str, Any], name: str) -> Any:
    value = content.get(name)
    if name == "options" and isinstance(value, Mapping) and SECRETS_OPTION in value:
        return {k: v for k, v in value.items() if k != SECRETS_OPTION}
    return value


def _shown(content: Mapping[str, Any]) -> dict[str, Any]:
    options = content.get("options") or {}
    if SECRETS_OPTION not in options:
        return dict(content)
    return {
        **content,
        "input": shown_input(content.get("input"), options),
        "options": shown_options(options),
    }


def history_of(events: Iterable[ScheduleEvent]) -> list[HistoryEntry]:
    """The commands among a schedule's events, oldest first (run events are left out)."""
    entries: list[HistoryEntry] = []
    content: Content | None = None
    for event in events:
        if isinstance(event, RunDecided):
            if event.reason in ("trigger", "backfill"):
                entries.append(_requested(event, entries))
            continue
        action = _ACTIONS.get(type(event))
        if action is None:
            continue
        changes: dict[str, tuple[Any, Any]] = {}
        if isinstance(event, (ScheduleCreated, ScheduleChanged)):
            changes = content_changes(content, event.content)
            content = event.content
        elif isinstance(event, SchedulePaused):
            changes = {"paused": (False, True)}
        elif isinstance(event, ScheduleResumed):
            changes = {"paused": (True, False)}
        elif isinstance(event, ScheduleDeleted):
            changes = {"deleted": (False, True)}
        entries.append(
            HistoryEntry(
                at=event.at,
                action=action,
                by=event.by if isinstance(event, Audited) else None,
                reason=event.reason if isinstance(event, Audited) else None,
                changes=changes,
            )
        )
    return entries


def _requested(event: RunDecided, entries: list[HistoryEntry]) -> HistoryEntry:
    """A trigger's entry; the runs of one backfill (one append, one moment) make one entry."""
    if event.reason == "trigger":
        changes: dict[str, tuple[Any, Any]] = {"run": (None, event.run_id)}
        return HistoryEntry(
            at=event.at, action="triggered", by=event.by, reason=event.note, changes=changes
        )
    first, count = event.run_id, 1
    last = entries[-1] if entries else None
    if last is not None and (last.action, last.at, last.by, last.reason) == (
        "backfilled", event.at, event.by, event.note
    ):  # fmt: skip
        entries.pop()
        first, count = last.changes["runs"][1]["first"], last.changes["runs"][1]["count"] + 1
    runs = {"first": first, "last": event.run_id, "count": count}
    return HistoryEntry(
        at=event.at,
        action="backfilled",
        by=event.by,
        reason=event.note,
        changes={"runs": (None, runs)},
    )


__all__ = ["HistoryEntry", "check_audit", "content_changes", "history_of"]
