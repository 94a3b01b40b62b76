"""Which due times of a rule to decide at a given moment (SPEC §4: C1–C3). Pure.

The dispatcher may come back after a long downtime: an every-minute cron that was down for a
year has half a million missed due times. Selection therefore never walks the whole gap: it
scans forward a bounded number of steps and, when that is not enough, searches back from *now*
with growing windows for the most recent due times the policy keeps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery_durable.core.policies import CatchUp
from celery_durable.core.rules import Rule

ON_TIME = timedelta(seconds=60)
"""A due time reached at most this late is on time; later it is missed."""

ALL_LIMIT = 1000
"""``CatchUp.ALL`` runs at most this many of the most recent missed due times (C2)."""

_FORWARD_STEPS = 2000


@dataclass(frozen=True, slots=True)
class Selection:
    """Due times to decide (oldest first) and what the policy dropped."""

    run: tuple[datetime, ...]
    dropped: int | None = 0
    """How many due times were dropped; ``None`` when too many to count."""
    dropped_through: datetime | None = None
    """A moment at or after the latest dropped due time, before the first kept one."""


def due_times(
    rule: Rule, after: datetime, until: datetime, anchor: datetime | None
) -> Iterator[datetime]:
    """The rule's due times in ``(after, until]``, oldest first."""
    moment = after
    while True:
        due = rule.next_after(moment, anchor=anchor)
        if due is None or due > until:
            return
        yield due
        moment = due


def recent_due_times(
    rule: Rule, after: datetime, until: datetime, anchor: datetime | None, keep: int
) -> Selection:
    """The ``keep`` most recent due times in ``(after, until]`` and what lies before them."""
    window: deque[datetime] = deque(maxlen=keep)
    dropped = 0
    last_dropped: datetime | None = None
    steps = 0
    reached = after
    for due in due_times(rule, after, until, anchor):
        if len(window) == keep:
            last_dropped = window[0] if keep else due
            dropped += 1
        window.append(due)
        reached = due
        steps += 1
        if steps >= keep + _FORWARD_STEPS:
            break
    else:
        return Selection(tuple(window), dropped, last_dropped)
    if keep == 0:
        return Selection((), None, until)
    # Far behind: estimate the width holding `keep` due times and widen until it does.
    scanned = max(reached - after, timedelta(seconds=1))
    width = max(scanned * (keep + 1) / steps, timedelta(seconds=1))
    while True:
        low = until - width
        if low <= reached:
            low = reached
        found = list(due_times(rule, low, until, anchor))
        if low == reached:
            found = list(window) + found
        if len(found) > keep or low == reached:
            kept = found[-keep:]
            older = found[: len(found) - len(kept)]
            through = older[-1] if older else low
            return Selection(tuple(kept), None, through)
        width *= 2


def select(
    rule: Rule,
    *,
    after: datetime,
    now: datetime,
    anchor: datetime | None,
    policy: CatchUp,
) -> Selection:
    """The due times in ``(after, now]`` that ``policy`` runs, oldest first (C1–C3)."""
    if policy is CatchUp.LATEST:
        return recent_due_times(rule, after, now, anchor, 1)
    if policy is CatchUp.ALL:
        return recent_due_times(rule, after, now, anchor, ALL_LIMIT)
    # Due times before `boundary` are missed; one exactly ON_TIME late is still on time.
    boundary = now - ON_TIME - timedelta(microseconds=1)
    if boundary <= after:
        return Selection(recent_due_times(rule, after, now, anchor, ALL_LIMIT).run)
    on_time = recent_due_times(rule, boundary, now, anchor, ALL_LIMIT).run
    first = rule.next_after(after, anchor=anchor)
    if first is None or first > boundary:
        return Selection(on_time)
    missed = recent_due_times(rule, after, boundary, anchor, 0)
    return Selection(on_time, missed.dropped, boundary)
