"""B3: ``Solar``, each day's sun event at a place, as Celery's ``solar``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from celery_durable.core import sun
from celery_durable.core.rules._base import _invalid, _Rule, _show

SOLAR_EVENTS = tuple(sun.EVENTS)
"""The sun events a Solar rule takes, as Celery's ``solar`` names them."""


def _check_degrees(where: str, value: object, limit: int) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _invalid(where, f"expected a number of degrees, got {_show(value)}")
    degrees = float(value)
    if not -limit <= degrees <= limit:  # NaN fails too
        raise _invalid(where, f"must be between -{limit} and {limit} degrees, got {value}")
    return degrees


@dataclass(frozen=True, slots=True, init=False)
class Solar(_Rule):
    """B3: each day's sun ``event`` at ``latitude``/``longitude``, as Celery's ``solar``.

    Events: ``sunrise``, ``sunset``, ``solar_noon``, and ``dawn_``/``dusk_`` ``civil``,
    ``nautical``, ``astronomical``. Days without the event (polar day or night) are skipped.
    Computing needs ``ephem`` (the ``solar`` extra); the value itself does not.

    >>> Solar("sunrise", 59.91, 10.75)
    Solar(event='sunrise', latitude=59.91, longitude=10.75, end_at=None, max_runs=None)
    """

    tag: ClassVar[str] = "solar"
    event: str
    latitude: float
    longitude: float
    end_at: datetime | None
    max_runs: int | None

    def __init__(
        self,
        event: str,
        latitude: float,
        longitude: float,
        *,
        end_at: datetime | None = None,
        max_runs: int | None = None,
    ) -> None:
        if not isinstance(event, str) or event not in SOLAR_EVENTS:
            raise _invalid("Solar.event", f"{_show(event)} is not one of {', '.join(SOLAR_EVENTS)}")
        self._set(
            "Solar",
            end_at,
            max_runs,
            event=event,
            latitude=_check_degrees("Solar.latitude", latitude, 90),
            longitude=_check_degrees("Solar.longitude", longitude, 180),
        )

    @classmethod
    def from_celery(cls, schedule: Any) -> Solar:
        """The rule of a ``celery.schedules.solar``: the same event and place."""
        return cls(schedule.event, schedule.lat, schedule.lon)

    def _next(self, after: datetime, anchor: datetime | None) -> datetime | None:
        # ephem is imported on the first computation, not with this module.
        return sun.next_event(self.event, self.latitude, self.longitude, after)

    def _json_fields(self) -> dict[str, Any]:
        return {"event": self.event, "latitude": self.latitude, "longitude": self.longitude}

    def _describe(self) -> str:
        return f"solar {self.event} at {self.latitude:g}, {self.longitude:g}"
