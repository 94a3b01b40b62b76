"""The live schedule objects of ``beat_schedule`` entries that no stored rule expresses (B3).

A :class:`~celery_durable.core.rules.BeatEntry` rule is due when its entry's Celery schedule
object says so, as in stock beat. Those objects exist only in the beat process that imported
the entries: its :class:`~celery_durable.runtime.Runtime` owns one :class:`BeatObjects` and
passes it to the core wherever a due time is computed (the core holds no live state).
Elsewhere (an API client, the CLI) nothing is bound and such a rule has no next due time.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

UTC = timezone.utc

LIVE_RETRY = timedelta(seconds=60)
"""How long an entry whose schedule object raised waits before it is asked again."""

log = logging.getLogger("celery_durable.beat")


class BeatObjects:
    """The schedule objects of one beat's entries, by entry name (a ``LiveSchedules``).

    Asked without a moment (:meth:`next_due`), an object uses its own clock, as stock beat
    does; :meth:`as_of` asks every object as of the moment a decision is made.
    """

    def __init__(self) -> None:
        self._objects: dict[str, tuple[Any, bool]] = {}
        self._lock = threading.Lock()

    def bind(self, entry: str, schedule: Any, *, on_grid: bool = False) -> None:
        """Hold the schedule object of ``beat_schedule`` entry ``entry``.

        ``on_grid``: the object's ``is_due`` is Celery's own, derived from
        ``remaining_estimate``, so past due times on that estimate's grid are real due times
        (catch-up can list them).
        """
        with self._lock:
            self._objects[entry] = (schedule, on_grid)

    def next_due(self, entry: str, after: datetime) -> datetime | None:
        """The entry's next due time after its last run at ``after``, by the object's clock."""
        return self._ask(entry, after, None)

    def as_of(self, now: datetime) -> _AsOf:
        """These objects, asked as of ``now``."""
        return _AsOf(self, now)

    def _ask(self, entry: str, after: datetime, now: datetime | None) -> datetime | None:
        found = self._objects.get(entry)
        if found is None:
            return None
        schedule, on_grid = found
        try:
            return next_due_of(schedule, after, on_grid, now)
        except Exception:
            # The project's own code failed: this entry waits, the other schedules go on.
            log.exception("beat_schedule entry %r: its schedule object failed", entry)
            return (now or datetime.now(UTC)) + LIVE_RETRY


class _AsOf:
    """:class:`BeatObjects` asked as of one moment."""

    __slots__ = ("_now", "_objects")

    def __init__(self, objects: BeatObjects, now: datetime) -> None:
        self._objects = objects
        self._now = now

    def next_due(self, entry: str, after: datetime) -> datetime | None:
        return self._objects._ask(entry, after, self._now)

    def as_of(self, now: datetime) -> _AsOf:
        return _AsOf(self._objects, now)


def _seconds(value: object) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    return float(value)  # type: ignore[arg-type]


def next_due_of(
    schedule: Any, after: datetime, on_grid: bool, at: datetime | None = None
) -> datetime | None:
    """The next due time of a Celery schedule object whose last run was at ``after``.

    Asked as stock beat asks it: ``is_due(last_run_at)`` decides, as of ``at`` (the object's
    own ``now()`` when ``None``). When ``is_due`` is Celery's own (``on_grid``),
    ``remaining_estimate`` places the due time on the object's grid, so a relative interval
    keeps its hours across restarts and catch-up can list missed ones (B8, C1–C3). Otherwise
    the due time is the moment of the decision, like stock beat's send. When the object is
    not due, the next look is at its estimate or after the seconds ``is_due`` asks for.
    """
    own_now = schedule.now()
    if own_now.tzinfo is None:
        own_now = own_now.replace(tzinfo=UTC)
    now = (at or own_now).astimezone(UTC)
    if on_grid:
        # Celery's own classes hold only configuration: a copy whose clock stands still at
        # `now` answers is_due and remaining_estimate for one instant, so the estimate is
        # exact (read twice, a moving clock would shift it by the microseconds in between).
        # (Not copy.copy: Celery's __reduce__ would rebuild the object without its app.)
        still = object.__new__(type(schedule))
        still.__dict__.update(vars(schedule), nowfun=lambda: now)
        schedule = still
        own_now = now
    try:
        zone = schedule.tz
    except Exception:  # no app bound: Celery treats naive times as UTC
        zone = UTC
    last = after.astimezone(zone) if zone is not None else after
    is_due, wait = schedule.is_due(last)
    estimate: datetime | None = None
    try:
        remaining = schedule.remaining_estimate(last)
    except NotImplementedError:
        remaining = None
    if isinstance(remaining, timedelta):
        estimate = (own_now + remaining).astimezone(UTC)
    if is_due:
        if on_grid and estimate is not None and after < estimate <= now:
            return estimate
        if now > after:
            return now
    if estimate is not None and estimate > now:
        return estimate
    return now + timedelta(seconds=max(_seconds(wait), 1.0))


__all__ = ["LIVE_RETRY", "BeatObjects", "next_due_of"]
