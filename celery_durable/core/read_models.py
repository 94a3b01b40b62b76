"""Read models handed to users: a schedule as the index knows it, and its runs (SPEC §7)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery_durable.core.blackouts import Blackout, OnBlackout
from celery_durable.core.policies import CatchUp, Overlap
from celery_durable.core.rules import BeatEntry, Rule


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
