"""From Celery schedule objects to durable rules (an adapter: it reads Celery objects).

Used by the ``beat_schedule`` import and by importers of django-celery-beat and RedBeat rows
(SPEC B2, B3, I1, I2). Celery's own parser is the faithful source of a crontab's meaning, so
the rule is built from the field sets Celery expanded, not from the text the user wrote.
"""

from __future__ import annotations

from datetime import timedelta, timezone, tzinfo

from celery.schedules import BaseSchedule, crontab, solar

from celery_durable.errors import InvalidSchedule
from celery_durable.rules import Crontab, Solar

__all__ = ["crontab_rule", "own_zone", "solar_rule", "zone_name"]


def zone_name(zone: str | tzinfo) -> str:
    """The IANA name of a time zone given as a name, a ``ZoneInfo``, a pytz zone or UTC.

    A fixed offset of whole hours maps to ``Etc/GMT±N``; any other zone without a name raises
    :class:`InvalidSchedule`.
    """
    if isinstance(zone, str):
        return zone
    name = getattr(zone, "key", None) or getattr(zone, "zone", None)  # zoneinfo, pytz
    if isinstance(name, str):
        return name
    if isinstance(zone, timezone):
        offset = zone.utcoffset(None)
        if offset == timedelta(0):
            return "UTC"
        hours, rest = divmod(offset, timedelta(hours=1))
        if not rest and -14 <= hours <= 12:
            # POSIX-style names: Etc/GMT-2 is two hours *ahead* of UTC.
            return f"Etc/GMT{-hours:+d}"
    raise InvalidSchedule(f"time zone {zone!r} has no IANA name (use a ZoneInfo)", field="zone")


def own_zone(schedule: BaseSchedule) -> tzinfo | str | None:
    """The zone a schedule object carries itself (``schedule.tz = …`` or a ``tz`` property of a
    subclass, as django-celery-beat's ``TzAwareCrontab`` has), else ``None``: Celery would use
    the app's zone."""
    if "tz" in vars(schedule) or type(schedule).tz is not BaseSchedule.tz:
        found = schedule.tz
        return found if isinstance(found, (tzinfo, str)) else None
    return None


def crontab_rule(schedule: crontab, zone: str | tzinfo = "UTC") -> Crontab:
    """The :class:`Crontab` rule that is due exactly when ``schedule`` is (B2).

    ``zone`` is the app's zone (``app.timezone``), used unless the object has its own.
    """
    if not isinstance(schedule, crontab):
        raise InvalidSchedule(
            f"expected a celery.schedules.crontab, got {type(schedule).__name__}",
            field="schedule",
        )
    return Crontab(
        minute=schedule.minute,
        hour=schedule.hour,
        day_of_week=schedule.day_of_week,
        day_of_month=schedule.day_of_month,
        month_of_year=schedule.month_of_year,
        zone=zone_name(own_zone(schedule) or zone),
    )


def solar_rule(schedule: solar) -> Solar:
    """The :class:`Solar` rule that is due when ``schedule`` is (B3): same event and place."""
    if not isinstance(schedule, solar):
        raise InvalidSchedule(
            f"expected a celery.schedules.solar, got {type(schedule).__name__}", field="schedule"
        )
    return Solar(schedule.event, schedule.lat, schedule.lon)
