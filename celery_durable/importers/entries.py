"""One entry of another scheduler as a durable schedule (SPEC I1, I2; B2, B3, R3, R5, R6).

An importer reads its source into :class:`SourceEntry` values: the peer's own schedule object
(Celery's ``crontab`` with the row's ``tz``, ``schedule``, ``solar``) or a clocked instant,
the message it would send (args, kwargs, options with headers) and its timing state (last
run, start, end, one-off). :func:`translate` turns one into a schedule's content and the
moment its timing continues from, or raises naming why it cannot be scheduled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from celery.schedules import crontab, schedule, solar

from celery_durable.core.ids import schedule_id_for_name
from celery_durable.core.limits import EARLIEST, check_instant
from celery_durable.core.policies import CatchUp
from celery_durable.core.rules import Every, Once, Rule, Solar, rule_from_json
from celery_durable.errors import InvalidSchedule
from celery_durable.importers.beat_schedule import stored_value
from celery_durable.importers.celery_schedules import crontab_rule
from celery_durable.importers.report import SKIP, Item
from celery_durable.message import IMPORTED

if TYPE_CHECKING:
    from celery_durable.runtime import Runtime
    from celery_durable.schedules import Schedules

UTC = timezone.utc

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
    if entry.task not in runtime.app.tasks:
        item.notes.append("task not registered here: sent by name, as the source sends it (B4)")
    sid = schedule_id_for_name(entry.name, entry.task)
    if sid != entry.name:
        item.notes.append(f"name breaks S1 → schedule ID {sid}")
    content = schedules.check(
        sid, entry.task, None, rule, CatchUp.LATEST, dict(options), from_beat=True
    )
    # Unlike a beat_schedule entry (B1), an imported row is checked as `schedules create`
    # checks: args the task cannot take would fail every run (the peer fails each send too).
    from celery_durable.schedules import check_call

    try:
        check_call(runtime, sid, content, args_from=f"the {source} entry's args and kwargs")
    except InvalidSchedule as exc:
        raise InvalidSchedule(f"{where}: {exc}", field=getattr(exc, "field", None)) from None
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


__all__ = ["SourceEntry", "rule_of", "translate"]
