"""A django-celery-beat database with rows of every kind, and the peer's own due times.

Run in a subprocess (Django's settings can be configured once per process):
``python -m tests.support.beat_rows DB_PATH BASE_ISO DAYS [bad | manage JOURNAL_URL |
generated SEED COUNT]``.
It creates django-celery-beat's tables with its own migrations in the SQLite file
``DB_PATH``, saves the rows through its models, then asks django-celery-beat's
``ModelEntry`` (only its clock replaced by a simulated one) when it would send each row over
``DAYS`` days from ``BASE``, and with which options. Prints JSON:
``{name: {"due": [iso…], "options": {…}}}``; with ``bad``, what the peer's beat does when it
sends each ``proj.report`` row (:func:`peer_sends`). With ``manage``, the project also has
celery_durable's Django integration and runs ``durable_import_beat`` (prints its outputs).
"""

from __future__ import annotations

import json
import shutil
import sys
from datetime import datetime, timedelta, timezone

NAMES_LONG = "Еженедельный отчёт о продажах по всем регионам и филиалам компании"


def database(where: str) -> dict[str, object]:
    """Django's DATABASES entry of a SQLite path or a PostgreSQL/MySQL SQLAlchemy URL."""
    if "://" not in where:
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": where}
    from sqlalchemy.engine import make_url

    url = make_url(where)
    found: dict[str, object] = {
        "NAME": url.database,
        "USER": url.username or "",
        "PASSWORD": url.password or "",
        "HOST": url.host or "",
        "PORT": str(url.port or ""),
    }
    if url.get_backend_name() == "postgresql":
        options = url.query.get("options")
        found.update(ENGINE="django.db.backends.postgresql")
        if options:
            found["OPTIONS"] = {"options": options}
    else:
        import pymysql

        pymysql.install_as_MySQLdb()  # Django's MySQL backend on the test extra's driver
        found.update(ENGINE="django.db.backends.mysql", OPTIONS={"charset": "utf8mb4"})
    return found


def setup(db_path: str, journal: str | None = None) -> None:
    """Django with django-celery-beat (and, given a journal, celery_durable's integration)."""
    import django
    from django.conf import settings

    apps = ["django_celery_beat"]
    extra: dict[str, object] = {}
    if journal is not None:
        apps += [
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "celery_durable.contrib.django",
        ]
        extra = {"CELERY_DURABLE_APP": "tests.support.beat_rows:app", "CELERY_DURABLE_URL": journal}
    settings.configure(
        INSTALLED_APPS=apps,
        DATABASES={"default": database(db_path)},
        USE_TZ=True,
        TIME_ZONE="Europe/Oslo",
        CELERY_TIMEZONE="Europe/Oslo",
        **extra,
    )
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def _project_app() -> object:
    from celery import Celery

    project = Celery("beat_rows", broker="memory://", set_as_current=False)
    project.conf.timezone = "Europe/Oslo"

    @project.task(name="proj.work", shared=False)
    def work(*args: object, **kwargs: object) -> None:  # pragma: no cover - not run
        return None

    @project.task(name="proj.report", shared=False)
    def report(customer: object) -> None:  # pragma: no cover - not run
        return None

    return project


app = _project_app()
"""The project's Celery app (``CELERY_DURABLE_APP``) when run with a journal."""


def manage(db_path: str, base: datetime, journal: str) -> None:
    """``manage.py durable_import_beat`` in the project: a dry run, an import, and again."""
    import io

    from django.core.management import call_command

    setup(db_path, journal)
    make_rows(base, bad=False)
    outputs = []
    for args in (["--dry-run", "--json"], ["--json"], []):
        out = io.StringIO()
        call_command("durable_import_beat", *args, stdout=out)
        outputs.append(out.getvalue())
    print(json.dumps(outputs))


def make_rows(base: datetime, bad: bool) -> None:
    from django_celery_beat.models import (
        ClockedSchedule,
        CrontabSchedule,
        IntervalSchedule,
        PeriodicTask,
        SolarSchedule,
    )

    def every(n: int, period: str) -> IntervalSchedule:
        return IntervalSchedule.objects.get_or_create(every=n, period=period)[0]

    def cron(expr: str, zone: str) -> CrontabSchedule:
        minute, hour, dom, month, dow = expr.split()
        return CrontabSchedule.objects.create(
            minute=minute,
            hour=hour,
            day_of_month=dom,
            month_of_year=month,
            day_of_week=dow,
            timezone=zone,
        )

    rows = [
        dict(
            name="every-5-min",
            interval=every(5, "minutes"),
            args='[1, "x", {"__type__": "datetime", "__value__": "2026-01-02T03:04:05"}]',
            kwargs='{"a": 1}',
            queue="reports",
            headers='{"h": "v"}',
            last_run_at=base - timedelta(minutes=2),
        ),
        dict(name="cron-both-days", crontab=cron("0 9 1-7 * mon", "Europe/Oslo")),
        dict(
            name="clocked",
            clocked=ClockedSchedule.objects.create(clocked_time=base + timedelta(days=1)),
            one_off=True,
        ),
        dict(
            name="solar",
            solar=SolarSchedule.objects.create(event="sunrise", latitude=59.91, longitude=10.75),
        ),
        dict(
            name="solar-later",
            solar=SolarSchedule.objects.create(event="sunset", latitude=59.91, longitude=10.75),
            start_time=base + timedelta(days=2, hours=1),
        ),
        dict(name="one-off-interval", interval=every(5, "minutes"), one_off=True),
        dict(name="disabled", interval=every(1, "hours"), enabled=False),
        dict(
            name="starts-later",
            interval=every(1, "hours"),
            start_time=base + timedelta(hours=3, minutes=10),
        ),
        dict(
            name="cron-starts-later",
            crontab=cron("30 8 * * *", "America/New_York"),
            start_time=base + timedelta(days=1),
        ),
        dict(
            name="expires",
            crontab=cron("*/15 * * * *", "UTC"),
            expires=base + timedelta(hours=5),
        ),
        dict(name="expire-seconds", interval=every(10, "minutes"), expire_seconds=30),
        dict(
            name="routing",
            interval=every(10, "minutes"),
            exchange="ex",
            routing_key="rk",
            priority=9,
            last_run_at=base - timedelta(seconds=20),
        ),
        dict(name=NAMES_LONG, interval=every(2, "hours"), description="the weekly sales report"),
    ]
    if bad:
        rows += [
            dict(name="half-second", interval=every(500000, "microseconds")),
            dict(name="bad-cron", crontab=cron("61 * * * *", "UTC")),
            # def report(customer): four args can never call it (the peer fails each send)
            dict(name="bad-args", task="proj.report", interval=every(1, "hours"), args="[1,2,3,4]"),
        ]
    for row in rows:
        last = row.pop("last_run_at", None)
        task = PeriodicTask.objects.create(**{"task": "proj.work", **row})
        # date_changed is set on save (auto_now): the rows were last changed an hour ago.
        PeriodicTask.objects.filter(pk=task.pk).update(
            last_run_at=last, date_changed=base - timedelta(hours=1)
        )


def generated_rows(base: datetime, seed: int, count: int) -> None:
    """``count`` random interval and crontab rows: last runs, start times, one-offs, expiry."""
    import random

    from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

    pick = random.Random(seed)

    def moment(low_minutes: int, high_minutes: int) -> datetime:
        return base + timedelta(minutes=pick.randint(low_minutes, high_minutes))

    for number in range(count):
        row: dict[str, object] = {"name": f"generated-{number}", "task": "proj.work"}
        if pick.random() < 0.6:
            period = pick.choice(["seconds", "minutes", "hours"])
            every = {"seconds": pick.randint(30, 600), "minutes": pick.randint(1, 90)}.get(
                period, pick.randint(1, 5)
            )
            row["interval"] = IntervalSchedule.objects.get_or_create(every=every, period=period)[0]
        else:
            minute, hour, dom, dow = (
                pick.choice(["0", "*/15", "7,37", "*/5"]),
                pick.choice(["*", "9", "0-6", "22-2"]),
                pick.choice(["*", "1-7", "3"]),
                pick.choice(["*", "mon", "fri-sun", "1-5"]),
            )
            row["crontab"] = CrontabSchedule.objects.create(
                minute=minute,
                hour=hour,
                day_of_month=dom,
                day_of_week=dow,
                month_of_year="*",
                timezone=pick.choice(["UTC", "Europe/Oslo", "Asia/Tokyo", "America/New_York"]),
            )
        if pick.random() < 0.4:
            row["start_time"] = moment(-600, 2 * 24 * 60)
        if pick.random() < 0.15:
            row["one_off"] = True
        if pick.random() < 0.15:
            row["expires"] = moment(60, 3 * 24 * 60)
        task = PeriodicTask.objects.create(**row)
        last = moment(-300, 0) if pick.random() < 0.6 else None
        PeriodicTask.objects.filter(pk=task.pk).update(
            last_run_at=last, date_changed=moment(-3000, -1)
        )


def oracle(base: datetime, days: float) -> dict[str, object]:
    """When django-celery-beat's own ``ModelEntry`` sends each row, on a simulated clock."""
    from celery import Celery
    from django_celery_beat import models, schedulers, tzcrontab
    from django_celery_beat.models import PeriodicTask
    from django_celery_beat.schedulers import ModelEntry

    clock = {"now": base}
    app = Celery("oracle", set_as_current=True)
    app.conf.timezone = "Europe/Oslo"
    app.now = lambda: clock["now"]
    models.now = lambda: clock["now"]
    tzcrontab.TzAwareCrontab.nowfunc = lambda self: clock["now"].astimezone(self.tz)
    schedulers.ModelEntry._default_now = lambda self: clock["now"].astimezone(app.timezone)
    end = base + timedelta(days=days)
    found: dict[str, object] = {}
    for model in PeriodicTask.objects.order_by("name"):
        clock["now"] = base
        entry = ModelEntry(model, app=app)
        if entry.schedule is not None and hasattr(entry.schedule, "nowfun"):
            entry.schedule.nowfun = lambda: clock["now"]
        options = {k: v for k, v in entry.options.items()}
        due = []
        while clock["now"] < end:
            is_due, wait = entry.is_due()
            if is_due:
                due.append(clock["now"].astimezone(timezone.utc).isoformat())
                entry = next(entry)
                if hasattr(entry.schedule, "nowfun"):
                    entry.schedule.nowfun = lambda: clock["now"]
                is_due, wait = entry.is_due()
            if wait >= 10**7:
                break
            clock["now"] += timedelta(seconds=max(float(wait), 0.001))
        found[model.name] = {
            "due": due,
            "options": json.loads(json.dumps(options, default=str)),
            "args": entry.args,
            "kwargs": entry.kwargs,
        }
    return found


def peer_sends() -> dict[str, str]:
    """What django-celery-beat's beat does when each row is due: Celery's own
    ``Scheduler.apply_async`` with the peer's ``ModelEntry`` ("sent", or the error it logs)."""
    from celery.beat import Scheduler
    from django_celery_beat.models import PeriodicTask
    from django_celery_beat.schedulers import ModelEntry

    project = _project_app()
    beat = Scheduler(project, lazy=True)
    found: dict[str, str] = {}
    for model in PeriodicTask.objects.filter(task="proj.report"):
        try:
            beat.apply_async(ModelEntry(model, app=project), advance=False)
            found[model.name] = "sent"
        except Exception as exc:
            found[model.name] = f"{type(exc).__name__}: {exc}"
    return found


def main() -> None:
    db_path, base_text, days = sys.argv[1], sys.argv[2], float(sys.argv[3])
    bad = len(sys.argv) > 4 and sys.argv[4] == "bad"
    base = datetime.fromisoformat(base_text)
    if len(sys.argv) > 5 and sys.argv[4] == "manage":
        manage(db_path, base, sys.argv[5])
        return
    if len(sys.argv) > 6 and sys.argv[4] == "generated":
        setup(db_path)
        generated_rows(base, int(sys.argv[5]), int(sys.argv[6]))
        shutil.copy(db_path, db_path + ".rows")
        print(json.dumps(oracle(base, days), default=str))
        return
    setup(db_path)
    make_rows(base, bad)
    # The oracle's ModelEntry writes to its rows (it disables expired and one-off ones): the
    # import reads the rows as they were saved, in a copy.
    if "://" not in db_path:
        shutil.copy(db_path, db_path + ".rows")
    if bad:
        print(json.dumps(peer_sends()))
        return
    print(json.dumps(oracle(base, days), default=str))


if __name__ == "__main__":
    main()
