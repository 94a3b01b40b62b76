"""Bring ``app.conf.beat_schedule`` into the journal at beat start-up (SPEC B1–B8).

Each entry becomes a durable schedule whose ID is the entry's name (or its mapping by
:func:`~celery_durable.core.ids.schedule_id_for_name` when the name breaks S1). The rule is the
stored rule that expresses the entry's schedule object exactly; an object no stored rule can
express (custom ``BaseSchedule`` subclasses, ``relative=True``, overridden ``is_due``) becomes
a :class:`~celery_durable.core.rules.BeatEntry` rule that asks the live object, as stock beat does.

An entry is refused only where stock beat could not run it either; a refused entry is logged
with its name and the others are imported. Entries removed since the last start are paused
(B6); schedules created at run time are never touched.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from celery.beat import BeatLazyFunc
from celery.schedules import crontab, maybe_schedule, schedule, solar

from celery_durable.beat_objects import BeatObjects
from celery_durable.core import policies
from celery_durable.core.codec import check_json_value, encode_celery_value
from celery_durable.core.ids import schedule_id_for_name
from celery_durable.core.policies import CatchUp
from celery_durable.core.rules import BeatEntry, Every, Rule
from celery_durable.core.schedule_aggregate import Change, Create
from celery_durable.core.schedule_events import Content, SchedulePaused
from celery_durable.core.secrets import encode_secrets
from celery_durable.errors import DurableError, InvalidSchedule
from celery_durable.importers.celery_schedules import crontab_rule, solar_rule
from celery_durable.message import BEAT_ENTRY, BEAT_ORIGIN, describe_origin, origin_label

if TYPE_CHECKING:
    from celery import Celery

    from celery_durable.core.schedule_aggregate import ScheduleState
    from celery_durable.runtime import Runtime
    from celery_durable.schedules import Schedules

log = logging.getLogger("celery_durable.beat")

POLICY_FIELDS: tuple[str, ...] = getattr(policies, "POLICY_FIELDS", ())
"""The timing policies (P1–P3) this version has; entry options by these names are not sent."""

REMOVED = "removed from beat_schedule"
"""The reason stored with the pause of a schedule whose entry is gone (B6)."""

ENTRY_KEYS = frozenset(
    ("task", "schedule", "args", "kwargs", "options", "relative", "last_run_at", "total_run_count")
)
"""The keys ``celery.beat.ScheduleEntry`` accepts; stock beat refuses any other."""

NOT_SENT = ("task_id", "producer")
"""Entry options the durable scheduler sets itself: the run ID is the task id (S3)."""

_RULE_METHODS = ("is_due", "remaining_estimate", "remaining_delta", "now")


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What one import did, by entry name / schedule ID."""

    imported: dict[str, str] = field(default_factory=dict)
    """entry name → schedule ID, for every entry accepted."""
    refused: dict[str, str] = field(default_factory=dict)
    """entry name → why it was refused."""
    paused: list[str] = field(default_factory=list)
    """Schedule IDs paused because their entry is gone."""
    resumed: list[str] = field(default_factory=list)
    """Schedule IDs resumed because their entry came back."""
    created: list[str] = field(default_factory=list)
    """Schedule IDs created by this import (first start with the entry)."""
    changed: list[str] = field(default_factory=list)
    """Schedule IDs whose content this import changed (the entry was edited, A2)."""
    notes: dict[str, str] = field(default_factory=dict)
    """Schedule ID → where it came from, for entries the project did not write (B7)."""

    @property
    def stored(self) -> bool:
        """Whether the import stored anything: an unchanged ``beat_schedule`` stores nothing."""
        return bool(self.created or self.changed or self.paused or self.resumed)


def _overrides(obj: object, base: type, names: tuple[str, ...]) -> bool:
    """Whether ``obj``'s class replaces any of ``names`` defined by ``base``."""
    cls = type(obj)
    return any(getattr(cls, n, None) is not getattr(base, n, None) for n in names)


def describe(obj: object) -> str:
    """A stable description of a schedule object (no memory addresses)."""
    text = repr(obj)
    if " object at 0x" in text:
        cls = type(obj)
        text = f"{cls.__module__}.{cls.__qualname__}"
    return text[:200]


def rule_for(obj: Any, name: str, app: Celery, live: BeatObjects | None = None) -> Rule:
    """The stored rule of a ``beat_schedule`` entry's schedule object (B2, B3, B8).

    A rule that asks the object itself binds it in ``live`` (the beat's runtime holds them).
    """
    if type(obj) is schedule and not obj.relative:
        try:
            return Every(obj.run_every)
        except InvalidSchedule:
            pass  # below 1 s or above 366 days: the object itself is asked
    elif isinstance(obj, crontab) and not _overrides(obj, crontab, _RULE_METHODS):
        return _stored_crontab(obj, app)
    elif isinstance(obj, solar) and not _overrides(obj, solar, _RULE_METHODS):
        return _stored_solar(obj)
    if not callable(getattr(obj, "is_due", None)):
        raise InvalidSchedule(
            f"beat_schedule entry {name!r}: its schedule {describe(obj)} has no is_due(); "
            "stock beat cannot run it either"
        )
    return _asked(obj, name, live)


def _asked(obj: Any, name: str, live: BeatObjects | None) -> BeatEntry:
    """A rule that asks the live object, which the beat process holds (B3)."""
    stock = next((c for c in (crontab, solar, schedule) if isinstance(obj, c)), None)
    on_grid = stock is not None and not _overrides(obj, stock, ("is_due",))
    if live is not None:
        live.bind(name, obj, on_grid=on_grid)
    return BeatEntry(name, describe(obj))


def _stored_crontab(obj: crontab, app: Celery) -> Rule:
    """Celery's crontab as the stored ``Crontab`` rule, with Celery's semantics (B2)."""
    return crontab_rule(obj, app.timezone)


def _stored_solar(obj: solar) -> Rule:
    """Celery's solar as the stored ``Solar`` rule (B3)."""
    return solar_rule(obj)


def as_sent(value: Any) -> Any:
    """A value as Celery's JSON serializer sends it: tuples become lists, keys become text."""
    if isinstance(value, (list, tuple)):
        return [as_sent(v) for v in value]
    if isinstance(value, dict):
        return {
            k if isinstance(k, str) else json.dumps(k).strip('"'): as_sent(v)
            for k, v in value.items()
        }
    return value


def stored_value(value: Any, what: str, max_bytes: int) -> Any:
    """``value`` in the typed JSON form of B5, refused when it holds a ``BeatLazyFunc``."""
    if any(isinstance(v, BeatLazyFunc) for v in _leaves(value)):
        raise InvalidSchedule(
            f"{what} holds a BeatLazyFunc; the durable scheduler stores arguments when the "
            "schedule is imported, so it cannot call it at each run"
        )
    stored, _ = encode_secrets(value)  # P5: references, and user dicts that look like one
    return check_json_value(encode_celery_value(stored, what), what, max_bytes=max_bytes)


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(v)]
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    return [value]


def translate(runtime: Runtime, schedules: Schedules, name: str, entry: Any) -> tuple[str, Content]:
    """The schedule ID and content of one entry; ``InvalidSchedule`` naming it when refused."""
    where = f"beat_schedule entry {name!r}"
    if not isinstance(entry, Mapping):
        raise InvalidSchedule(f"{where}: expected a dict, got {type(entry).__name__}")
    unknown = sorted(set(entry) - ENTRY_KEYS, key=str)
    if unknown:
        raise InvalidSchedule(f"{where}: unknown key {unknown[0]!r} (stock beat refuses it too)")
    task = entry.get("task")
    if not isinstance(task, str) or not task.strip():
        raise InvalidSchedule(f"{where}: 'task' must name a task, got {task!r}")
    app = runtime.app
    obj = maybe_schedule(entry.get("schedule"), bool(entry.get("relative", False)), app=app)
    if obj is None:
        raise InvalidSchedule(f"{where}: 'schedule' is missing")
    rule = rule_for(obj, name, app, runtime.beat_objects)
    options = dict(entry.get("options") or {})
    deadline = app.conf.get("beat_cron_starting_deadline")
    # B7: stock beat skips a missed crontab run older than the deadline: a catch-up window
    # (P3). CatchUp.NONE runs no missed run at all, so it needs no window.
    if (
        deadline is not None
        and isinstance(obj, crontab)
        and not isinstance(rule, BeatEntry)
        and CatchUp.parse(options.get("catch_up", CatchUp.LATEST)) is not CatchUp.NONE
    ):
        options.setdefault("catch_up_window", timedelta(seconds=deadline))
    catch_up = CatchUp.parse(options.pop("catch_up", CatchUp.LATEST))
    overlap = options.pop("overlap", "allow")
    timing = {k: options.pop(k) for k in POLICY_FIELDS if k in options}
    for key in NOT_SENT:
        if key in options:
            options.pop(key)
            log.warning("%s: option %r is replaced by the durable scheduler's own", where, key)
    max_bytes = runtime.config.max_input_bytes
    stored = {k: stored_value(v, f"{where}: option {k!r}", max_bytes) for k, v in options.items()}
    if runtime.is_durable(task):
        # A durable task's input is plain JSON (A1): the input check refuses other values.
        args, kwargs = as_sent(list(entry.get("args") or ())), as_sent(entry.get("kwargs") or {})
        input_ = args[0] if len(args) == 1 else (kwargs or None)
    else:
        args = stored_value(list(entry.get("args") or ()), f"{where}: args", max_bytes)
        kwargs = stored_value(dict(entry.get("kwargs") or {}), f"{where}: kwargs", max_bytes)
        input_ = None
        if args:
            stored["args"] = args
        if kwargs:
            stored["kwargs"] = kwargs
    stored[BEAT_ENTRY] = name
    sid = schedule_id_for_name(name, task)
    content = schedules.check(
        sid, task, input_, rule, catch_up, dict(stored, overlap=overlap, **timing), from_beat=True
    )
    return sid, content


class _HasSchedules(Protocol):
    """What :func:`import_beat_schedule` needs of a ``Durable``."""

    @property
    def runtime(self) -> Runtime: ...
    @property
    def schedules(self) -> Schedules: ...


def import_beat_schedule(durable: _HasSchedules, entries: Mapping[Any, Any]) -> ImportReport:
    """:func:`import_entries` with a project's ``Durable`` (what beat does at start-up)."""
    return import_entries(durable.runtime, durable.schedules, entries)


def import_entries(
    runtime: Runtime, schedules: Schedules, entries: Mapping[Any, Any]
) -> ImportReport:
    """Create or bring up to date one durable schedule per entry; pause removed ones (B6).

    A refused entry is logged with its name and skipped; the others are imported. A task not
    registered here is sent by name (B4), with one warning per entry.
    """
    report = ImportReport()
    planned: dict[str, tuple[str, Content]] = {}
    for key, entry in entries.items():
        name = key if isinstance(key, str) else str(key)
        try:
            sid, content = translate(runtime, schedules, name, entry)
            if sid in planned:
                raise InvalidSchedule(
                    f"beat_schedule entry {name!r} maps to schedule ID {sid!r}, "
                    f"already taken by entry {planned[sid][0]!r}"
                )
        except (InvalidSchedule, ValueError, TypeError) as exc:
            log.error("beat_schedule entry %r is not scheduled: %s", name, exc)
            report.refused[name] = str(exc)
            continue
        if sid != name:
            log.warning("beat_schedule entry %r is schedule %r (the name breaks S1)", name, sid)
        if content.task not in runtime.app.tasks:
            log.warning(
                "beat_schedule entry %r: task %r is not registered in the beat process; "
                "it is sent by name, as stock beat sends it",
                name,
                content.task,
            )
        planned[sid] = (name, content)
        report.imported[name] = sid
        if origin_label(content.task, content.options) != BEAT_ORIGIN:
            report.notes[sid] = describe_origin(content.task, content.options)
    # D13: only the schedules this import made before and the planned IDs, never every one.
    existing = schedules.store.load_with_origin(BEAT_ORIGIN, planned)
    for sid, (name, content) in planned.items():
        _apply(schedules, sid, name, content, existing.get(sid), report)
    for sid, state in existing.items():
        options = state.content.options if state.content is not None else {}
        if (
            sid not in planned
            and BEAT_ENTRY in options
            and not state.paused
            and not state.deleted
            and options[BEAT_ENTRY] not in report.refused
        ):
            schedules.pause(sid, reason=REMOVED)
            log.warning("schedule %r paused: %s (entry %r)", sid, REMOVED, options[BEAT_ENTRY])
            report.paused.append(sid)
    return report


def _apply(
    schedules: Schedules,
    sid: str,
    name: str,
    content: Content,
    state: ScheduleState | None,
    report: ImportReport,
) -> None:
    try:
        if state is None:
            if schedules._execute(sid, lambda now: Create(content=content, now=now)):
                report.created.append(sid)
            return
        if state.deleted:
            log.warning("beat_schedule entry %r names a deleted schedule; it stays deleted", name)
            return
        if schedules._execute(sid, lambda now: Change(content=content, now=now)):
            report.changed.append(sid)
        if state.paused and _pause_reason(schedules, sid) == REMOVED:
            schedules.resume(sid)
            log.warning("schedule %r resumed: entry %r is back in beat_schedule", sid, name)
            report.resumed.append(sid)
    except DurableError as exc:
        log.error("beat_schedule entry %r is not scheduled: %s", name, exc)
        report.refused[name] = str(exc)
        report.imported.pop(name, None)


def summary(report: ImportReport) -> str | None:
    """Beat's start-up line about the import; ``None`` when it stored nothing (an unchanged
    ``beat_schedule``). A schedule the project did not write says where it came from (B7)."""
    if not report.stored:
        return None
    parts = []
    for verb, sids in (
        ("created", report.created),
        ("changed", report.changed),
        ("paused (removed from beat_schedule)", report.paused),
        ("resumed", report.resumed),
    ):
        if sids:
            named = [f"{sid}: {report.notes[sid]}" if sid in report.notes else sid for sid in sids]
            parts.append(f"{len(sids)} {verb} ({', '.join(named)})")
    return "durable scheduler: beat_schedule imported: " + "; ".join(parts)


def _pause_reason(schedules: Schedules, sid: str) -> str | None:
    """The reason stored with the schedule's latest pause."""
    pauses = [e for e in schedules.store.events(sid) if isinstance(e, SchedulePaused)]
    return pauses[-1].reason if pauses else None


def default_entries(scheduler: Any) -> dict[str, Any]:
    """The entries stock beat installs itself (``celery.backend_cleanup``, B7).

    Celery's own ``install_default_entries`` decides (result expiry set, backend without
    automatic expiry); it writes into the scheduler's ``data``, read back here as dicts.
    """
    saved, scheduler.data = scheduler.data, {}
    try:
        scheduler.install_default_entries(scheduler.data)
        installed = dict(scheduler.data)
    finally:
        scheduler.data = saved
    return {
        name: {
            "task": e.task,
            "schedule": e.schedule,
            "args": e.args,
            "kwargs": e.kwargs,
            "options": e.options,
        }
        for name, e in installed.items()
    }


__all__ = [
    "BEAT_ENTRY",
    "REMOVED",
    "ImportReport",
    "default_entries",
    "import_beat_schedule",
    "import_entries",
    "rule_for",
    "stored_value",
    "summary",
    "translate",
]
