"""R4, B2: ``Cron`` (cron's OR day rule) and ``Crontab`` (Celery's AND rule), on local minutes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Any, ClassVar

from celery_durable.core import cron, crontab
from celery_durable.core.rules._base import UTC, _check_zone, _resolve, _Rule


@dataclass(frozen=True, slots=True, init=False)
class _LocalMinutes(_Rule):
    """Cron and Crontab: matching local minutes, found by look-up tables, due under R7."""

    _tz: tzinfo = field(init=False, compare=False, repr=False)
    _spec: cron.CronSpec = field(init=False, compare=False, repr=False)

    def _next(self, after: datetime, anchor: datetime | None) -> datetime | None:
        limit, zone = after.astimezone(UTC), self._tz
        local = after.astimezone(zone)
        # Start at the minute after the local time of ``after``; next_match carries minute 60.
        fields = (local.year, local.month, local.day, local.hour, local.minute + 1)
        while True:
            match = self._spec.next_match(*fields, zone)
            if match is None:
                return None
            due = _resolve(match, zone)
            # Only inside the second pass of a repeated hour can a later wall time be due
            # earlier than ``after``: its first occurrence has already gone by.
            if due > limit:
                return due
            fields = (match.year, match.month, match.day, match.hour, match.minute + 1)


@dataclass(frozen=True, slots=True, init=False)
class Cron(_LocalMinutes):
    """R4: a five-field cron expression evaluated on local time in ``zone`` (Vixie rules).

    >>> Cron(" 0  2 * * MON ") == Cron("0 2 * * mon")
    True
    """

    tag: ClassVar[str] = "cron"
    expr: str
    zone: str
    end_at: datetime | None
    max_runs: int | None

    def __init__(
        self,
        expr: str,
        zone: str = "UTC",
        *,
        end_at: datetime | None = None,
        max_runs: int | None = None,
    ) -> None:
        text = cron.normalise(expr)
        spec, tz = cron.parse(text), _check_zone("Cron.zone", zone)
        self._set("Cron", end_at, max_runs, expr=text, _spec=spec, _tz=tz, zone=zone)

    def _json_fields(self) -> dict[str, Any]:
        return {"expr": self.expr, "zone": self.zone}

    def _describe(self) -> str:
        return f'cron "{self.expr}" {self.zone}'


@dataclass(frozen=True, slots=True, init=False)
class Crontab(_LocalMinutes):
    """B2: Celery's ``crontab`` on local time in ``zone``, with Celery's day rule (AND).

    Fields take every form ``celery.schedules.crontab`` takes (see
    :mod:`celery_durable.core.crontab`) and are kept as sorted tuples of the values they expand
    to. A day matches only when its month, day of month **and** day of week all match — unlike
    :class:`Cron`, which follows cron's OR rule (R4). Local times follow R7.

    >>> Crontab(minute=0, hour=[2, 14], day_of_week="Monday-wed") == Crontab(0, "2,14", "1-3")
    True
    """

    tag: ClassVar[str] = "crontab"
    minute: tuple[int, ...]
    hour: tuple[int, ...]
    day_of_week: tuple[int, ...]
    day_of_month: tuple[int, ...]
    month_of_year: tuple[int, ...]
    zone: str
    end_at: datetime | None
    max_runs: int | None

    def __init__(
        self,
        minute: Any = "*",
        hour: Any = "*",
        day_of_week: Any = "*",
        day_of_month: Any = "*",
        month_of_year: Any = "*",
        zone: str = "UTC",
        *,
        end_at: datetime | None = None,
        max_runs: int | None = None,
    ) -> None:
        given = (minute, hour, day_of_week, day_of_month, month_of_year)
        sets = [
            crontab.expand(name, value) for name, value in zip(crontab.FIELDS, given, strict=True)
        ]
        spec = crontab.spec(*sets)
        values = {
            name: tuple(sorted(found)) for name, found in zip(crontab.FIELDS, sets, strict=True)
        }
        tz = _check_zone("Crontab.zone", zone)
        self._set("Crontab", end_at, max_runs, **values, zone=zone, _tz=tz, _spec=spec)

    @classmethod
    def from_celery(cls, schedule: Any, zone: str | tzinfo = "UTC") -> Crontab:
        """The rule of a ``celery.schedules.crontab``: its own ``tz`` if it has one, else ``zone``.

        Reads the field sets Celery's own parser expanded (``schedule.minute`` …), so the rule
        means what Celery means. Pass the app's zone (``app.timezone``) as ``zone``. Only reads
        attributes: this module does not import Celery.
        """
        return cls(
            schedule.minute,
            schedule.hour,
            schedule.day_of_week,
            schedule.day_of_month,
            schedule.month_of_year,
            crontab.zone_name(crontab.own_zone(schedule) or zone),
        )

    def _json_fields(self) -> dict[str, Any]:
        return {name: list(getattr(self, name)) for name in crontab.FIELDS} | {"zone": self.zone}

    def _describe(self) -> str:
        fields = (self.minute, self.hour, self.day_of_month, self.month_of_year, self.day_of_week)
        text = " ".join(
            crontab.compact(values, name) for values, name in zip(fields, _CRON_ORDER, strict=True)
        )
        return f'crontab "{text}" {self.zone}'


_CRON_ORDER = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
