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
from functools import lru_cache

from celery_durable.core.policies import CatchUp
from celery_durable.core.rules import LiveSchedules, Rule

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
    rule: Rule,
    after: datetime,
    until: datetime,
    anchor: datetime | None,
    live: LiveSchedules | None = None,
) -> Iterator[datetime]:
    """The rule's due times in ``(after, until]``, oldest first."""
    moment = after
    while True:
        due = rule.next_after(moment, anchor=anchor, live=live)
        if due is None or due > until:
            return
        yield due
        moment = due


def recent_due_times(
    rule: Rule,
    after: datetime,
    until: datetime,
    anchor: datetime | None,
    keep: int,
    live: LiveSchedules | None = None,
) -> Selection:
    """The ``keep`` most recent due times in ``(after, until]`` and what lies before them."""
    window: deque[datetime] = deque(maxlen=keep)
    dropped = 0
    last_dropped: datetime | None = None
    steps = 0
    reached = after
    for due in due_times(rule, after, until, anchor, live):
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
        found = list(due_times(rule, low, until, anchor, live))
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
    window: timedelta | None = None,
    live: LiveSchedules | None = None,
) -> Selection:
    """The due times in ``(after, now]`` that ``policy`` runs, oldest first (C1–C3, P3).

    ``window`` (``LATEST`` and ``ALL`` only): due times older than ``now - window`` are
    dropped before the policy chooses among the rest; one exactly ``window`` old is kept.
    ``live`` evaluates :class:`~.rules.BeatEntry` rules (B3).

    The answer depends on nothing else (the live objects aside): it is remembered, so that a
    burst of schedules of one rule, on one grid, decided at one moment computes it once. The
    anchor is part of the key only for rules that read it (``Every``).
    """
    if live is not None and rule.asks_live:
        return _select(rule, after, now, anchor, policy, window, live)
    key_anchor = anchor if rule.uses_anchor else None
    try:
        return _remembered(rule, after, now, key_anchor, policy, window, None)
    except TypeError:  # an unhashable argument: nothing to remember it by
        return _select(rule, after, now, anchor, policy, window, None)


def _select(
    rule: Rule,
    after: datetime,
    now: datetime,
    anchor: datetime | None,
    policy: CatchUp,
    window: timedelta | None,
    live: LiveSchedules | None,
) -> Selection:
    if policy is CatchUp.NONE:
        # Due times before the boundary are missed; one exactly ON_TIME late is still on time.
        return _within(rule, after, now, anchor, now - ON_TIME, ALL_LIMIT, live)
    keep = 1 if policy is CatchUp.LATEST else ALL_LIMIT
    if window is None:
        return recent_due_times(rule, after, now, anchor, keep, live)
    return _within(rule, after, now, anchor, now - window, keep, live)


_remembered = lru_cache(maxsize=1024)(_select)


def _within(
    rule: Rule,
    after: datetime,
    now: datetime,
    anchor: datetime | None,
    oldest: datetime,
    keep: int,
    live: LiveSchedules | None,
) -> Selection:
    """The ``keep`` most recent due times in ``[oldest, now]`` after ``after``; the older
    ones are dropped (counted when few enough to count)."""
    boundary = oldest - timedelta(microseconds=1)
    if boundary <= after:
        return recent_due_times(rule, after, now, anchor, keep, live)
    kept = recent_due_times(rule, boundary, now, anchor, keep, live)
    first = rule.next_after(after, anchor=anchor, live=live)
    if first is None or first > boundary:
        return kept
    missed = recent_due_times(rule, after, boundary, anchor, 0, live)
    if kept.dropped == 0:
        return Selection(kept.run, missed.dropped, boundary)
    both = None if missed.dropped is None or kept.dropped is None else missed.dropped + kept.dropped
    return Selection(kept.run, both, kept.dropped_through)
