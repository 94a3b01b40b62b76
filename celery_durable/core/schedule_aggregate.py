"""The schedule aggregate: pure ``decide(state, command) -> events`` and ``fold(state, event)``.

No I/O, no clock: every command carries the moment it is made at. Commands check first and
return events; a refused command raises and returns nothing, so nothing is stored (SPEC §3).

The state keeps a *cursor*: every due time of the rule at or before it is settled (decided,
dropped by the catch-up policy, inside a pause, or before a change). Decided due times never
exceed the cursor, so a due time after it has never been decided and never will be twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any, cast

from celery_durable.core import catchup
from celery_durable.core.blackout_plan import (
    at_send,
    deferred_to,
    fates,
    send_now_or_later,
    sent_at,
)
from celery_durable.core.blackouts import Blackout, OnBlackout, blocking
from celery_durable.core.codec import (
    canonical,
    optional_time_from_json,
    optional_time_to_json,
    time_from_json,
    time_to_json,
)
from celery_durable.core.ids import run_id
from celery_durable.core.policies import Overlap, jitter_offset
from celery_durable.core.rules import LiveSchedules, Once, Rule
from celery_durable.core.schedule_events import (
    Content,
    RunDecided,
    RunDeferred,
    RunEndReported,
    RunFailedToStart,
    RunMissed,
    RunSent,
    RunSkipped,
    RunsMissed,
    ScheduleChanged,
    ScheduleCreated,
    ScheduleDeleted,
    ScheduleEvent,
    SchedulePaused,
    ScheduleResumed,
)
from celery_durable.errors import InvalidSchedule, ScheduleConflict, ScheduleNotFound

FUTURE_TOLERANCE = timedelta(seconds=1)
"""A due time further in the future than this is refused (A6)."""

NEXT_RUN_LOOKAHEAD = 1000
"""How many due times :meth:`ScheduleState.next_run` looks through past blackout windows."""

STATE_FORMAT = 1
"""Format of :meth:`ScheduleState.to_json`, stored in the index (a persistent contract)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingRun:
    """A decided run whose message has not been handed to the broker yet."""

    due: datetime
    run_id: str
    task: str
    input: Any
    options: Mapping[str, Any] = field(default_factory=dict)
    reason: str = "rule"
    held: bool = False
    track_end: bool = False
    send_at: datetime | None = None
    deadline: datetime | None = None
    blackout: str | None = None
    """P4: deferred out of this window; sent at ``send_at``, when the blackout is over."""

    @property
    def send_time(self) -> datetime:
        """When the message may go: the jittered moment (P2), else the due time."""
        return self.due if self.send_at is None else self.send_at


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleState:
    """Everything the aggregate needs to decide, folded from a schedule's events."""

    schedule_id: str
    version: int = 0
    content: Content | None = None
    created_digest: str | None = None
    created_at: datetime | None = None
    anchor: datetime | None = None
    cursor: datetime | None = None
    last_decided: datetime | None = None
    runs_decided: int = 0
    runs_since_change: int = 0
    paused: bool = False
    deleted: bool = False
    pending: tuple[PendingRun, ...] = ()
    running: tuple[datetime, ...] = ()
    """Started runs whose end the overlap policy waits for (D7)."""

    @property
    def exists(self) -> bool:
        return self.content is not None

    @property
    def busy(self) -> bool:
        """A run is still going: started and not ended, or decided and not yet sent (D7)."""
        return bool(self.running or self.pending)

    def sendable(self) -> tuple[PendingRun, ...]:
        """Decided runs to enqueue now: a held run waits until nothing else is going."""
        if any(p.held for p in self.pending) and (
            self.running or any(not p.held for p in self.pending)
        ):
            return tuple(p for p in self.pending if not p.held)
        return self.pending

    def attention(
        self, waiting: Container[str] = (), live: LiveSchedules | None = None
    ) -> datetime | None:
        """When the dispatcher must next look: the earliest send time of a sendable run (its
        due time, or its jittered moment: P2), a held run's start deadline (P1), else the
        rule's next due time. Runs whose IDs are in ``waiting`` (a broker retry) are left out.
        ``live`` evaluates a :class:`~.rules.BeatEntry` rule (B3).
        """
        sendable = [p for p in self.sendable() if p.run_id not in waiting]
        if sendable and all(p.send_at is None for p in sendable):
            return min(p.due for p in sendable)  # due already: before any later due time
        times = [p.send_time for p in sendable]
        times += [p.deadline for p in self.pending if p.held and p.deadline is not None]
        following = self.next_due(live)
        if following is not None:
            times.append(following)
        return min(times, default=None)

    @property
    def active(self) -> bool:
        """Created, not deleted, not paused."""
        return self.content is not None and not self.deleted and not self.paused

    def next_due(self, live: LiveSchedules | None = None) -> datetime | None:
        """The next due time the rule gives, or ``None`` while paused, deleted or complete.

        A :class:`~.rules.BeatEntry` rule has one only where ``live`` holds its object (B3).
        """
        if not self.active or self._budget_spent():
            return None
        assert self.content is not None  # for type checkers: active implies content
        rule = self.content.rule
        if isinstance(rule, Once):
            if self.cursor is not None and rule.at <= self.cursor:
                return None
            if rule.end_at is not None and rule.at > rule.end_at:
                return None
            return rule.at
        if self.cursor is None:
            return None
        return rule.next_after(self.cursor, anchor=self.anchor, live=live)

    def next_run(
        self, blackouts: tuple[Blackout, ...] = (), live: LiveSchedules | None = None
    ) -> datetime | None:
        """When the next run will really be sent, blackouts (P4) and jitter (P2) considered.

        The earliest of: a decided run waiting to be sent (a held one excepted: it waits for
        the running one to end), and the first due time of the rule whose run a window leaves
        alone or only moves (:func:`~.blackout_plan.fate`). ``None`` as for :meth:`next_due`,
        or when the next :data:`NEXT_RUN_LOOKAHEAD` due times (a blackout's counting as one) all
        fall where they are skipped.
        """
        content = self.content
        if content is None:
            return None
        windows = _windows(content, blackouts)
        defer = content.on_blackout is OnBlackout.DEFER
        moments = [
            moment
            for p in self.pending
            if not p.held
            and (moment := sent_at(p, windows, defer=defer)) is not None
            and (p.deadline is None or moment < p.deadline)
        ]
        timing = content.timing
        for found in fates(
            self.schedule_id,
            self._coming(content.rule, live, windows),
            windows,
            defer=defer,
            jitter=timing.jitter,
            deadline=timing.start_deadline,
            taken=deferred_to(self.pending, windows),
        ):
            if moments and found.due >= min(moments):
                break
            if found.starts is not None:
                moments.append(found.starts)
                break
        return min(moments, default=None)

    def _coming(
        self, rule: Rule, live: LiveSchedules | None, windows: Sequence[Blackout] = ()
    ) -> Iterator[datetime]:
        """The rule's next due times from :meth:`next_due`, at most :data:`NEXT_RUN_LOOKAHEAD`.

        After a due time inside a blackout, the next one given is the first at or after the
        blackout's end: those in between share its fate (skipped, or the one run the blackout
        defers), so a weekend's window over a schedule due every minute is one step, not 2,880.
        """
        due = self.next_due(live)
        for _ in range(NEXT_RUN_LOOKAHEAD):
            if due is None:
                return
            yield due
            if isinstance(rule, Once):
                return
            after = due
            blocked = blocking(due, windows) if windows else None
            if blocked is not None and blocked.ends is not None and blocked.ends > due:
                after = blocked.ends - timedelta(microseconds=1)
            due = rule.next_after(after, anchor=self.anchor, live=live)

    def _budget_spent(self) -> bool:
        assert self.content is not None
        limit = self.content.rule.max_runs
        if isinstance(self.content.rule, Once):
            limit = 1 if limit is None else min(limit, 1)
        return limit is not None and self.runs_since_change >= limit

    def budget(self) -> int | None:
        """How many more runs the rule's ``max_runs`` allows (``None``: unbounded)."""
        assert self.content is not None
        limit = self.content.rule.max_runs
        if isinstance(self.content.rule, Once):
            limit = 1
        return None if limit is None else max(limit - self.runs_since_change, 0)

    def to_json(self) -> dict[str, Any]:
        """The index entry form of the state (format ``STATE_FORMAT``)."""
        return {
            "format": STATE_FORMAT,
            "schedule_id": self.schedule_id,
            "version": self.version,
            "content": None if self.content is None else self.content.to_json(),
            "created_digest": self.created_digest,
            "created_at": optional_time_to_json(self.created_at),
            "anchor": optional_time_to_json(self.anchor),
            "cursor": optional_time_to_json(self.cursor),
            "last_decided": optional_time_to_json(self.last_decided),
            "runs_decided": self.runs_decided,
            "runs_since_change": self.runs_since_change,
            "paused": self.paused,
            "deleted": self.deleted,
            "pending": [
                {
                    "due": time_to_json(p.due),
                    "run_id": p.run_id,
                    "task": p.task,
                    "input": p.input,
                    "options": dict(p.options),
                    "reason": p.reason,
                    "held": p.held,
                    "track_end": p.track_end,
                    **_optional_times(send_at=p.send_at, deadline=p.deadline),
                    **({} if p.blackout is None else {"blackout": p.blackout}),
                }
                for p in self.pending
            ],
            "running": [time_to_json(t) for t in self.running],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScheduleState:
        """Rebuild a state from :meth:`to_json`; ``ValueError`` for another format."""
        if data.get("format") != STATE_FORMAT:
            raise ValueError(f"index entry format {data.get('format')!r} is not {STATE_FORMAT}")
        content = data["content"]
        return cls(
            schedule_id=data["schedule_id"],
            version=data["version"],
            content=None if content is None else Content.from_json(content),
            created_digest=data["created_digest"],
            created_at=optional_time_from_json(data["created_at"]),
            anchor=optional_time_from_json(data["anchor"]),
            cursor=optional_time_from_json(data["cursor"]),
            last_decided=optional_time_from_json(data["last_decided"]),
            runs_decided=data["runs_decided"],
            runs_since_change=data["runs_since_change"],
            paused=data["paused"],
            deleted=data["deleted"],
            pending=tuple(
                PendingRun(
                    due=time_from_json(p["due"]),
                    run_id=p["run_id"],
                    task=p["task"],
                    input=p["input"],
                    options=p.get("options") or {},
                    reason=p.get("reason", "rule"),
                    held=p.get("held", False),
                    track_end=p.get("track_end", False),
                    send_at=optional_time_from_json(p.get("send_at")),
                    deadline=optional_time_from_json(p.get("deadline")),
                    blackout=p.get("blackout"),
                )
                for p in data["pending"]
            ),
            running=tuple(time_from_json(t) for t in data.get("running", ())),
        )


def _optional_times(**moments: datetime | None) -> dict[str, str]:
    """The JSON of the moments that are set (fields added to format 1 later stay optional)."""
    return {name: time_to_json(m) for name, m in moments.items() if m is not None}


# Commands -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Audited:
    """Who made a schedule command and why (O5): stored as given on its event."""

    by: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Create(Audited):
    content: Content
    now: datetime
    since: datetime | None = None
    """Imported schedules (I1, I2): the timing continues from here instead of ``now``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Change(Audited):
    content: Content
    now: datetime
    since: datetime | None = None
    """Re-imported schedules (I1, I2): the timing continues from here instead of ``now``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pause(Audited):
    now: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Resume(Audited):
    now: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Delete(Audited):
    now: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class DecideDue:
    """Decide the due times the rule and the catch-up policy give up to ``now``.

    ``live`` holds the schedule objects a :class:`~.rules.BeatEntry` rule asks (B3); they
    are asked as of ``now``.
    """

    now: datetime
    live: LiveSchedules | None = field(default=None, compare=False, repr=False)
    blackouts: tuple[Blackout, ...] = field(default=(), compare=False, repr=False)
    """P4: the global blackout windows, as the journal holds them now (passed in like the
    clock); the schedule's own windows come with its content."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DecideRun:
    """Decide one given due time outside the rule's cursor (backfill, trigger: D9).

    ``decided`` lists the due times already decided before the cursor (read from the stream):
    the aggregate keeps only a high-water mark, so the caller supplies the history.
    ``decided_through``: retention removed the records of the due times up to this instant
    (O1); none of them is decided again, since the stream can no longer tell which were (A6).
    """

    due: datetime
    now: datetime
    reason: str
    decided: frozenset[datetime] = frozenset()
    decided_through: datetime | None = None
    by: str | None = None
    """Who asked for the run (O5)."""
    note: str | None = None
    """Why they asked (O5; ``reason`` names the kind of decision)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MarkStarted:
    due: datetime
    now: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class MarkFailedToStart:
    """A decided run that can never start (D5).

    ``sent``: recorded by the worker that received the run's message (a durable run whose
    secret input cannot be read, P5), although the aggregate no longer tracks a sent run.
    """

    due: datetime
    error: str
    now: datetime
    sent: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class MarkMissed:
    """A run's start deadline passed before it started (P1).

    ``sent``: a worker saw the message (it expired in the queue, or a durable run was
    delivered late): recorded even though the aggregate no longer tracks a sent run.
    """

    due: datetime
    reason: str
    now: datetime
    sent: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class MarkEnded:
    due: datetime
    outcome: str
    now: datetime


Command = (
    Create
    | Change
    | Pause
    | Resume
    | Delete
    | DecideDue
    | DecideRun
    | MarkStarted
    | MarkFailedToStart
    | MarkMissed
    | MarkEnded
)


def digest(content: Content) -> str:
    """A stable fingerprint of a schedule's content (A1 compares with it)."""
    return hashlib.sha256(canonical(content.to_json()).encode()).hexdigest()


def _check_bounds(content: Content, now: datetime) -> None:
    end_at = content.rule.end_at
    if end_at is not None and end_at < now:
        raise InvalidSchedule(
            f"end_at {time_to_json(end_at)} is before the schedule's creation {time_to_json(now)}",
            rule="R8",
        )


def _content_event(
    kind: type[ScheduleCreated] | type[ScheduleChanged], command: Create | Change
) -> ScheduleCreated | ScheduleChanged:
    """The event of a create or change: its content, where its timing starts, who and why."""
    return kind(
        at=command.now,
        content=command.content,
        since=command.since,
        by=command.by,
        reason=command.reason,
    )


def decide(state: ScheduleState, command: Command) -> list[ScheduleEvent]:
    """The events a command produces; raises when the command is refused (stores nothing)."""
    sid = state.schedule_id
    # The dispatcher's commands first: a burst asks these two for every run.
    if isinstance(command, DecideDue):
        return _decide_due(state, command.now, command.live, command.blackouts)
    if isinstance(command, MarkStarted):
        if _pending(state, command.due) is None:
            return []
        return [RunSent(at=command.now, due=command.due)]
    if isinstance(command, Create):
        if state.deleted:
            raise ScheduleConflict(
                f"schedule {sid!r} was deleted; its ID cannot be reused",
                schedule_id=sid,
                rule="A4",
            )
        if state.exists:
            if digest(command.content) == state.created_digest:
                return []
            raise ScheduleConflict(
                f"schedule {sid!r} exists with different content", schedule_id=sid, rule="A1"
            )
        _check_bounds(command.content, command.now)
        return [_content_event(ScheduleCreated, command)]
    if isinstance(command, Change):
        _require_live(state, "change")
        if (
            state.content is not None
            and digest(command.content) == digest(state.content)
            and (command.since is None or command.since == state.anchor)
        ):
            return []
        _check_bounds(command.content, command.now)
        return [_content_event(ScheduleChanged, command)]
    if isinstance(command, Pause):
        _require_live(state, "pause")
        if state.paused:
            return []
        return [SchedulePaused(at=command.now, by=command.by, reason=command.reason)]
    if isinstance(command, Resume):
        _require_live(state, "resume")
        if not state.paused:
            raise ScheduleConflict(f"schedule {sid!r} is not paused", schedule_id=sid, rule="A3")
        return [ScheduleResumed(at=command.now, by=command.by, reason=command.reason)]
    if isinstance(command, Delete):
        if state.deleted:
            return []
        if not state.exists:
            raise ScheduleNotFound(f"schedule {sid!r} does not exist", schedule_id=sid, rule="A4")
        return [ScheduleDeleted(at=command.now, by=command.by, reason=command.reason)]
    if isinstance(command, DecideRun):
        return _decide_run(state, command)
    if isinstance(command, MarkFailedToStart):
        if not command.sent and _pending(state, command.due) is None:
            return []
        return [RunFailedToStart(at=command.now, due=command.due, error=command.error)]
    if isinstance(command, MarkMissed):
        if not command.sent and _pending(state, command.due) is None:
            return []
        return [RunMissed(at=command.now, due=command.due, reason=command.reason)]
    if isinstance(command, MarkEnded):
        if command.due not in state.running:
            return []
        return [RunEndReported(at=command.now, due=command.due, outcome=command.outcome)]
    raise TypeError(f"not a schedule command: {command!r}")


def _require_live(state: ScheduleState, verb: str) -> None:
    sid = state.schedule_id
    if not state.exists:
        raise ScheduleNotFound(
            f"cannot {verb} schedule {sid!r}: it does not exist", schedule_id=sid, rule="A4"
        )
    if state.deleted:
        raise ScheduleConflict(
            f"cannot {verb} schedule {sid!r}: it was deleted", schedule_id=sid, rule="A4"
        )


def _pending(state: ScheduleState, due: datetime) -> PendingRun | None:
    for p in state.pending:  # a loop, not a generator: asked twice for every run
        if p.due == due:
            return p
    return None


def _without(pending: tuple[PendingRun, ...], due: datetime) -> tuple[PendingRun, ...]:
    """The decided runs but the one of ``due``."""
    return tuple([p for p in pending if p.due != due])


def _decided(
    state: ScheduleState,
    content: Content,
    due: datetime,
    now: datetime,
    reason: str,
    *,
    held: bool = False,
    by: str | None = None,
    note: str | None = None,
    deferred: tuple[str, datetime] | None = None,
) -> RunDecided:
    rid = run_id(state.schedule_id, due)
    timing = content.timing
    # Backfills and triggers are explicit requests for a past or present due time: the timing
    # policies, which guard the rule's own due times, do not apply to them.
    policed = reason == "rule"
    jitter, deadline = (timing.jitter, timing.start_deadline) if policed else (None, None)
    send_from = due if deferred is None else deferred[1]  # P4: when the blackout is over
    send_at = None if jitter is None else send_from + jitter_offset(rid, jitter)
    if deferred is not None and send_at is None:
        send_at = send_from
    return RunDecided(
        at=now,
        due=due,
        run_id=rid,
        task=content.task,
        input=content.input,
        options=content.options,
        reason=reason,
        held=held,
        track_end=content.overlap is not Overlap.ALLOW,
        send_at=send_at,
        deadline=None if deadline is None else due + deadline,
        by=by,
        note=note,
        blackout=None if deferred is None else deferred[0],
    )


MISSED_UNSENT = "start deadline passed before the run could be sent"
"""Reason of a ``RunMissed`` the dispatcher records (P1)."""


def _missed_deadlines(state: ScheduleState, now: datetime) -> list[ScheduleEvent]:
    """P1: decided runs still unsent at their start deadline are missed, never sent."""
    return [
        RunMissed(at=now, due=p.due, reason=MISSED_UNSENT)
        for p in state.pending
        if p.deadline is not None and p.deadline <= now
    ]


def _decided_or_missed(
    state: ScheduleState,
    content: Content,
    due: datetime,
    now: datetime,
    deferred: tuple[str, datetime] | None = None,
) -> list[ScheduleEvent]:
    """A rule's due time, decided; P1: found with its start deadline already past (beat was
    down, catch-up), it is decided and missed in the same batch, and never sent. A run
    deferred past its deadline (P4) is missed when the deadline comes, as any unsent run."""
    decided = _decided(state, content, due, now, "rule", deferred=deferred)
    if decided.deadline is None or decided.deadline > now:
        return [decided]
    return [decided, RunMissed(at=now, due=due, reason=MISSED_UNSENT)]


def _decide_due(
    state: ScheduleState,
    now: datetime,
    live: LiveSchedules | None,
    blackouts: tuple[Blackout, ...] = (),
) -> list[ScheduleEvent]:
    if not state.pending:  # the usual case: nothing decided is waiting
        return _decide_new(state, now, live, blackouts)
    missed = _missed_deadlines(state, now)
    if missed:
        state = fold_all(state, missed)
    held_back = []
    if state.content is not None and state.pending:
        windows, defer = _windows(state.content, blackouts), _defers(state.content)
        held_back = send_now_or_later(state.sendable(), now, windows, defer=defer)
    if held_back:
        state = fold_all(state, held_back)
    return [*missed, *held_back, *_decide_new(state, now, live, blackouts)]


def _windows(content: Content, blackouts: tuple[Blackout, ...]) -> tuple[Blackout, ...]:
    """The windows a schedule honours: its own first, then the global ones (P4)."""
    return (*content.blackouts, *blackouts) if content.blackouts else blackouts


def _defers(content: Content) -> bool:
    return content.on_blackout is OnBlackout.DEFER


def _decide_new(
    state: ScheduleState,
    now: datetime,
    live: LiveSchedules | None,
    blackouts: tuple[Blackout, ...] = (),
) -> list[ScheduleEvent]:
    if not state.active:
        return []
    content = state.content
    assert content is not None
    budget = state.budget()
    if budget == 0:
        return []
    rule = content.rule
    if isinstance(rule, Once):
        due = state.next_due()
        # R5: a past `at` runs at the next tick whatever the catch-up policy.
        if due is None or due > now:
            return []
        windows = _windows(content, blackouts)
        blocked = blocking(due, windows)
        if blocked is None:
            defer = content.on_blackout is OnBlackout.DEFER
            return [
                at_send(e, now, windows, defer)
                for e in _decided_or_missed(state, content, due, now)
            ]
        if content.on_blackout is OnBlackout.DEFER and blocked.ends is not None:
            until = (blocked.window.name, blocked.ends)
            return _decided_or_missed(state, content, due, now, until)
        # A skipped Once is settled like a decided one: nothing is left to run (R5).
        return [RunSkipped(at=now, due=due, reason=blocked.reason)]
    if state.cursor is None:
        return []
    selection = catchup.select(
        rule,
        after=state.cursor,
        now=now,
        anchor=state.anchor,
        policy=content.catch_up,
        window=content.timing.catch_up_window,
        live=None if live is None else live.as_of(now),  # a BeatEntry rule (B3)
    )
    events: list[ScheduleEvent] = []
    if selection.dropped != 0 and selection.dropped_through is not None:
        events.append(
            RunsMissed(at=now, through=selection.dropped_through, count=selection.dropped)
        )
    runs = selection.run
    if state.pending:  # a trigger may have taken one of these instants already
        waiting = {p.due for p in state.pending}
        runs = tuple([due for due in runs if due not in waiting])
    runs = runs if budget is None else runs[:budget]
    busy = state.busy
    buffered = bool(state.pending) and any(p.held for p in state.pending)
    deadline = content.timing.start_deadline
    windows = _windows(content, blackouts)
    defer = content.on_blackout is OnBlackout.DEFER
    waiting_ends = deferred_to(state.pending, windows) if state.pending else set()
    for due in runs:
        blocked = blocking(due, windows) if windows else None
        deferred: tuple[str, datetime] | None = None
        if blocked is not None:
            if not defer or blocked.ends is None or blocked.ends in waiting_ends:
                events.append(RunSkipped(at=now, due=due, reason=blocked.reason))
                continue
            deferred = (blocked.window.name, blocked.ends)
            waiting_ends.add(blocked.ends)
        if deadline is not None and due + deadline <= now:
            # A missed run keeps no slot busy: the next due time may still be sent.
            events.extend(_decided_or_missed(state, content, due, now, deferred))
            continue
        if content.overlap is Overlap.ALLOW or not busy:
            decided = _decided(state, content, due, now, "rule", deferred=deferred)
            event = at_send(decided, now, windows, defer)
            events.append(event)
            if isinstance(event, RunSkipped):
                continue  # skipped at its send moment: it holds no slot
        elif content.overlap is Overlap.BUFFER_ONE and not buffered:
            events.append(_decided(state, content, due, now, "rule", held=True, deferred=deferred))
            buffered = True
        else:
            events.append(RunSkipped(at=now, due=due, reason="overlap"))
        busy = busy or content.overlap is not Overlap.ALLOW
    return events


def _decide_run(state: ScheduleState, command: DecideRun) -> list[ScheduleEvent]:
    sid = state.schedule_id
    _require_live(state, "start a run of")
    if command.due > command.now + FUTURE_TOLERANCE:
        raise InvalidSchedule(
            f"due time {time_to_json(command.due)} of {sid!r} is in the future",
            schedule_id=sid,
            rule="A6",
        )
    if command.due in command.decided or _pending(state, command.due) is not None:
        return []
    if command.decided_through is not None and command.due <= command.decided_through:
        return []
    if state.last_decided is not None and command.due == state.last_decided:
        return []
    assert state.content is not None
    return [
        _decided(
            state,
            state.content,
            command.due,
            command.now,
            command.reason,
            by=command.by,
            note=command.note,
        )
    ]


# Fold -------------------------------------------------------------------------------------


def _later(a: datetime | None, b: datetime) -> datetime:
    return b if a is None or b > a else a


def fold(state: ScheduleState, event: ScheduleEvent) -> ScheduleState:
    """The state after one event. Unknown events leave the state as it is."""
    changes = _changes(state, event)
    changes["version"] = state.version + 1
    return _evolved(state, changes)


def _evolver() -> Callable[[ScheduleState, dict[str, Any]], ScheduleState]:
    """``dataclasses.replace(state, **changes)`` for :class:`ScheduleState`, at half the cost:
    a function written for its fields that sets them as its ``__init__`` does (a frozen,
    slotted dataclass with no ``__post_init__``: nothing else happens there). Folding runs
    for every event a burst stores."""
    names = [f.name for f in fields(ScheduleState)]
    if hasattr(ScheduleState, "__post_init__") or any(not f.init for f in fields(ScheduleState)):
        return lambda state, changes: replace(state, **changes)
    body = "".join(f"    _set(new, {n!r}, get({n!r}, state.{n}))\n" for n in names)
    head = "def evolved(state, changes):\n    new = _new(_cls)\n    get = changes.get\n"
    source = f"{head}{body}    return new\n"
    scope: dict[str, Any] = {
        "_new": object.__new__,
        "_set": object.__setattr__,
        "_cls": ScheduleState,
    }
    exec(source, scope)  # code written here, from the class's own field names
    return cast("Callable[[ScheduleState, dict[str, Any]], ScheduleState]", scope["evolved"])


def _changes(state: ScheduleState, event: ScheduleEvent) -> dict[str, Any]:
    """The fields an event changes (one new state per event: folding is on the hot path).
    The events of every run first."""
    if isinstance(event, RunDecided):
        pending = PendingRun(
            due=event.due,
            run_id=event.run_id,
            task=event.task,
            input=event.input,
            options=event.options,
            reason=event.reason,
            held=event.held,
            track_end=event.track_end,
            send_at=event.send_at,
            deadline=event.deadline,
            blackout=event.blackout,
        )
        counts = event.reason == "rule"
        return dict(
            cursor=_later(state.cursor, event.due) if counts else state.cursor,
            last_decided=_later(state.last_decided, event.due),
            runs_decided=state.runs_decided + 1,
            runs_since_change=state.runs_since_change + (1 if counts else 0),
            pending=(*state.pending, pending),
        )
    if isinstance(event, RunSent):
        started = _pending(state, event.due)
        running = state.running
        if started is not None and started.track_end:
            running = (*running, event.due)
        return dict(pending=_without(state.pending, event.due), running=running)
    if isinstance(event, ScheduleCreated):
        start = event.at if event.since is None else event.since
        return dict(
            content=event.content,
            created_digest=digest(event.content),
            created_at=event.at,
            anchor=start,
            cursor=None if isinstance(event.content.rule, Once) else start,
        )
    if isinstance(event, ScheduleChanged):
        start = event.at if event.since is None else event.since
        if isinstance(event.content.rule, Once):
            cursor = state.last_decided
        elif event.since is None:
            cursor = _later(state.cursor, start)
        else:
            # A re-import continues from its source's last run (I1), which may be earlier
            # than the cursor, but never before a due time this schedule has decided.
            cursor = _later(state.last_decided, start)
        return dict(content=event.content, anchor=start, cursor=cursor, runs_since_change=0)
    if isinstance(event, SchedulePaused):
        return dict(paused=True)
    if isinstance(event, ScheduleResumed):
        return dict(paused=False, cursor=_later(state.cursor, event.at))
    if isinstance(event, ScheduleDeleted):
        return dict(deleted=True)
    if isinstance(event, RunFailedToStart):
        # A worker may record a sent run that could not start (P5): it ends no tracked run.
        return dict(
            pending=_without(state.pending, event.due),
            running=tuple(t for t in state.running if t != event.due),
        )
    if isinstance(event, RunMissed):
        return dict(
            pending=_without(state.pending, event.due),
            running=tuple(t for t in state.running if t != event.due),
        )
    if isinstance(event, RunEndReported):
        return dict(running=tuple(t for t in state.running if t != event.due))
    if isinstance(event, RunSkipped):
        # A decided run skipped at its send moment (P4) leaves the runs waiting to be sent.
        left = _without(state.pending, event.due)
        return dict(cursor=_later(state.cursor, event.due), pending=left)
    if isinstance(event, RunDeferred):
        return dict(
            pending=tuple(
                replace(p, send_at=event.until, blackout=event.blackout)
                if p.due == event.due
                else p
                for p in state.pending
            )
        )
    if isinstance(event, RunsMissed):
        return dict(cursor=_later(state.cursor, event.through))
    return {}


_evolved = _evolver()


def fold_all(state: ScheduleState, events: Iterable[ScheduleEvent]) -> ScheduleState:
    """Fold a sequence of events."""
    for event in events:
        state = fold(state, event)
    return state


def decide_all(
    state: ScheduleState, commands: Iterable[Command]
) -> tuple[list[ScheduleEvent], ScheduleState]:
    """Decide commands in turn, each on the state the ones before it left; the events of all
    of them (appended together, all or nothing) and the state after them."""
    events: list[ScheduleEvent] = []
    for command in commands:
        produced = decide(state, command)
        state = fold_all(state, produced)
        events.extend(produced)
    return events, state
