"""From Celery schedule objects to durable rules, with type checks (an adapter: imports Celery).

Used by the ``beat_schedule`` import and by importers of django-celery-beat and RedBeat rows
(SPEC B2, B3, I1, I2). Celery's own parser is the faithful source of a crontab's meaning, so
the rule is built from the field sets Celery expanded, not from the text the user wrote.
"""

from __future__ import annotations

from datetime import tzinfo

from celery.schedules import crontab, solar

from celery_durable.core.rules import Crontab, Solar
from celery_durable.errors import InvalidSchedule

__all__ = ["crontab_rule", "solar_rule"]


def crontab_rule(schedule: crontab, zone: str | tzinfo = "UTC") -> Crontab:
    """The :class:`Crontab` rule that is due exactly when ``schedule`` is (B2).

    ``zone`` is the app's zone (``app.timezone``), used unless the object has its own.
    """
    if not isinstance(schedule, crontab):
        raise InvalidSchedule(
            f"expected a celery.schedules.crontab, got {type(schedule).__name__}",
            field="schedule",
        )
    return Crontab.from_celery(schedule, zone)


def solar_rule(schedule: solar) -> Solar:
    """The :class:`Solar` rule that is due when ``schedule`` is (B3): same event and place."""
    if not isinstance(schedule, solar):
        raise InvalidSchedule(
            f"expected a celery.schedules.solar, got {type(schedule).__name__}", field="schedule"
        )
    return Solar.from_celery(schedule)
