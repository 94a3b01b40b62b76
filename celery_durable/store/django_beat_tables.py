"""django-celery-beat's own tables, read by database URL with SQLAlchemy Core and no Django.

The importer (:mod:`celery_durable.importers.django_beat`) turns the rows into entries; this
module only knows the tables: ``django_celery_beat_periodictask`` joined with the interval,
crontab, solar and clocked schedule it points at. The tables are reflected, not declared: they
are the peer's, in whatever version of its schema the project runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import MetaData, Table, create_engine, select

__all__ = ["periodic_task_rows"]

_PREFIX = "django_celery_beat_"
_TABLES = (
    "periodictask",
    "intervalschedule",
    "crontabschedule",
    "solarschedule",
    "clockedschedule",
)


def periodic_task_rows(
    url: str, *, columns: Sequence[str], cron_fields: Sequence[str]
) -> list[dict[str, Any]]:
    """Every periodic task of the database at ``url``, ordered by name, as a dict.

    A row holds the task's ``columns``, and its schedule's values under the names Django's ORM
    path uses too: ``interval_every``/``interval_period``, ``crontab_<field>`` for each of
    ``cron_fields`` and ``crontab_timezone``, ``solar_event``/``solar_latitude``/
    ``solar_longitude``, ``clocked_time`` (``None`` where the task has no such schedule).
    Times come as the driver reads them (naive on SQLite and MySQL). The engine is disposed of
    before returning.
    """
    engine = create_engine(url)
    try:
        meta = MetaData()
        with engine.connect() as conn:
            task, interval, cron, sun, clocked = (
                Table(_PREFIX + name, meta, autoload_with=conn) for name in _TABLES
            )
            joined = (
                task.outerjoin(interval, task.c.interval_id == interval.c.id)
                .outerjoin(cron, task.c.crontab_id == cron.c.id)
                .outerjoin(sun, task.c.solar_id == sun.c.id)
                .outerjoin(clocked, task.c.clocked_id == clocked.c.id)
            )
            query = (
                select(
                    *(task.c[k] for k in columns),
                    interval.c.every.label("interval_every"),
                    interval.c.period.label("interval_period"),
                    *(cron.c[k].label(f"crontab_{k}") for k in (*cron_fields, "timezone")),
                    sun.c.event.label("solar_event"),
                    sun.c.latitude.label("solar_latitude"),
                    sun.c.longitude.label("solar_longitude"),
                    clocked.c.clocked_time.label("clocked_time"),
                )
                .select_from(joined)
                .order_by(task.c.name)
            )
            return [dict(r._mapping) for r in conn.execute(query)]
    finally:
        engine.dispose()
