"""``DurableScheduler``: the dispatcher behind ``celery beat`` (SPEC D1).

``celery -A proj beat -S celery_durable.beat:DurableScheduler`` (or ``-S durable``). Beat builds
the scheduler once with ``lazy=True`` only to print its banner, so nothing here connects until
:meth:`setup_schedule`; beat calls ``sync``/``close`` twice on shutdown, so both are idempotent.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.beat import Scheduler

from celery_durable.beat_import import default_entries, import_beat_schedule, import_entries
from celery_durable.config import DurableConfig
from celery_durable.dispatch.dispatcher import Dispatcher
from celery_durable.errors import DurableError
from celery_durable.runtime import Runtime
from celery_durable.schedules import Schedules
from celery_durable.store.journal.urls import redact

log = logging.getLogger("celery_durable.beat")

__all__ = ["DurableScheduler", "import_beat_schedule"]


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
        entries = default_entries(self)  # as stock beat: celery.backend_cleanup (B7)
        entries.update(self.app.conf.beat_schedule or {})
        report = import_entries(runtime, Schedules(runtime), entries)
        if report.imported:
            log.info("durable scheduler: %d beat_schedule entries imported", len(report.imported))
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
