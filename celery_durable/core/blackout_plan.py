"""Where a run really starts under blackout windows (P4). Pure.

No run starts inside a window. A run meets the windows twice:

* its **due time**, when it is decided: inside a window it is skipped (``skip``) or decided
  to be sent when the blackout is over (``defer``; one run per blackout);
* its **send moment**, when the dispatcher is about to hand it to the broker. That moment can
  be later than the due time — jitter (P2), a run held by ``Overlap.BUFFER_ONE``, a catch-up
  after downtime, a broker that was away, a deferral, a window added or extended after the run
  was decided — and it is checked again: inside a window, the run is skipped with the reason
  ``blackout <name>`` (``skip``) or its send waits until the blackout is over (``defer``).

Triggers and backfills (D9) are an operator's explicit request and are not held back.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Protocol

from celery_durable.core.blackouts import Blackout, Blocked, blocking
from celery_durable.core.ids import run_id
from celery_durable.core.policies import jitter_offset
from celery_durable.core.schedule_events import RunDecided, RunDeferred, RunSkipped, ScheduleEvent


class PendingRun(Protocol):
    """What these functions read of the aggregate's decided, unsent run."""

    @property
    def due(self) -> datetime: ...
    @property
    def reason(self) -> str: ...
    @property
    def blackout(self) -> str | None: ...
    @property
    def send_time(self) -> datetime: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Fate:
    """What becomes of one due time of a schedule under its windows (P4, with P1 and P2)."""

    due: datetime
    starts: datetime | None
    """When its run is sent; ``None``: it does not run."""
    blackout: str | None = None
    """The window that skips or moves it; ``None`` when none does."""
    missed: bool = False
    """Moved past its start deadline (P1): recorded as missed, never sent."""
    deferred_to: datetime | None = None
    """The due time is inside a blackout and deferred to its end (``taken`` for the next)."""

    @property
    def moved(self) -> bool:
        """A window skips it or sends it later than it would be sent without windows."""
        return self.blackout is not None


def fate(
    schedule_id: str,
    due: datetime,
    windows: Sequence[Blackout],
    *,
    defer: bool,
    jitter: timedelta | None = None,
    deadline: timedelta | None = None,
    taken: Collection[datetime] = (),
) -> Fate:
    """The fate of a due time the rule gives, the run sent as soon as the policies allow.

    ``taken``: ends of blackouts a deferred run already waits for (a second due time inside
    the same blackout is skipped: one run per blackout). Overlap (D7) is not considered: it
    depends on when the runs before it end.
    """
    offset = timedelta(0) if jitter is None else jitter_offset(run_id(schedule_id, due), jitter)
    blocked = blocking(due, windows) if windows else None
    send, deferred_to = due + offset, None
    if blocked is not None:
        if not defer or blocked.ends is None or blocked.ends in taken:
            return Fate(due=due, starts=None, blackout=blocked.window.name)
        send, deferred_to = blocked.ends + offset, blocked.ends
    starts, at_send = send_moment(send, windows, defer=defer)
    window = blocked or at_send
    name = None if window is None else window.window.name
    if starts is not None and deadline is not None and starts >= due + deadline:
        return Fate(due=due, starts=None, blackout=name, missed=True, deferred_to=deferred_to)
    return Fate(due=due, starts=starts, blackout=name, deferred_to=deferred_to)


def fates(
    schedule_id: str,
    dues: Iterable[datetime],
    windows: Sequence[Blackout],
    *,
    defer: bool,
    jitter: timedelta | None = None,
    deadline: timedelta | None = None,
    taken: Collection[datetime] = (),
) -> Iterator[Fate]:
    """:func:`fate` of each of ``dues`` in turn: a due time inside a blackout that an earlier
    one was deferred out of is skipped (one run per blackout)."""
    ends = set(taken)
    for due in dues:
        found = fate(
            schedule_id, due, windows, defer=defer, jitter=jitter, deadline=deadline, taken=ends
        )
        if found.deferred_to is not None:
            ends.add(found.deferred_to)
        yield found


def send_moment(
    moment: datetime, windows: Sequence[Blackout], *, defer: bool
) -> tuple[datetime | None, Blocked | None]:
    """Where a send planned for ``moment`` happens: ``moment`` itself outside every window;
    inside one, the end of the blackout (``defer``; the end is outside every window) or never
    (``skip``, or a blackout that never ends). The second value is the blackout, if any."""
    blocked = blocking(moment, windows) if windows else None
    if blocked is None:
        return moment, None
    if defer and blocked.ends is not None:
        return blocked.ends, blocked
    return None, blocked


# The aggregate's side (core/schedule_aggregate.py) -------------------------------------


def send_now_or_later(
    sendable: Iterable[PendingRun], now: datetime, windows: Sequence[Blackout], *, defer: bool
) -> list[ScheduleEvent]:
    """Decided runs that would be sent now, inside a window: skipped (``skip``) or waiting
    until the blackout is over (``defer``). Runs of triggers and backfills go as asked."""
    due_now = [p for p in sendable if p.reason == "rule" and p.send_time <= now]
    blocked = blocking(now, windows) if windows and due_now else None
    if blocked is None:
        return []
    if defer and blocked.ends is not None:
        name, until = blocked.window.name, blocked.ends
        return [RunDeferred(at=now, due=p.due, until=until, blackout=name) for p in due_now]
    return [RunSkipped(at=now, due=p.due, reason=blocked.reason) for p in due_now]


def at_send(
    event: ScheduleEvent, now: datetime, windows: Sequence[Blackout], defer: bool
) -> ScheduleEvent:
    """A run decided now that would be sent at once, inside a window: skipped, or decided to
    be sent when the blackout is over. Any other event as it is."""
    if not isinstance(event, RunDecided) or event.held or not windows:
        return event
    send = event.due if event.send_at is None else event.send_at
    blocked = blocking(now, windows) if send <= now else None
    if blocked is None:
        return event
    if defer and blocked.ends is not None:
        return replace(event, send_at=blocked.ends, blackout=blocked.window.name)
    return RunSkipped(at=now, due=event.due, reason=blocked.reason)


def deferred_to(pending: Iterable[PendingRun], windows: Sequence[Blackout]) -> set[datetime]:
    """The ends of the blackouts a deferred run already waits for (one run per blackout)."""
    return {
        blocked.ends
        for p in pending
        if p.blackout is not None
        and (blocked := blocking(p.due, windows)) is not None
        and blocked.ends is not None
    }


def sent_at(pending: PendingRun, windows: Sequence[Blackout], *, defer: bool) -> datetime | None:
    """When a decided run is sent (a trigger's or backfill's as asked, D9)."""
    if pending.reason != "rule":
        return pending.send_time
    return send_moment(pending.send_time, windows, defer=defer)[0]


__all__ = [
    "Fate",
    "at_send",
    "deferred_to",
    "fate",
    "fates",
    "send_moment",
    "send_now_or_later",
    "sent_at",
]
