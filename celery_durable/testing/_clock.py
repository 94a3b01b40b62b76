"""The test clock of the ``durable`` fixture: it moves only when a test (or a skipped wait)
moves it."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

__all__ = ["TestClock", "aware_utc"]


class TestClock:
    """An aware UTC clock that moves only when told to; ``sleep`` moves it instead of waiting."""

    __test__ = False  # not a test class for pytest

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime.now(timezone.utc).replace(microsecond=0)
        self._now = aware_utc(start, "start")
        self._lock = threading.Lock()
        self.slept = 0.0
        """Seconds the worker asked to wait, skipped by moving the clock."""

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def set(self, moment: datetime) -> None:
        """Move the clock to ``moment`` (aware); it may not go back."""
        moment = aware_utc(moment, "moment")
        with self._lock:
            if moment < self._now:
                raise ValueError(f"the test clock cannot go back from {self._now} to {moment}")
            self._now = moment

    def sleep(self, seconds: float) -> None:
        """What the worker calls instead of ``time.sleep``: the clock moves, no wall time passes."""
        with self._lock:
            self._now += timedelta(seconds=seconds)
            self.slept += seconds


def aware_utc(moment: datetime, what: str) -> datetime:
    if not isinstance(moment, datetime) or moment.utcoffset() is None:
        raise ValueError(f"{what} must be an aware datetime, not {moment!r}")
    return moment.astimezone(timezone.utc)
