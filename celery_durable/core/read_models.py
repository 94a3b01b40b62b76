"""Read models handed to users: a schedule as the index knows it, and its runs (SPEC §7).

A run's state is told by two sources: the schedule's events (decided, sent, skipped, missed,
failed to start: :class:`RunView`) and, for a durable task, its run (the run table's ``status``
and the ending its stream recorded). :func:`run_outcome` and :func:`project_run` merge them,
once, for ``Schedules.runs`` (V2), the command line and the Django admin alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery_durable.core.blackouts import Blackout, OnBlackout
from celery_durable.core.outcomes import Faulted, Outcome
from celery_durable.core.policies import CatchUp, Overlap
from celery_durable.core.rules import BeatEntry, Rule
from celery_durable.core.run_aggregate import (
    RUN_CANCELLED,
    RUN_FAULTED,
    RUN_FINISHED,
    RUN_PARKED,
    fold,
    parked_outcome,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleView:
    """A schedule's content and status (V1). Times are aware UTC."""

    id: str
    task: str
    input: Any
    rule: Rule
    catch_up: CatchUp
    overlap: Overlap
    options: Mapping[str, Any]
    paused: bool
    deleted: bool
    anchor: datetime | None
    next_due: datetime | None
    """``None`` while paused, deleted or complete."""
    created_at: datetime | None
    runs_decided: int
    pending: int
    """Decided runs whose message is not on the broker yet."""
    version: int
    last_due: datetime | None = None
    """The due time of the newest decided run (a trigger's is its moment), ``None`` before one."""
    start_deadline: timedelta | None = None
    """P1: a run not started by due + this never starts (``None``: no deadline)."""
    jitter: timedelta | None = None
    """P2: each run is sent up to this long after its due time (``None``: at due)."""
    catch_up_window: timedelta | None = None
    """P3: due times older than this are dropped after downtime (``None``: no window)."""
    blackouts: tuple[Blackout, ...] = ()
    """P4: the schedule's own blackout windows (the global ones: ``durable.blackouts``)."""
    on_blackout: OnBlackout = OnBlackout.SKIP
    """P4: what a due time inside a window (its own or a global one) does."""
    next_run: datetime | None = None
    """P4: when the next run will really be sent: a decided run still waiting to be sent, else
    the first due time whose run no blackout window skips, at its send moment (plus its jitter
    offset, P2; or the end of the blackout that defers it). ``next_due`` for a schedule
    without windows and jitter."""

    def waiting_since(self, now: datetime) -> datetime | None:
        """The due time this schedule has waited on since, at ``now`` (O4); ``None``: none.

        Its next due time once past (not decided yet), else, while a decided run is unsent,
        its newest decided due time. Lateness is ``now`` minus this.
        """
        if self.deleted:
            return None
        waiting = [
            moment
            for moment in (self.next_due, self.last_due if self.pending else None)
            if moment is not None and moment <= now
        ]
        return min(waiting, default=None)

    @property
    def complete(self) -> bool:
        """No due time is left (``Once`` decided, ``max_runs`` reached, past ``end_at``).

        Never for a :class:`BeatEntry` rule: only the beat holding its object knows its next
        due time, so elsewhere ``next_due`` is ``None`` without the schedule being over.
        """
        live = isinstance(self.rule, BeatEntry) and self.rule.max_runs is None
        return not self.deleted and not self.paused and self.next_due is None and not live


@dataclass(frozen=True, slots=True, kw_only=True)
class RunView:
    """One decided (or skipped) due time of a schedule (V2)."""

    run_id: str
    schedule_id: str
    due: datetime
    state: str
    """``decided``, ``started``, ``skipped``, ``failed_to_start`` or ``missed`` (P1: its start
    deadline passed; ``error`` gives the reason)."""
    task: str | None = None
    input: Any = None
    reason: str = "rule"
    decided_at: datetime | None = None
    started_at: datetime | None = None
    error: str | None = None
    missed_at: datetime | None = None
    outcome: str | None = None
    """For durable tasks: ``running``, ``finished``, ``faulted``, ``cancelled``, ``parked``."""
    extra: Mapping[str, Any] = field(default_factory=dict)


NOT_STARTED = ("skipped", "failed_to_start", "missed")
"""The schedule's states of runs that never started: their word wins, shown with the reason."""

ENDED = ("finished", "faulted", "cancelled", "parked")
"""Run-table statuses of durable runs that ended: their stream holds the ending."""

ENDING_EVENTS = (RUN_FINISHED, RUN_FAULTED, RUN_CANCELLED, RUN_PARKED)
"""The run-stream event types that tell how a durable run ended (read in a batch for pages)."""


def run_outcome(run: RunView, status: str | None) -> str | None:
    """A run's ``outcome`` (V2): a started run's durable-run ``status`` from the run table
    when it has a row, else what the schedule's events reported (``RunEndReported``)."""
    if run.state == "started" and status is not None:
        return status
    return run.outcome


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStatus:
    """One run of a schedule with what its durable run says: the state users see."""

    run: RunView
    state: str
    """The one word: the schedule's word for a run that never started, else the durable run's
    status, else the reported outcome, else the schedule's word (``decided``, ``started``)."""
    stage: str
    """How far the schedule got: ``decided``, ``started``, ``skipped``, ``failed_to_start``
    or ``missed``; a decided run whose durable run has a row was sent: ``started`` (A6: the
    dispatcher sent it but had not, or after a crash never, recorded the start)."""
    outcome: str
    """The durable run's status (``parked`` for a run its ending parked), else the reported
    outcome; ``""`` without either."""
    ending: Outcome | None = None
    """How the durable run ended, from its stream (only once its row says it ended)."""
    error: str | None = None
    """Why the run did not start (or failed to); ``None`` once its durable run ended."""


def ending_of(events: Iterable[Any]) -> Outcome | None:
    """The ending recorded by a durable run's :data:`ENDING_EVENTS` (a parked run counts as
    ``Faulted``, kind ``parked``; W6, W7); ``None`` before one."""
    state = fold(events)
    return state.outcome if state.outcome is not None else parked_outcome(state)


def ending_word(ending: Outcome) -> str:
    """``finished``, ``faulted``, ``parked`` (a ``Faulted`` of kind ``parked``) or
    ``cancelled``."""
    if isinstance(ending, Faulted) and ending.kind == "parked":
        return "parked"
    return type(ending).__name__.lower()


def project_run(
    run: RunView, status: str | None = None, ending: Outcome | None = None
) -> RunStatus:
    """Merge a schedule's run with its durable run: the run table's ``status`` (``None``: no
    row) and the ending read from its stream (:func:`ending_of`; looked at only when
    ``status`` is one of :data:`ENDED`). Pure: the caller reads both, for a page at once."""
    if run.state in NOT_STARTED:
        state = run.state
    elif status is not None:
        state = status
    else:
        state = run.outcome or run.state
    stage, outcome, error = run.state, run.outcome or "", run.error
    if run.state in ("started", "decided") and status is not None:
        stage, outcome = "started", status
        if status in ENDED:
            error = None
            if ending is None:
                return RunStatus(run=run, state=state, stage=stage, outcome=outcome)
            outcome = ending_word(ending)
            return RunStatus(run=run, state=state, stage=stage, outcome=outcome, ending=ending)
    return RunStatus(run=run, state=state, stage=stage, outcome=outcome, error=error)
