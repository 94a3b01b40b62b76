"""django-celery-beat's ``PeriodicTask`` rows as importer entries (SPEC I1).

Rows are read through Django's ORM inside the project (:func:`rows_from_orm`), or by database
URL with SQLAlchemy Core and no Django (:func:`rows_from_url`: SQLite, PostgreSQL,
MySQL/MariaDB; the SQL is :mod:`celery_durable.store.django_beat_tables`). Both give the same
column values to :func:`entry_of`, which builds what django-celery-beat's ``ModelEntry`` would
hold: the schedule object (a Celery ``crontab`` with the row's time zone, as its
``TzAwareCrontab``), the args and kwargs decoded by kombu, and the options it sends (``queue``,
``exchange``, ``routing_key``, ``priority``, ``expires``, the headers with
``periodic_task_name``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

from celery.schedules import crontab, schedule, solar

from celery_durable.errors import InvalidSchedule
from celery_durable.importers.entries import SourceEntry

SOURCE = "django-celery-beat"

PERIODS = ("days", "hours", "minutes", "seconds", "microseconds")

COLUMNS = (
    "name",
    "task",
    "args",
    "kwargs",
    "queue",
    "exchange",
    "routing_key",
    "headers",
    "priority",
    "expires",
    "expire_seconds",
    "one_off",
    "start_time",
    "enabled",
    "last_run_at",
    "total_run_count",
    "date_changed",
    "description",
)
"""The ``PeriodicTask`` columns an import reads (besides the schedule's)."""


def _utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def _json(text: Any, what: str) -> Any:
    from kombu.utils.json import loads

    try:
        return loads(text) if text else None
    except ValueError as exc:
        raise InvalidSchedule(f"{what} is not valid JSON: {exc}") from None


def schedule_of(row: Mapping[str, Any]) -> Any:
    """The Celery schedule object of a row, as django-celery-beat builds it."""
    if row.get("interval_every") is not None:
        period = str(row["interval_period"])
        if period not in PERIODS:
            raise InvalidSchedule(f"unknown interval period {period!r}")
        return schedule(timedelta(**{period: row["interval_every"]}))
    if row.get("crontab_minute") is not None:
        cron = crontab(
            minute=row["crontab_minute"],
            hour=row["crontab_hour"],
            day_of_week=row["crontab_day_of_week"],
            day_of_month=row["crontab_day_of_month"],
            month_of_year=row["crontab_month_of_year"],
        )
        zone = row.get("crontab_timezone")
        if zone is not None and row.get("tz_aware", True):
            cron.tz = zone if not isinstance(zone, str) else ZoneInfo(zone)
        return cron
    if row.get("solar_event") is not None:
        sun = solar.__new__(solar)  # its __init__ imports ephem: only the fields are needed
        sun.event, sun.lat, sun.lon = (
            row["solar_event"],
            float(row["solar_latitude"]),
            float(row["solar_longitude"]),
        )
        return sun
    if row.get("clocked_time") is not None:
        return _utc(row["clocked_time"])
    raise InvalidSchedule("the row has no interval, crontab, solar or clocked schedule")


def entry_of(row: Mapping[str, Any]) -> SourceEntry:
    """What django-celery-beat's ``ModelEntry`` holds for a row, as an importer entry."""
    name = str(row["name"])
    where = f"row {name!r}"
    options: dict[str, Any] = {
        k: row[k]
        for k in ("queue", "exchange", "routing_key", "priority")
        if row.get(k) is not None
    }
    # ``ModelEntry``: expires or expire_seconds, when set, is the message's expiry.
    expires = _utc(row.get("expires")) or row.get("expire_seconds")
    if expires:
        options["expires"] = expires
    headers = _json(row.get("headers"), f"{where}: headers") or {}
    if not isinstance(headers, dict):
        raise InvalidSchedule(f"{where}: headers must be a JSON object")
    headers["periodic_task_name"] = name
    options["headers"] = headers
    args = _json(row.get("args"), f"{where}: args") or []
    kwargs = _json(row.get("kwargs"), f"{where}: kwargs") or {}
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise InvalidSchedule(f"{where}: args must be a JSON list and kwargs a JSON object")
    last = _utc(row.get("last_run_at"))
    return SourceEntry(
        name=name,
        task=str(row["task"]),
        schedule=schedule_of(row),
        args=args,
        kwargs=kwargs,
        options=options,
        enabled=bool(row["enabled"]),
        disabled_reason=f"disabled in {SOURCE}",
        since=last if last is not None else _utc(row.get("date_changed")),
        never_ran=last is None,
        start_time=_utc(row.get("start_time")),
        end_at=_utc(row.get("expires")),
        one_off=bool(row.get("one_off")),
        ran=int(row.get("total_run_count") or 0) > 0,
        description=str(row.get("description") or ""),
    )


def rows_from_orm() -> list[dict[str, Any]]:
    """The rows through Django's ORM (inside the project: ``manage.py durable_import_beat``)."""
    from django.conf import settings
    from django_celery_beat.models import PeriodicTask

    aware = getattr(settings, "DJANGO_CELERY_BEAT_TZ_AWARE", True)
    rows = []
    query = PeriodicTask.objects.select_related("interval", "crontab", "solar", "clocked")
    for task in query.order_by("name"):
        row = {k: getattr(task, k) for k in COLUMNS}
        if task.interval is not None:
            row.update(interval_every=task.interval.every, interval_period=task.interval.period)
        if task.crontab is not None:
            c = task.crontab
            row.update({f"crontab_{k}": getattr(c, k) for k in (*CRON_FIELDS, "timezone")})
            row["tz_aware"] = aware
        if task.solar is not None:
            row.update(
                solar_event=task.solar.event,
                solar_latitude=task.solar.latitude,
                solar_longitude=task.solar.longitude,
            )
        if task.clocked is not None:
            row.update(clocked_time=task.clocked.clocked_time)
        rows.append(row)
    return rows


CRON_FIELDS = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")


def rows_from_url(url: str) -> list[dict[str, Any]]:
    """The rows by database URL, with SQLAlchemy Core and no Django
    (:func:`~celery_durable.store.django_beat_tables.periodic_task_rows`).

    Naive times are read as UTC, as Django stores them with ``USE_TZ = True`` (its default).
    """
    from celery_durable.store.django_beat_tables import periodic_task_rows

    return periodic_task_rows(url, columns=COLUMNS, cron_fields=CRON_FIELDS)


def entries(rows: list[dict[str, Any]]) -> tuple[list[SourceEntry], dict[str, str]]:
    """The entries of the rows, and the rows refused on reading (name → reason)."""
    found, bad = [], {}
    for row in rows:
        try:
            found.append(entry_of(row))
        except (InvalidSchedule, ValueError, TypeError, KeyError) as exc:
            bad[str(row.get("name"))] = str(exc)
    return found, bad


__all__ = ["SOURCE", "entries", "entry_of", "rows_from_orm", "rows_from_url", "schedule_of"]
