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

from celery_durable.blackouts import import_setting
from celery_durable.config import ConfigError, journal_url, url_setting
from celery_durable.core.ids import printable
from celery_durable.dispatch.dispatcher import Dispatcher
from celery_durable.errors import DurableError, JournalError, JournalFailed, JournalUnavailable
from celery_durable.importers.beat_schedule import (
    default_entries,
    import_beat_schedule,
    import_entries,
    summary,
)
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
        """Import ``beat_schedule`` (and Celery's default entries) and prepare the dispatcher.

        A journal that cannot be reached at start-up is not fatal: beat logs it once and
        :meth:`tick` tries again until it is back (as for an outage while running).
        """
        self._runtime = Runtime.for_app(self.app)
        self.data: dict[str, Any] = {}
        self._check_settings(self._runtime)
        try:
            self._setup()
        except JournalUnavailable as exc:  # the store says so; beat logs it, tries again
            self._journal_down(exc, " at start-up")

    def _check_settings(self, runtime: Runtime) -> None:
        """Stop beat (exit 1) with one ERROR line when a setting cannot open any journal.

        A malformed or unsupported URL, a missing driver or a refused ``durable_*`` value will
        not heal by waiting, unlike an unreachable server: retrying it would hide the mistake,
        and letting it escape would print beat's traceback. Building the journal checks the
        URL and the engine options; it connects to nothing.
        """
        try:
            runtime.config  # noqa: B018 - read for its checks (durable_blackouts too, P4)
            runtime.journal  # noqa: B018 - built for its checks
        except JournalUnavailable:
            raise
        except ConfigError as exc:
            self._refuse(str(exc))
        except JournalError as exc:
            conf, given = self.app.conf, runtime.url
            url = redact(journal_url(conf, given))
            self._refuse(f"{url_setting(conf, given)}: {exc} (journal URL {url})")

    @staticmethod
    def _refuse(reason: str) -> None:
        log.error("durable scheduler cannot start: %s", printable(reason))
        raise SystemExit(1)

    def _setup(self) -> None:
        if self._runtime is None:
            self._runtime = Runtime.for_app(self.app)
        runtime = self._runtime
        entries = default_entries(self)  # as stock beat: celery.backend_cleanup (B7)
        entries.update(self.app.conf.beat_schedule or {})
        report = import_entries(runtime, Schedules(runtime), entries)
        import_setting(runtime)  # durable_blackouts, when set, replaces the journal's (P4)
        line = summary(report)  # only when the import stored something
        if line is not None:
            log.info("%s", line)
        self._dispatcher = Dispatcher(runtime)

    @property
    def schedule(self) -> dict[str, Any]:
        return self.data

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One dispatcher tick; a journal outage is logged once and retried (beat keeps running)."""
        if self._dispatcher is None:
            try:
                self._setup()
            except JournalUnavailable as exc:  # the store says so; beat logs it, tries again
                return self._journal_down(exc, " at start-up")
        dispatcher = self._dispatcher
        if dispatcher is None:  # _setup sets it or raises
            raise DurableError("the durable scheduler is not set up")
        try:
            wait = float(dispatcher.tick())
        except (JournalUnavailable, JournalFailed) as exc:  # the store's word for the database
            return self._journal_down(exc)
        except DurableError:
            raise
        except Exception as exc:
            return self._journal_down(exc)
        if self._failing_since is not None:
            log.warning("durable scheduler: journal reachable again")
            self._failing_since = None
        return wait

    def _journal_down(self, exc: BaseException, when: str = "") -> float:
        """Log the outage once (its first failure) and return how long to wait before retrying."""
        import time

        retry = min(self._runtime.config.check_interval if self._runtime else 5.0, 5.0)
        retry = min(retry, float(self.max_interval or retry))
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            log.error(
                "durable scheduler: journal unavailable%s (%s: %s); retrying every %g s",
                when, type(exc).__name__, exc, retry,
            )  # fmt: skip
        if self._dispatcher is not None:
            self._dispatcher.invalidate()
        return retry

    def sync(self) -> None:
        """Nothing to flush: every decision is stored when it is made."""

    def close(self) -> None:
        """Write the lagging index rows, give up the leases, close the journal; once.

        ``celery beat``'s SIGTERM handler calls this in the middle of whatever the main
        thread was doing, and again once ``SystemExit`` has unwound it. When the handler
        interrupted a journal transaction, the first call does nothing: giving the leases up
        would wait for that transaction's locks, so the second call does it.
        """
        if self._closed:
            return
        if self._dispatcher is not None and self._dispatcher.runtime.journal.in_transaction():
            log.info("durable scheduler: closing once the interrupted journal write unwinds")
            return
        self._closed = True
        if self._dispatcher is not None:
            self._dispatcher.close()
        if self._runtime is not None:
            self._runtime.close()
        super().close()

    @property
    def info(self) -> str:
        """Beat's banner line: the journal this scheduler uses, password hidden.

        The lazy banner instance has no runtime yet; it names the one the app module made
        (``Durable(app, url)``), which :meth:`setup_schedule` will use, else the configuration.
        Only the URL is read: a bad setting is reported by :meth:`setup_schedule`, once
        logging is set up, not as a traceback in the middle of the banner.
        """
        runtime = self._runtime or Runtime.registered(self.app)
        url = journal_url(self.app.conf, runtime.url if runtime else None)
        return f"    . journal -> {printable(redact(url))}"
