"""Schedule events and their JSON form: the one wire format of the schedule aggregate.

Every event is a frozen dataclass with a stable type name (``ScheduleCreated`` …) and a data
dict carrying ``"v"``, the format version of that event type. Both are persistent contracts
(SPEC §9): a change needs a new version read side by side with the old.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from functools import cache, cached_property
from typing import Any, ClassVar, cast

from celery_durable.core.blackouts import (
    Blackout,
    OnBlackout,
    windows_from_json,
    windows_to_json,
)
from celery_durable.core.codec import time_from_json, time_to_json
from celery_durable.core.journal import NewEvent, StoredEvent
from celery_durable.core.policies import CatchUp, Overlap, Timing, member
from celery_durable.core.rules import Rule, rule_from_json
from celery_durable.errors import JournalError

FORMAT = 1


@dataclass(frozen=True, kw_only=True)
class Content:
    """What a schedule starts: task, input, rule, policies and Celery options.

    The timing policies (P1–P3) appear in the JSON form only when set, so the content (and
    the A1 digest) of a schedule without them reads and compares as before they existed.
    Not slotted: its JSON form is computed once and cached (the dispatcher writes it with
    every index row).
    """

    task: str
    input: Any
    rule: Rule
    catch_up: CatchUp = CatchUp.LATEST
    overlap: Overlap = Overlap.ALLOW
    options: Mapping[str, Any] = field(default_factory=dict)
    timing: Timing = field(default_factory=Timing)
    blackouts: tuple[Blackout, ...] = ()
    """P4: the schedule's own blackout windows (the global ones are the journal's)."""
    on_blackout: OnBlackout = OnBlackout.SKIP
    """P4: what a due time inside a window does (global windows too)."""

    def to_json(self) -> dict[str, Any]:
        """The JSON form (shared: do not modify the returned dict)."""
        return self._json

    @cached_property
    def _json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "input": self.input,
            "rule": self.rule.to_json(),
            "catch_up": self.catch_up.value,
            "overlap": self.overlap.value,
            "options": dict(self.options),
            **self.timing.to_json(),
            **self._blackouts_json(),
        }

    def _blackouts_json(self) -> dict[str, Any]:
        """P4's fields, only when set: content stored before them keeps its form and digest."""
        out: dict[str, Any] = {}
        if self.blackouts:
            out["blackouts"] = windows_to_json(self.blackouts)
        if self.on_blackout is not OnBlackout.SKIP:
            out["on_blackout"] = self.on_blackout.value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Content:
        blackouts = data.get("blackouts")
        return cls(
            task=data["task"],
            input=data["input"],
            rule=rule_from_json(data["rule"]),
            catch_up=member(CatchUp, data["catch_up"]),
            overlap=member(Overlap, data.get("overlap", Overlap.ALLOW.value)),
            options=dict(data.get("options") or {}),
            timing=Timing.from_json(data),
            blackouts=windows_from_json(blackouts) if blackouts else (),
            on_blackout=member(OnBlackout, data.get("on_blackout", OnBlackout.SKIP.value)),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Audited:
    """Who made the command and why (O5): optional fields of format 1, left out of the JSON
    when not given, so events stored before they existed read as made by nobody in particular.
    A pause's ``reason`` may also come from the library ("removed from beat_schedule", B6)."""

    by: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleCreated(Audited):
    TYPE: ClassVar[str] = "ScheduleCreated"
    at: datetime
    content: Content
    since: datetime | None = None
    """An imported schedule's timing starts here, not at ``at``: its source's last run
    (the grid of ``Every`` and the settled-through moment, I1/I2). Optional field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleChanged(Audited):
    TYPE: ClassVar[str] = "ScheduleChanged"
    at: datetime
    content: Content
    since: datetime | None = None
    """As :attr:`ScheduleCreated.since`, for a re-import (I1/I2). Optional field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulePaused(Audited):
    TYPE: ClassVar[str] = "SchedulePaused"
    at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleResumed(Audited):
    TYPE: ClassVar[str] = "ScheduleResumed"
    at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleDeleted(Audited):
    TYPE: ClassVar[str] = "ScheduleDeleted"
    at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class RunDecided:
    """A due time accepted: the run will start with this task, input and options (A5, A6)."""

    TYPE: ClassVar[str] = "RunDecided"
    at: datetime
    due: datetime
    run_id: str
    task: str
    input: Any
    options: Mapping[str, Any] = field(default_factory=dict)
    reason: str = "rule"  # "rule", "backfill" or "trigger"
    held: bool = False
    """``Overlap.BUFFER_ONE``: wait until the running run has ended before enqueueing."""
    track_end: bool = False
    """The overlap policy needs to hear when this run ends (``Overlap`` other than ALLOW)."""
    send_at: datetime | None = None
    """Jitter (P2): not sent before this moment (due + the run ID's offset); ``None``: at due."""
    deadline: datetime | None = None
    """Start deadline (P1): a run not started by then never starts; ``None``: no deadline."""
    by: str | None = None
    """A trigger's or backfill's author (O5); optional field."""
    note: str | None = None
    """Why it was asked for (O5; ``reason`` names the kind of decision); optional field."""
    blackout: str | None = None
    """P4, ``on_blackout="defer"``: the window the due time fell in; the run is sent at
    ``send_at``, when the blackout is over. Optional field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSent:
    """The run's message was handed to the broker.

    Stored as ``RunStarted`` (§9); named for what it records in Python, where the run
    stream's ``RunStarted`` (the worker's first claim) is another event.
    """

    TYPE: ClassVar[str] = "RunStarted"
    at: datetime
    due: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSkipped:
    """A due time that will not run: the overlap policy (D7), or a blackout window (P4).

    Usually the due time was never decided. A decided run still unsent when its send moment
    falls inside a blackout window (P4, ``skip``) is skipped too: the event then also removes
    it from the runs waiting to be sent.
    """

    TYPE: ClassVar[str] = "RunSkipped"
    at: datetime
    due: datetime
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunDeferred:
    """P4, ``on_blackout="defer"``: a decided run whose send moment fell inside a blackout
    window waits until ``until``, the end of that blackout, to be sent (no run starts inside
    a window). Its due time was outside every window, or it was deferred once already."""

    TYPE: ClassVar[str] = "RunDeferred"
    at: datetime
    due: datetime
    until: datetime
    blackout: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFailedToStart:
    """A decided run that can never be enqueued (D5)."""

    TYPE: ClassVar[str] = "RunFailedToStart"
    at: datetime
    due: datetime
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunMissed:
    """One decided run that will never start: its start deadline passed (P1).

    Recorded by the dispatcher for a run still unsent at its deadline, and by a worker that
    received the run's message after it (the message expired, or a durable run that had not
    started). Not to be confused with ``RunsMissed``, due times the catch-up policy dropped.
    """

    TYPE: ClassVar[str] = "RunMissed"
    at: datetime
    due: datetime
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunsMissed:
    """Due times up to ``through`` were dropped by the catch-up policy (C1–C3)."""

    TYPE: ClassVar[str] = "RunsMissed"
    at: datetime
    through: datetime
    count: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEndReported:
    """A started run ended (``outcome``: finished, faulted, cancelled); used by overlap (D7).

    Stored as ``RunEnded`` (§9); named apart from the ``errors.RunEnded`` exception.
    """

    TYPE: ClassVar[str] = "RunEnded"
    at: datetime
    due: datetime
    outcome: str


ScheduleEvent = (
    ScheduleCreated
    | ScheduleChanged
    | SchedulePaused
    | ScheduleResumed
    | ScheduleDeleted
    | RunDecided
    | RunSent
    | RunSkipped
    | RunDeferred
    | RunFailedToStart
    | RunMissed
    | RunsMissed
    | RunEndReported
)

_TIME_FIELDS = frozenset({"at", "due", "through", "send_at", "deadline", "since", "until"})
_OPTIONAL_FIELDS = frozenset({"send_at", "deadline", "reason", "by", "note", "since", "blackout"})
"""Fields added after format 1 was first written: left out of the JSON when ``None`` (§9)."""


def to_data(event: ScheduleEvent) -> dict[str, Any]:
    """The JSON data of an event (without its type name)."""
    data: dict[str, Any] = {"v": FORMAT}
    for name, convert in _encoders(cast(type, type(event))):
        value = getattr(event, name)
        if value is None and name in _OPTIONAL_FIELDS:
            continue
        data[name] = value if convert is None else convert(value)
    return data


def _content_json(content: Content) -> dict[str, Any]:
    return content.to_json()


_Encoders = tuple[tuple[str, Callable[[Any], Any] | None], ...]


@cache
def _encoders(cls: type) -> _Encoders:
    """Each field of an event class with the conversion its JSON form needs (None: as is)."""
    out: list[tuple[str, Callable[[Any], Any] | None]] = []
    for name in _field_names(cls):
        if name in _TIME_FIELDS:
            out.append((name, time_to_json))
        elif name == "content":
            out.append((name, _content_json))
        elif name == "options":
            out.append((name, dict))
        else:
            out.append((name, None))
    return tuple(out)


@cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def to_new_event(event: ScheduleEvent) -> NewEvent:
    """The journal form of an event."""
    return NewEvent(type=event.TYPE, data=to_data(event))


def from_data(type_name: str, data: Mapping[str, Any]) -> ScheduleEvent:
    """Rebuild an event from its type name and JSON data; ``JournalError`` when unreadable."""
    cls = _TYPES.get(type_name)
    if cls is None:
        raise JournalError(f"unknown schedule event type {type_name!r}", event_type=type_name)
    version = data.get("v", 1)
    if version != FORMAT:
        raise JournalError(
            f"{type_name} has format {version}; this version reads format {FORMAT}",
            event_type=type_name,
        )
    kwargs: dict[str, Any] = {}
    try:
        for name in _field_names(cls):
            if name not in data:
                continue
            value = data[name]
            if name in _TIME_FIELDS and value is not None:
                value = time_from_json(value)
            elif name == "content":
                value = Content.from_json(value)
            kwargs[name] = value
        return cast(ScheduleEvent, cls(**kwargs))
    except (KeyError, TypeError, ValueError) as exc:
        raise JournalError(f"unreadable {type_name} event: {exc}", event_type=type_name) from exc


def from_stored(stored: StoredEvent) -> ScheduleEvent:
    """Rebuild an event read from the journal."""
    return from_data(stored.type, stored.data)


_LIFE_CYCLE = (ScheduleCreated, ScheduleChanged, SchedulePaused, ScheduleResumed, ScheduleDeleted)
_RUN_RECORDS = (
    RunDecided,
    RunSent,
    RunSkipped,
    RunDeferred,
    RunFailedToStart,
    RunMissed,
    RunsMissed,
    RunEndReported,
)
RUN_RECORD_TYPES = frozenset(cls.TYPE for cls in _RUN_RECORDS)
"""The schedule events that only record runs: what retention may remove (O1); the others
are the schedule's life cycle, kept for good."""

_TYPES: dict[str, type] = {cls.TYPE: cls for cls in (*_LIFE_CYCLE, *_RUN_RECORDS)}
