"""When a schedule is due: Daily, Weekly, Every, Cron, Crontab, Solar, Once (R1-R8a, B2, B3).

Rules are immutable values compared by their normalised content. ``next_after`` is pure: the
caller passes the instant to look after (and, for :class:`Every`, the anchor). Due times are
aware UTC datetimes. Local times follow R7: a time skipped by a clock change is due at the
first instant after the gap; a time that occurs twice is due once, at its first occurrence.

>>> rule = Daily("02:00", "Europe/Oslo")
>>> rule.next_after(datetime(2027, 3, 27, 12, tzinfo=timezone.utc))
datetime.datetime(2027, 3, 28, 1, 0, tzinfo=datetime.timezone.utc)

Zones are read from the ``tzdata`` package first, so due times do not depend on the host's
zone files.
"""

from __future__ import annotations

from celery_durable.core.rules._base import LiveSchedules
from celery_durable.core.rules._beat_entry import BeatEntry
from celery_durable.core.rules._calendar import Daily, Weekday, Weekly
from celery_durable.core.rules._cron import Cron, Crontab
from celery_durable.core.rules._interval import Every, Once
from celery_durable.core.rules._json import rule_from_json
from celery_durable.core.rules._solar import SOLAR_EVENTS, Solar

MONDAY, TUESDAY, WEDNESDAY, THURSDAY, FRIDAY, SATURDAY, SUNDAY = Weekday

Rule = Daily | Weekly | Every | Cron | Crontab | Solar | Once | BeatEntry
"""Any stored rule."""

__all__ = [
    "FRIDAY",
    "MONDAY",
    "SATURDAY",
    "SOLAR_EVENTS",
    "SUNDAY",
    "THURSDAY",
    "TUESDAY",
    "WEDNESDAY",
    "BeatEntry",
    "Cron",
    "Crontab",
    "Daily",
    "Every",
    "LiveSchedules",
    "Once",
    "Rule",
    "Solar",
    "Weekday",
    "Weekly",
    "rule_from_json",
]
