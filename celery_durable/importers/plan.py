"""What every importer shares (SPEC I1, I2): check all, then store; idempotent.

:func:`plan` turns every entry into a schedule's content (:mod:`.entries`), compares it with
what an earlier import stored, and refuses what cannot be scheduled, naming why, before
anything is stored; :func:`apply` stores the plan. Running an import again stores only what
changed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from celery_durable.core.schedule_aggregate import Change, Create, ScheduleState, decide_all
from celery_durable.core.schedule_events import Content, SchedulePaused
from celery_durable.errors import DurableError
from celery_durable.importers.entries import SourceEntry, translate
from celery_durable.importers.report import (
    CHANGE,
    CREATE,
    PAUSE,
    REFUSED,
    RESUME,
    SKIP,
    UNCHANGED,
    ImportPlan,
    Item,
)
from celery_durable.message import IMPORTED

if TYPE_CHECKING:
    from celery_durable.runtime import Runtime
    from celery_durable.schedules import Schedules

log = logging.getLogger("celery_durable.importers")

# -- the whole import ---------------------------------------------------------------------------


def _marker(state: ScheduleState) -> Mapping[str, Any] | None:
    if state.content is None:
        return None
    found = state.content.options.get(IMPORTED)
    return found if isinstance(found, Mapping) else None


def _ours(state: ScheduleState, source: str, where_from: str | None) -> bool:
    marker = _marker(state)
    return (
        marker is not None
        and marker.get("source") == source
        and (marker.get("where") == where_from)
    )


def _diff(old: Content, new: Content) -> list[str]:
    a, b = old.to_json(), new.to_json()
    changed = [k for k in ("task", "rule", "catch_up", "overlap") if a.get(k) != b.get(k)]
    old_options, new_options = dict(a["options"]), dict(b["options"])
    keys = sorted(set(old_options) | set(new_options))
    changed += [f"option {k}" for k in keys if old_options.get(k) != new_options.get(k)]
    return changed


def _last_pause_reason(schedules: Schedules, sid: str) -> str | None:
    pauses = [e for e in schedules.store.events(sid) if isinstance(e, SchedulePaused)]
    return pauses[-1].reason if pauses else None


def plan(
    runtime: Runtime,
    schedules: Schedules,
    entries: Iterable[SourceEntry],
    *,
    source: str,
    where_from: str | None = None,
    ignored: Mapping[str, str] | None = None,
    unreadable: Mapping[str, str] | None = None,
) -> ImportPlan:
    """Check every entry and decide what to store; nothing is stored here.

    ``ignored``: entry names left out on purpose, with the reason (reported as skipped).
    ``unreadable``: entries the reader could not read, with the reason (refused).
    """
    result = ImportPlan(source=source)
    result.items.extend(
        Item(name=name, action=REFUSED, error=reason) for name, reason in (unreadable or {}).items()
    )
    ignored = dict(ignored or {})
    states = {s.schedule_id: s for s in schedules.store.load_all()}
    by_name = {
        m["name"]: sid
        for sid, s in states.items()
        if _ours(s, source, where_from) and (m := _marker(s)) is not None and not s.deleted
    }
    taken: dict[str, str] = {}
    seen: set[str] = set(unreadable or ())
    now = runtime.now()
    for entry in entries:
        seen.add(entry.name)
        if entry.name in ignored:
            result.items.append(Item(name=entry.name, action=SKIP, notes=[ignored[entry.name]]))
            continue
        try:
            item = translate(runtime, schedules, entry, source, where_from)
        except (DurableError, ValueError, TypeError, KeyError) as exc:
            result.items.append(Item(name=entry.name, action=REFUSED, error=str(exc)))
            continue
        sid = by_name.get(entry.name, item.schedule_id)
        assert sid is not None and item.content is not None
        item.schedule_id = sid
        if sid in taken:
            item.action, item.error = (
                REFUSED,
                f"maps to schedule ID {sid!r}, already taken by entry {taken[sid]!r}",
            )
            result.items.append(item)
            continue
        taken[sid] = entry.name
        _compare(schedules, item, states.get(sid), source, where_from, now)
        result.items.append(item)
    for sid, state in states.items():
        marker = _marker(state)
        if (
            marker is not None
            and _ours(state, source, where_from)
            and marker.get("name") not in seen
            and not state.deleted
            and not state.paused
        ):
            result.removed.append(
                Item(
                    name=str(marker.get("name")),
                    schedule_id=sid,
                    action=PAUSE,
                    paused=f"removed from {source}",
                    rule=state.content.rule.describe() if state.content else "",
                )
            )
    return result


def _compare(
    schedules: Schedules,
    item: Item,
    state: ScheduleState | None,
    source: str,
    where_from: str | None,
    now: datetime,
) -> None:
    """Set the item's action against what is stored, and its next due time after it."""
    assert item.content is not None and item.schedule_id is not None
    sid = item.schedule_id
    if state is None or not state.exists:
        if item.action == SKIP:
            return
        if state is not None and state.deleted:
            item.action, item.error = (
                REFUSED,
                f"schedule {sid!r} was deleted; its ID cannot be reused",
            )
            return
        item.action = CREATE
        _, folded = decide_all(
            ScheduleState(schedule_id=sid),
            [Create(content=item.content, now=now, since=item.since)],
        )
    else:
        if state.deleted:
            item.action, item.error = (
                REFUSED,
                f"schedule {sid!r} was deleted; its ID cannot be reused",
            )
            return
        if not _ours(state, source, where_from):
            item.action = REFUSED
            item.error = f"schedule ID {sid!r} is taken by a schedule not imported from {source}"
            return
        assert state.content is not None
        item.changes = _diff(state.content, item.content)
        # The source's timing moves the schedule's only while this schedule has run nothing,
        # and only forward: the source ran again since the last import.
        since = item.since if state.runs_decided == 0 else None
        moved = (
            since is not None
            and item.source_since is not None
            and state.anchor is not None
            and item.source_since > state.anchor
        )
        if moved and not item.changes:
            item.changes.append("last run")
        if not item.changes:
            since = None
        if item.action == SKIP:
            item.action = UNCHANGED
            item.changes = []
            folded = state
        elif item.changes:
            item.action = CHANGE
            try:
                _, folded = decide_all(state, [Change(content=item.content, now=now, since=since)])
            except DurableError as exc:
                item.action, item.error = REFUSED, str(exc)
                return
            item.since = since
        else:
            item.action = UNCHANGED
            folded = state
        if item.paused is None and state.paused:
            reason = _last_pause_reason(schedules, sid) or ""
            if reason.startswith(_OUR_PAUSES):
                item.action = RESUME if item.action == UNCHANGED else item.action
                item.notes.append(f"resumed (was paused: {reason})")
            else:
                item.paused = reason or "paused"
                item.notes.append("paused by someone else: left paused")
                return
        elif item.paused is not None and state.paused:
            item.next_due = None
            return
        elif item.paused is not None and item.action == UNCHANGED:
            item.action = PAUSE
    item.next_due = None if item.paused else _next_due(folded)
    if item.next_due is not None and item.next_due < now:
        item.next_due = now
        item.notes.append("overdue: runs at once (catch-up: latest)")


_OUR_PAUSES = ("disabled in ", "removed from ", "one-off entry already ran")


def _next_due(state: ScheduleState) -> datetime | None:
    if not state.exists:
        return None
    return replace(state, paused=False).next_due()


def _create(content: Content, since: datetime | None, reason: str, now: datetime) -> Create:
    return Create(content=content, now=now, since=since, reason=reason)


def _change(content: Content, since: datetime | None, reason: str, now: datetime) -> Change:
    return Change(content=content, now=now, since=since, reason=reason)


def apply(schedules: Schedules, result: ImportPlan) -> None:
    """Store a plan: create, change, pause and resume schedules (refused items are left out)."""
    for item in result.items:
        if item.action in (REFUSED, SKIP) or item.schedule_id is None or item.content is None:
            continue
        sid, content, since = item.schedule_id, item.content, item.since
        why = f"imported from {result.source}"  # the schedule's history says so (O5)
        if item.action == CREATE:
            schedules._execute(sid, partial(_create, content, since, why))
        elif item.action == CHANGE:
            schedules._execute(sid, partial(_change, content, since, why))
        state = schedules.store.load(sid)
        if item.paused is not None and not state.paused:
            schedules.pause(sid, reason=item.paused)
        elif (
            item.paused is None
            and state.paused
            and any(n.startswith("resumed") for n in item.notes)
        ):
            schedules.resume(sid, reason=why)
        if item.action != UNCHANGED or item.paused:
            log.info("%s: %s %s → %s", result.source, item.action, item.name, sid)
    for item in result.removed:
        assert item.schedule_id is not None
        schedules.pause(item.schedule_id, reason=item.paused)
        log.warning("schedule %r paused: %s", item.schedule_id, item.paused)
    result.applied = True


def run_import(
    runtime: Runtime,
    schedules: Schedules,
    entries: Iterable[SourceEntry],
    *,
    source: str,
    dry_run: bool = False,
    skip_invalid: bool = False,
    where_from: str | None = None,
    ignored: Mapping[str, str] | None = None,
    unreadable: Mapping[str, str] | None = None,
) -> ImportPlan:
    """Plan an import and, unless ``dry_run`` or an entry is refused without
    ``skip_invalid``, store it (I1: all or nothing)."""
    result = plan(
        runtime,
        schedules,
        entries,
        source=source,
        where_from=where_from,
        ignored=ignored,
        unreadable=unreadable,
    )
    if not dry_run and (skip_invalid or not result.refused):
        apply(schedules, result)
    return result


__all__ = ["ImportPlan", "Item", "SourceEntry", "apply", "plan", "run_import"]
