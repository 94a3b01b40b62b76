"""A clock the tests move by hand: ``Durable(app, url, clock=FakeClock())``."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=timezone.utc)
"""Where fake clocks start: Monday 2026-11-02 12:00 UTC."""


class FakeClock:
    """Returns ``now``; ``set``/``advance`` move it (it never moves by itself)."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def set(self, moment: datetime) -> None:
        self.now = moment

    def advance(self, **kwargs: float) -> None:
        self.now += timedelta(**kwargs)
