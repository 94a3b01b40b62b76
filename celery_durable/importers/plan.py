"""What every importer shares (SPEC I1, I2): check all, then store; idempotent; a report.

An importer reads its source into :class:`SourceEntry` values: the peer's own schedule object
(Celery's ``crontab`` with the row's ``tz``, ``schedule``, ``solar``) or a clocked instant,
the message it would send (args, kwargs, options with headers) and its timing state (last
run, start, end, one-off). :func:`plan` turns every entry into a schedule's content and the
moment its timing continues from, compares it with what an earlier import stored, and
refuses what cannot be scheduled, naming why, before anything is stored; :func:`apply`
stores the plan. Running an import again stores only what changed.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import TYPE_CHECKING, Any

from celery.schedules import crontab, schedule, solar

from celery_durable.beat_import import stored_value
from celery_durable.celery_schedules import crontab_rule
from celery_durable.core.ids import schedule_id_for_name
from celery_durable.core.limits import EARLIEST, check_instant
from celery_durable.core.policies import CatchUp
from celery_durable.core.rules import Every, Once, Rule, Solar, rule_from_json
from celery_durable.core.schedule_aggregate import Change, Create, ScheduleState, decide, fold_all
from celery_durable.core.schedule_events import Content, SchedulePaused
from celery_durable.errors import DurableError, InvalidSchedule
from celery_durable.message import IMPORTED

if TYPE_CHECKING:
    from celery_durable.runtime import Runtime
    from celery_durable.schedules import Schedules

log = logging.getLogger("celery_durable.importers")

UTC = timezone.utc

CREATE, CHANGE, UNCHANGED, PAUSE, RESUME, SKIP, REFUSED = (
    "create",
    "change",
    "unchanged",
    "pause",
    "resume",
    "skip",
    "refused",
)
"""What an import does with one entry (the report's ``action``)."""

NEVER_RAN_LOOKBACK = timedelta(days=365 * 30)
"""django-celery-beat's "last run 30 years ago" for a row with a start time that never ran."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceEntry:
    """One schedule of another scheduler, as its importer read it."""

    name: str
    task: str
    schedule: Any
    """A Celery schedule object (``crontab`` carrying its ``tz``, ``schedule``, ``solar``) or
    an aware ``datetime`` (a clocked row)."""
    args: Any = ()
    kwargs: Any = None
    options: Mapping[str, Any] = field(default_factory=dict)
    """The options the source passes to ``apply_async`` (``headers`` included)."""
    enabled: bool = True
    disabled_reason: str = "disabled"
    since: datetime | None = None
    """The moment the source's timing runs from (its last run); ``None``: now."""
    never_ran: bool = False
    """No last run is stored (django-celery-beat then counts from the row's last change)."""
    due_now: bool = False
    """Never ran and due at once (RedBeat)."""
    start_time: datetime | None = None
    end_at: datetime | None = None
    """No run at or after this moment (django-celery-beat's ``expires``)."""
    one_off: bool = False
    ran: bool = False
    """Already run at least once (a one-off entry that ran never runs again)."""
    description: str = ""


@dataclass(slots=True, kw_only=True)
class Item:
    """One entry of the report."""

    name: str
    schedule_id: str | None = None
    action: str = REFUSED
    rule: str = ""
    next_due: datetime | None = None
    zone: str = "UTC"
    notes: list[str] = field(default_factory=list)
    """What the import changes or keeps in words (the name mapping, start time, one-off …)."""
    changes: list[str] = field(default_factory=list)
    """What differs from the schedule an earlier import stored."""
    error: str | None = None
    content: Content | None = None
    since: datetime | None = None
    paused: str | None = None
    """The reason the schedule is (to be) paused, or ``None``."""
    source_since: datetime | None = None
    """Where the source's own timing runs from (``since`` before an overdue interval is
    moved to the import)."""

    def to_json(self) -> dict[str, Any]:
        due = self.next_due
        return {
            "name": self.name,
            "schedule_id": self.schedule_id,
            "action": self.action,
            "rule": self.rule or None,
            "next_due": None if due is None else due.astimezone(UTC).isoformat(),
            "next_due_local": None if due is None else _local(due, self.zone),
            "zone": self.zone,
            "paused": self.paused,
            "notes": list(self.notes),
            "changes": list(self.changes),
            "error": self.error,
        }


@dataclass(slots=True, kw_only=True)
class ImportPlan:
    """What an import will do (``dry_run``) or did."""

    source: str
    items: list[Item] = field(default_factory=list)
    removed: list[Item] = field(default_factory=list)
    """Schedules an earlier import stored whose entry is gone: paused."""
    applied: bool = False

    @property
    def refused(self) -> builtins.list[Item]:
        return [i for i in self.items if i.action == REFUSED]

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for item in [*self.items, *self.removed]:
            found[item.action] = found.get(item.action, 0) + 1
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "applied": self.applied,
            "counts": self.counts(),
            "entries": [i.to_json() for i in self.items],
            "removed": [i.to_json() for i in self.removed],
        }


def _local(moment: datetime, zone: str) -> str:
    from zoneinfo import ZoneInfo

    try:
        return moment.astimezone(ZoneInfo(zone)).isoformat()
    except Exception:
        return moment.astimezone(UTC).isoformat()


def _aware(moment: datetime | None, what: str) -> datetime | None:
    if moment is None:
        return None
    if moment.tzinfo is None:  # Django with USE_TZ and SQL columns keep UTC
        moment = moment.replace(tzinfo=UTC)
    return check_instant(moment.astimezone(UTC), what)


# -- one entry --------------------------------------------------------------------------------


def _bounded(rule: Rule, end_at: datetime | None, max_runs: int | None) -> Rule:
    """``rule`` with ``end_at`` and ``max_runs`` set (R6)."""
    data = dict(rule.to_json())
    if end_at is not None:
        data["end_at"] = end_at.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"
    data["max_runs"] = max_runs
    return rule_from_json(data)


def rule_of(obj: Any, app: Any, where: str) -> Rule:
    """The stored rule of a source's schedule object (B2, B3, R3, R5)."""
    if isinstance(obj, datetime):
        at = _aware(obj, f"{where}: clocked time")
        assert at is not None
        return Once(at)
    if type(obj) is schedule or (isinstance(obj, schedule) and not obj.relative):
        if obj.relative:
            raise InvalidSchedule(f"{where}: relative intervals have no stored rule")
        try:
            return Every(obj.run_every)
        except InvalidSchedule as exc:
            raise InvalidSchedule(
                f"{where}: interval {obj.run_every.total_seconds():g} s is outside "
                "1 second to 366 days (R3)",
                rule="R3",
            ) from exc
    if isinstance(obj, crontab):
        return crontab_rule(obj, app.timezone)
    if isinstance(obj, solar):
        return Solar(obj.event, float(obj.lat), float(obj.lon))
    raise InvalidSchedule(f"{where}: a {type(obj).__name__} schedule has no stored rule")


def _since(
    rule: Rule,
    last: datetime | None,
    start: datetime | None,
    *,
    never_ran: bool,
    due_now: bool,
    now: datetime,
) -> datetime | None:
    """Where the rule's timing continues from: the source's last run, moved to its start time.

    An interval is next due one interval after its last run, and not before its start time;
    a crontab or solar schedule at its first due time after both (django-celery-beat's
    ``ModelEntry.is_due``). A row with a start time that never ran counts as last run long
    ago, as django-celery-beat counts it; a RedBeat entry that never ran is due at once.
    """
    if isinstance(rule, Once):
        return None
    if due_now:
        return max(now - rule.interval, EARLIEST) if isinstance(rule, Every) else EARLIEST
    moment = last if last is not None else now
    if start is not None:
        if never_ran:
            moment = max(moment - NEVER_RAN_LOOKBACK, EARLIEST)
        if isinstance(rule, Every):
            moment = max(moment, start - rule.interval)
        elif start > now:  # django-celery-beat waits for the first due time after it
            moment = max(moment, start)
    return max(moment, EARLIEST)


def _on_time(rule: Rule, since: datetime | None, now: datetime) -> datetime | None:
    """An interval overdue at the import is due at once and counts on from the import, as
    both sources count it from the run they make at once."""
    if isinstance(rule, Every) and since is not None and since + rule.interval < now:
        return now - rule.interval
    return since


def translate(
    runtime: Runtime, schedules: Schedules, entry: SourceEntry, source: str, where_from: str | None
) -> Item:
    """The planned schedule of one entry; ``InvalidSchedule`` naming it when refused."""
    where = f"{source} entry {entry.name!r}"
    item = Item(name=entry.name)
    if not isinstance(entry.task, str) or not entry.task.strip():
        raise InvalidSchedule(f"{where}: no task name")
    now = runtime.now()
    start = _aware(entry.start_time, f"{where}: start_time")
    end_at = _aware(entry.end_at, f"{where}: expires")
    rule = rule_of(entry.schedule, runtime.app, where)
    if isinstance(rule, Once) and start is not None and start > rule.at:
        rule = Once(start)
        item.notes.append("runs at its start_time, after its clocked time")
    if end_at is not None:
        # django-celery-beat stops a row once now >= expires: no run at that instant.
        end_at -= timedelta(microseconds=1)
        item.notes.append("expires → no run after it, and the message expires")
    max_runs = 1 if entry.one_off and not isinstance(rule, Once) else None
    if max_runs:
        item.notes.append("one_off → at most 1 run")
    rule = _bounded(rule, end_at, max_runs)
    if start is not None and start > now:
        item.notes.append(f"start_time → no run before {start.isoformat()}")
    since = _since(
        rule,
        _aware(entry.since, f"{where}: last_run_at"),
        start,
        never_ran=entry.never_ran,
        due_now=entry.due_now,
        now=now,
    )
    max_bytes = runtime.config.max_input_bytes
    options = {
        k: stored_value(v, f"{where}: option {k!r}", max_bytes)
        for k, v in entry.options.items()
        if v is not None
    }
    args = stored_value(list(entry.args or ()), f"{where}: args", max_bytes)
    kwargs = stored_value(dict(entry.kwargs or {}), f"{where}: kwargs", max_bytes)
    if args:
        options["args"] = args
    if kwargs:
        options["kwargs"] = kwargs
    marker: dict[str, Any] = {"source": source, "name": entry.name}
    if where_from:
        marker["where"] = where_from
    if entry.description:
        marker["description"] = entry.description
    options[IMPORTED] = marker
    sid = schedule_id_for_name(entry.name, entry.task)
    if sid != entry.name:
        item.notes.append(f"name breaks S1 → schedule ID {sid}")
    content = schedules.check(
        sid, entry.task, None, rule, CatchUp.LATEST, dict(options), from_beat=True
    )
    if end_at is not None and end_at < now:
        item.action = SKIP
        item.notes.append("expired: nothing left to run")
    item.schedule_id, item.content = sid, content
    item.since, item.source_since = _on_time(rule, since, now), since
    item.rule = rule.describe()
    item.zone = getattr(rule, "zone", None) or str(runtime.app.timezone)
    if not entry.enabled:
        item.paused = entry.disabled_reason
    elif entry.one_off and entry.ran:
        item.paused = f"one-off entry already ran in {source}"
    return item


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
        folded = fold_all(
            ScheduleState(schedule_id=sid),
            decide(
                ScheduleState(schedule_id=sid),
                Create(content=item.content, now=now, since=item.since),
            ),
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
                events = decide(state, Change(content=item.content, now=now, since=since))
            except DurableError as exc:
                item.action, item.error = REFUSED, str(exc)
                return
            folded = fold_all(state, events)
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
    from dataclasses import replace

    return replace(state, paused=False).next_due()


def _create(content: Content, since: datetime | None, now: datetime) -> Create:
    return Create(content=content, now=now, since=since)


def _change(content: Content, since: datetime | None, now: datetime) -> Change:
    return Change(content=content, now=now, since=since)


def apply(schedules: Schedules, result: ImportPlan) -> None:
    """Store a plan: create, change, pause and resume schedules (refused items are left out)."""
    for item in result.items:
        if item.action in (REFUSED, SKIP) or item.schedule_id is None or item.content is None:
            continue
        sid, content, since = item.schedule_id, item.content, item.since
        if item.action == CREATE:
            schedules._execute(sid, partial(_create, content, since))
        elif item.action == CHANGE:
            schedules._execute(sid, partial(_change, content, since))
        state = schedules.store.load(sid)
        if item.paused is not None and not state.paused:
            schedules.pause(sid, reason=item.paused)
        elif (
            item.paused is None
            and state.paused
            and any(n.startswith("resumed") for n in item.notes)
        ):
            schedules.resume(sid)
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


__all__ = [
    "ImportPlan",
    "Item",
    "SourceEntry",
    "apply",
    "plan",
    "rule_of",
    "run_import",
]
