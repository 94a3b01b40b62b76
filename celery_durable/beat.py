"""``DurableScheduler``: the dispatcher behind ``celery beat`` (SPEC D1).

``celery -A proj beat -S celery_durable.beat:DurableScheduler`` (or ``-S durable``). Beat builds
the scheduler once with ``lazy=True`` only to print its banner, so nothing here connects until
:meth:`setup_schedule`; beat calls ``sync``/``close`` twice on shutdown, so both are idempotent.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Protocol

from celery import Celery
from celery.beat import Scheduler
from celery.schedules import crontab, schedule, solar

from celery_durable.config import DurableConfig
from celery_durable.core.policies import POLICY_FIELDS, CatchUp
from celery_durable.core.rules import Cron, Every, Rule
from celery_durable.dispatch.dispatcher import Dispatcher
from celery_durable.errors import DurableError, InvalidSchedule
from celery_durable.message import SCHEDULE_OPTIONS
from celery_durable.runtime import Runtime
from celery_durable.schedules import Schedules
from celery_durable.store.journal.urls import redact

log = logging.getLogger("celery_durable.beat")


def rule_of(entry_schedule: Any, app: Celery, name: str) -> Rule:
    """The durable rule of a ``beat_schedule`` entry's ``schedule`` value."""
    if isinstance(entry_schedule, solar):
        raise InvalidSchedule(
            f"beat_schedule entry {name!r}: solar schedules are not supported by the durable "
            "scheduler; use a Cron or Daily rule instead",
            schedule_id=name,
        )
    if isinstance(entry_schedule, crontab):
        fields = (
            entry_schedule._orig_minute,
            entry_schedule._orig_hour,
            entry_schedule._orig_day_of_month,
            entry_schedule._orig_month_of_year,
            entry_schedule._orig_day_of_week,
        )
        tz = entry_schedule.__dict__.get("tz") or app.timezone
        return Cron(" ".join(str(f) for f in fields), zone=getattr(tz, "key", str(tz)))
    if isinstance(entry_schedule, schedule):
        return Every(entry_schedule.run_every)
    if isinstance(entry_schedule, timedelta):
        return Every(entry_schedule)
    if isinstance(entry_schedule, (int, float)) and not isinstance(entry_schedule, bool):
        return Every(timedelta(seconds=entry_schedule))
    raise InvalidSchedule(
        f"beat_schedule entry {name!r}: unsupported schedule {type(entry_schedule).__name__}",
        schedule_id=name,
    )


class _HasSchedules(Protocol):
    """What :func:`import_beat_schedule` needs of a ``Durable``."""

    @property
    def runtime(self) -> Runtime: ...
    @property
    def schedules(self) -> Schedules: ...


def import_beat_schedule(
    durable: _HasSchedules, entries: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Create (or bring up to date) one durable schedule per ``beat_schedule`` entry.

    ``durable`` is the project's ``Durable``. See :func:`import_entries`.
    """
    return import_entries(durable.runtime, durable.schedules, entries)


def import_entries(
    runtime: Runtime, schedules: Schedules, entries: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Create (or bring up to date) one durable schedule per ``beat_schedule`` entry.

    The entry's name is the schedule ID. A schedule that exists takes the entry's content
    (a change that stores nothing when equal); a deleted one is left deleted, with a warning.
    Every entry is checked before any is stored, so a bad one fails start-up with nothing stored.
    Returns the IDs imported.
    """
    planned = []
    for name, entry in entries.items():
        task = entry.get("task")
        rule = rule_of(entry.get("schedule"), runtime.app, name)
        options = dict(entry.get("options") or {})
        catch_up = CatchUp.parse(options.pop("catch_up", CatchUp.LATEST))
        overlap = options.pop("overlap", "allow")
        ignored = sorted(set(options) - SCHEDULE_OPTIONS - set(POLICY_FIELDS))  # P1–P3 go through
        for key in ignored:
            log.warning("beat_schedule entry %r: option %r is not carried over", name, key)
            options.pop(key)
        args = list(entry.get("args") or ())
        kwargs = dict(entry.get("kwargs") or {})
        if runtime.is_durable(str(task)):
            input_ = entry.get("input", args[0] if len(args) == 1 else (kwargs or None))
        else:
            input_ = None
            if args:
                options["args"] = args
            if kwargs:
                options["kwargs"] = kwargs
        content = (task, input_, rule, catch_up, overlap, options)
        schedules.check(name, task, input_, rule, catch_up, dict(options, overlap=overlap))
        planned.append((name, content))
    for name, (task, input_, rule, catch_up, overlap, options) in planned:
        view = schedules.state(name)
        if view is None:
            schedules.create(name, task, input_, rule, catch_up, overlap=overlap, **options)
        elif view.deleted:
            log.warning("beat_schedule entry %r names a deleted schedule; it stays deleted", name)
        else:
            schedules.change(name, task, input_, rule, catch_up, overlap=overlap, **options)
    return [name for name, _ in planned]


class DurableScheduler(Scheduler):
    """A ``celery.beat.Scheduler`` whose schedule lives in the durable journal."""

    #: Beat may not sleep longer than this; the dispatcher asks for less anyway.
    max_interval = 5

    def __init__(self, app: Celery, *args: Any, **kwargs: Any) -> None:
        self._runtime: Runtime | None = None
        self._dispatcher: Dispatcher | None = None
        self._closed = False
        self._failing_since: float | None = None
        super().__init__(app, *args, **kwargs)

    def setup_schedule(self) -> None:
        """Import ``beat_schedule`` (and Celery's default entries) and prepare the dispatcher."""
        self._runtime = runtime = Runtime.for_app(self.app)
        entries: dict[str, Any] = {}
        self.install_default_entries(entries)
        entries.update(self.app.conf.beat_schedule or {})
        for name, entry in list(entries.items()):
            if not isinstance(entry, Mapping):  # install_default_entries gives Entry objects
                entries[name] = {
                    "task": entry.task,
                    "schedule": entry.schedule,
                    "args": entry.args,
                    "kwargs": entry.kwargs,
                    "options": entry.options,
                }
        imported = import_entries(runtime, Schedules(runtime), entries)
        if imported:
            log.info("durable scheduler: %d beat_schedule entries imported", len(imported))
        self._dispatcher = Dispatcher(runtime)
        self.data: dict[str, Any] = {}

    @property
    def schedule(self) -> dict[str, Any]:
        return self.data

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One dispatcher tick; a journal outage is logged once and retried (beat keeps running)."""
        import time

        if self._dispatcher is None:
            self.setup_schedule()
        dispatcher = self._dispatcher
        if dispatcher is None:  # setup_schedule sets it or raises
            raise DurableError("the durable scheduler is not set up")
        try:
            wait = float(dispatcher.tick())
        except DurableError:
            raise
        except Exception as exc:
            now = time.monotonic()
            if self._failing_since is None:
                self._failing_since = now
                log.error(
                    "durable scheduler: journal unavailable (%s: %s); retrying",
                    type(exc).__name__,
                    exc,
                )
            dispatcher.invalidate()
            return min(self._runtime.config.check_interval if self._runtime else 5.0, 5.0)
        if self._failing_since is not None:
            log.warning("durable scheduler: journal reachable again")
            self._failing_since = None
        return wait

    def sync(self) -> None:
        """Nothing to flush: every decision is stored when it is made."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._dispatcher is not None:
            self._dispatcher.close()
        if self._runtime is not None:
            self._runtime.close()
        super().close()

    @property
    def info(self) -> str:
        url = (
            self._runtime.config.url if self._runtime else DurableConfig.from_app(self.app.conf).url
        )
        return f"    . journal -> {redact(url)}"
