"""Is a dispatcher alive and keeping up? The facts behind ``celery durable health`` (O3).

Three questions, in this order, each answered from the journal alone (so a probe needs no
access to the beat process):

1. Does a dispatcher hold the lease (D6), unexpired?
2. Did it complete a tick recently? The holder's heartbeat row says when (written with the
   lease's renewals, :mod:`celery_durable.store.lease`): a dispatcher whose ticks keep failing
   still renews its lease, but its last tick grows old.
3. Is any due run waiting? The schedule index keeps each schedule's attention time (its
   earliest unsent run, else its rule's next due time); the oldest one in the past, checked
   against the schedule's latest events, is how long the oldest due run has waited.

The Prometheus gauges of :mod:`.metrics` export the same :class:`Health`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from celery_durable.schedules import ScheduleStore
from celery_durable.store.lease import LeaseFacts, read_lease
from celery_durable.store.partitions import partition_count, partition_of_lease, read_leases

if TYPE_CHECKING:
    from celery_durable.runtime import Runtime

CANDIDATES = 50
"""Index rows checked against their newest events when looking for the oldest waiting run."""

# The verdicts, as `celery durable health` names them (and exits with, docs/operations.md).
OK = "ok"
NO_DISPATCHER = "no_dispatcher"
STALLED = "stalled"
LAGGING = "lagging"


@dataclass(frozen=True, slots=True, kw_only=True)
class Waiting:
    """The due run that has waited longest: its schedule and since when."""

    schedule: str
    since: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Health:
    """What the journal says about the dispatcher at ``checked_at`` (aware UTC)."""

    checked_at: datetime
    lease: LeaseFacts | None
    """With several partitions: the held partition lease whose holder ticked longest ago."""
    waiting: Waiting | None
    partitions: int = 1
    """The journal's partition count (D10)."""
    unheld: tuple[int, ...] = ()
    """With several partitions: those no beat holds now (D11)."""
    holders: Mapping[int, str] = field(default_factory=dict)
    """Each held partition's holder (with one partition: 0 → the lease's holder)."""

    @property
    def holder(self) -> str | None:
        """The dispatcher holding an unexpired lease, else ``None``."""
        lease = self.lease
        return lease.owner if lease is not None and lease.expires_at >= self.checked_at else None

    @property
    def lease_age(self) -> float | None:
        """Seconds since the holder took the lease (``None`` without a holder or heartbeat)."""
        if self.holder is None or self.lease is None or self.lease.taken_at is None:
            return None
        return _seconds(self.checked_at, self.lease.taken_at)

    @property
    def tick_age(self) -> float | None:
        """Seconds since the holder's last completed tick (``None`` before its first)."""
        if self.holder is None or self.lease is None or self.lease.ticked_at is None:
            return None
        return _seconds(self.checked_at, self.lease.ticked_at)

    @property
    def lag(self) -> float:
        """Seconds the oldest waiting due run has waited (0 when none waits)."""
        return 0.0 if self.waiting is None else _seconds(self.checked_at, self.waiting.since)

    def verdict(self, *, max_lag: float, max_tick_age: float) -> tuple[str, str]:
        """``(verdict, one-line reason)``: ``ok`` or the first of the three questions failed."""
        lease = self.lease
        if self.unheld:
            shown = ", ".join(map(str, self.unheld[:8])) + (" …" if len(self.unheld) > 8 else "")
            return NO_DISPATCHER, (
                f"{len(self.unheld)} of {self.partitions} partitions have no holder ({shown}): "
                "is a beat missing?"
            )
        if self.holder is None or lease is None:
            if lease is None:
                return NO_DISPATCHER, "no dispatcher holds the lease (is celery beat running?)"
            ago = _seconds(self.checked_at, lease.expires_at)
            return (
                NO_DISPATCHER,
                f"no dispatcher holds the lease: {lease.owner}'s expired {ago:.1f}s ago",
            )
        tick_age = self.tick_age
        if tick_age is None:
            age = self.lease_age
            if age is not None and age > max_tick_age:
                return STALLED, (
                    f"dispatcher {lease.owner} took the lease {age:.1f}s ago and has not "
                    "completed a tick since"
                )
        elif tick_age > max_tick_age:
            return STALLED, (
                f"dispatcher {lease.owner} holds the lease but its last completed tick was "
                f"{tick_age:.1f}s ago (limit {max_tick_age:g}s)"
            )
        if self.waiting is not None and self.lag > max_lag:
            return LAGGING, (
                f"schedule {self.waiting.schedule!r} has a run due {self.lag:.1f}s ago that is "
                f"not sent yet (limit {max_lag:g}s)"
            )
        shown = "-" if tick_age is None else f"{tick_age:.1f}s"
        return OK, (
            f"dispatcher {lease.owner} holds the lease; last tick {shown} ago; "
            f"oldest waiting due run {self.lag:.1f}s"
        )


def check(runtime: Runtime) -> Health:
    """Read the lease, the heartbeat and the oldest waiting due run at the clock's time.

    Raises what the journal raises when it cannot be reached (SQLAlchemy's errors).
    """
    now = runtime.now()
    count = partition_count(runtime.sql_journal)
    if count == 1:
        lease = read_lease(runtime.sql_journal)
        holders = {0: lease.owner} if lease is not None and lease.expires_at >= now else {}
        return Health(
            checked_at=now, lease=lease, waiting=oldest_waiting(runtime, now), holders=holders
        )
    held = {}
    for row in read_leases(runtime.sql_journal):
        k = partition_of_lease(row.name)
        if k is not None and k < count and row.expires_at >= now:
            held[k] = row
    unheld = tuple(k for k in range(count) if k not in held)
    worst = min(
        held.values(),
        key=lambda r: (r.ticked_at is not None, r.ticked_at or r.taken_at or now),
        default=None,
    )
    facts = (
        None
        if worst is None
        else LeaseFacts(
            owner=worst.owner,
            expires_at=worst.expires_at,
            taken_at=worst.taken_at,
            ticked_at=worst.ticked_at,
        )
    )
    return Health(
        checked_at=now,
        lease=facts,
        waiting=oldest_waiting(runtime, now),
        partitions=count,
        unheld=unheld,
        holders={k: row.owner for k, row in held.items()},
    )


def oldest_waiting(runtime: Runtime, now: datetime) -> Waiting | None:
    """The schedule whose attention time is the oldest one at or before ``now``, if any.

    The index rows may lag a tick behind the events (D2): each candidate row is checked
    against its schedule's newest events before it counts.
    """
    store = ScheduleStore(runtime)
    for sid in runtime.index.waiting_at(now, CANDIDATES):
        attention = store.load(sid).attention()
        if attention is not None and attention <= now:
            return Waiting(schedule=sid, since=attention)
    return None


def _seconds(later: datetime, earlier: datetime) -> float:
    return max(0.0, (later - earlier).total_seconds())


__all__ = ["Health", "Waiting", "check", "oldest_waiting"]
