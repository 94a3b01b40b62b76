"""Decide, append, and on a version conflict read again and decide again: written once.

Every writer appends at the stream version it read (optimistic concurrency, A8). When another
process appended first the journal raises ``AppendConflict``; the writer reads what was added
and tries again. :func:`retry_on_conflict` is that loop, with one limit and one back-off for
the schedule API, run control, the worker's claim and its step writes.

The dispatcher's batch append resolves conflicts stream by stream within one transaction of
many schedules; :class:`ConflictCount` gives it the same limit and back-off per stream, after
which it leaves that stream out of the batch instead of trying for ever.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Hashable
from typing import TypeVar

from celery_durable.errors import AppendConflict, DurableError

T = TypeVar("T")

CONFLICT_ATTEMPTS = 50
"""Tries before giving up: far more than two writers racing on one stream ever need."""

BACKOFF_CAP = 0.05
"""The longest pause (seconds) between two tries."""


def backoff(conflicts: int) -> float:
    """The pause after the ``conflicts``-th conflict in a row: none after the first, then
    a random pause below ``1 ms × 2ⁿ``, capped, so that racing writers fall out of step."""
    if conflicts <= 1:
        return 0.0
    return random.uniform(0.0, min(BACKOFF_CAP, 0.001 * 2.0 ** (conflicts - 1)))


def retry_on_conflict(
    attempt: Callable[[], T],
    *,
    reread: Callable[[], None] | None = None,
    what: str,
) -> T:
    """``attempt()`` until it returns without ``AppendConflict``; ``reread()`` between tries.

    ``attempt`` decides on the state it holds and appends at that state's version; ``reread``
    brings that state up to date (and may raise to stop, e.g. when the writes no longer fit).
    Raises :class:`DurableError` naming ``what`` after :data:`CONFLICT_ATTEMPTS` conflicts.
    """
    for conflicts in range(1, CONFLICT_ATTEMPTS + 1):
        try:
            return attempt()
        except AppendConflict:
            if conflicts == CONFLICT_ATTEMPTS:
                break
            if reread is not None:
                reread()
            pause = backoff(conflicts)
            if pause:
                time.sleep(pause)
    raise DurableError(f"{what}: too many concurrent writers ({CONFLICT_ATTEMPTS} conflicts)")


class ConflictCount:
    """Conflicts per stream of a batch that resolves them one stream at a time.

    :meth:`another` counts a conflict of ``key``: ``False`` once ``key`` has had
    :data:`CONFLICT_ATTEMPTS` of them (give it up), else ``True`` after the back-off pause
    :func:`retry_on_conflict` would make.
    """

    def __init__(self, sleep: Callable[[float], None] | None = None) -> None:
        self._counts: dict[Hashable, int] = {}
        self._sleep = sleep or time.sleep

    def another(self, key: Hashable) -> bool:
        conflicts = self._counts[key] = self._counts.get(key, 0) + 1
        if conflicts >= CONFLICT_ATTEMPTS:
            return False
        pause = backoff(conflicts)
        if pause:
            self._sleep(pause)
        return True
