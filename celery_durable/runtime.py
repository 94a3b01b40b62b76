"""What the services need: the Celery app, the settings, the journal, the clock, the index.

A :class:`Runtime` is handed to the schedule API, the dispatcher, the worker side and the run
control instead of the :class:`~celery_durable.durable.Durable` facade, so none of them depends
on the facade or on each other. Constructing one opens no connection; the journal connects on
first use.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime, timezone
from functools import cached_property
from typing import Any

from celery import Celery

from celery_durable.beat_objects import BeatObjects
from celery_durable.config import ConfigError, DurableConfig
from celery_durable.core.ids import check_text
from celery_durable.errors import DurableError, InvalidSchedule, JournalError, UnknownTask
from celery_durable.store.journal.sql import EngineOptionsRefused, SqlJournal
from celery_durable.store.sql_store import SqlStore
from celery_durable.store.stores import (
    STORES,
    AnyIndex,
    AnyJournal,
    AnyRunTable,
    AnyStore,
)

Clock = Callable[[], datetime]

_BY_APP: weakref.WeakKeyDictionary[Celery, Runtime] = weakref.WeakKeyDictionary()
_BY_APP_LOCK = threading.Lock()


CRASH_VARIABLE = "CELERY_DURABLE_TEST_CRASH"
"""The environment variable crash tests set to a fault point's name (:func:`crash_at`)."""


def crash_at(point: str | None) -> Callable[[str], None]:
    """A fault hook that dies like ``kill -9`` at the fault point named ``point`` (none: never);
    ``name@n`` dies the ``n``-th time the process reaches it.

    The dispatcher, retention and the worker call the runtime's hook at named points
    (``after-decide``, ``prune-batch``, ``prune-runs``, ``after-child-start``: a parent's child
    starts are committed and not yet sent); end-to-end tests set :data:`CRASH_VARIABLE` in a
    child process to prove that a crash there loses nothing (A6, O1, W10).
    """
    name, _, nth = (point or "").partition("@")
    times = int(nth) if nth.isdigit() and int(nth) > 0 else 1
    reached = [0]

    def fault(at: str) -> None:
        if point and at == name:
            reached[0] += 1
            if reached[0] >= times:
                os.kill(os.getpid(), signal.SIGKILL)

    return fault


def system_clock() -> datetime:
    """The current time, aware and in UTC."""
    return datetime.now(timezone.utc)


class Runtime:
    """One Celery app bound to one journal: settings, journal, clock, index, task lookup.

    The first runtime made for an app is the one :meth:`for_app` returns, so that the worker's
    signal handlers and beat use the journal and clock the project configured.
    """

    def __init__(
        self,
        app: Celery,
        url: str | None = None,
        *,
        clock: Clock | None = None,
        store: AnyStore | None = None,
        fault: Callable[[str], None] | None = None,
    ) -> None:
        if not isinstance(app, Celery):
            raise TypeError(f"app must be a Celery app, not {type(app).__name__}")
        if clock is not None and not callable(clock):
            raise TypeError("clock must be a callable returning an aware UTC datetime")
        if store is not None and not isinstance(store, STORES):
            raise TypeError(
                f"store must be a SqlStore or a MemoryStore, not {type(store).__name__}"
            )
        if fault is not None and not callable(fault):
            raise TypeError("fault must be a callable taking a fault point's name")
        self.app = app
        self.url = url
        self.clock: Clock = clock or system_clock
        # A test clock may also sleep (by moving itself): the worker's short waits (a retry
        # back-off, a sleep of up to a second) then take no wall time (celery_durable.testing).
        self.sleep: Callable[[float], None] = getattr(clock, "sleep", None) or time.sleep
        self.fault: Callable[[str], None] = (
            fault if fault is not None else crash_at(os.environ.get(CRASH_VARIABLE))
        )
        """Called at the dispatcher's and retention's fault points with the point's name
        (``fault=``; by default :func:`crash_at` the point named by :data:`CRASH_VARIABLE`)."""
        self._given_store = store is not None
        if store is not None:
            self.__dict__["store"] = store
        self.step_hooks: list[Callable[[str, str, int | str, str], None]] = []
        """Called in the worker as ``hook(moment, run_id, position, name)``: ``"call"`` before a
        step's function runs, ``"stored"`` once its result is stored. A hook may raise
        :class:`~.worker.context.DeliveryKilled` (a simulated crash at that step boundary)."""
        with _BY_APP_LOCK:
            _BY_APP.setdefault(app, self)

    @classmethod
    def for_app(cls, app: Celery) -> Runtime:
        """The runtime made for ``app`` first, or a new one from its configuration."""
        with _BY_APP_LOCK:
            found = _BY_APP.get(app)
        return found if found is not None else cls(app)

    @classmethod
    def registered(cls, app: Celery) -> Runtime | None:
        """The runtime made for ``app`` first, or ``None`` (nothing is made)."""
        with _BY_APP_LOCK:
            return _BY_APP.get(app)

    @cached_property
    def config(self) -> DurableConfig:
        """Settings read once from ``app.conf``."""
        return DurableConfig.from_app(self.app.conf, self.url)

    @cached_property
    def store(self) -> AnyStore:
        """Where the services read and write (:mod:`celery_durable.core.unit_of_work`): the
        SQL store of the configured URL (connects on first use), or the one given."""
        config = self.config
        try:
            journal = SqlJournal(
                config.url,
                sqlite_synchronous=config.sqlite_synchronous,
                engine_options=config.engine_options,
            )
        except EngineOptionsRefused as exc:
            raise ConfigError(f"durable_engine_options: {exc}") from exc
        return SqlStore(journal)

    @property
    def journal(self) -> AnyJournal:
        """The store's journal."""
        return self.store.journal

    @property
    def sql_journal(self) -> SqlJournal:
        """The SQL journal, for what only SQL has (retention, partitions, the health facts);
        ``JournalError`` on a memory store."""
        journal = self.store.journal
        if not isinstance(journal, SqlJournal):
            raise JournalError(f"this needs a SQL journal; the runtime's store is {self.store!r}")
        return journal

    @cached_property
    def beat_objects(self) -> BeatObjects:
        """The schedule objects of the ``beat_schedule`` entries this process imported (B3)."""
        return BeatObjects()

    @cached_property
    def index(self) -> AnyIndex:
        """The schedule index projection's table access."""
        return self.store.schedule_index(self.beat_objects)

    @cached_property
    def runs(self) -> AnyRunTable:
        """The run table: stale runs and wake-ups (D8)."""
        return self.store.run_table()

    def now(self) -> datetime:
        """The current time from the clock, checked to be aware and converted to UTC."""
        moment = self.clock()
        if not isinstance(moment, datetime) or moment.utcoffset() is None:
            raise DurableError(f"clock returned {moment!r}; an aware datetime is required")
        return moment.astimezone(timezone.utc)

    # Tasks ---------------------------------------------------------------------------------

    def task_name(self, task: Any) -> str:
        """The name of a task given by name or as a task object."""
        if isinstance(task, str):
            return check_text(task, "task name")
        name = getattr(task, "name", None)
        if isinstance(name, str):
            return check_text(name, "task name")
        if task is None:
            raise InvalidSchedule("task is missing", field="task")
        raise InvalidSchedule(
            f"task must be a task name or a Celery task, not {type(task).__name__}"
        )

    def require_task(self, name: str) -> Any:
        """The registered task called ``name``; ``UnknownTask`` when the app has none (A7)."""
        task = self.app.tasks.get(name)
        if task is None:
            raise UnknownTask(
                f"task {name!r} is not registered in app {self.app.main!r}",
                task=name,
                rule="A7",
            )
        return task

    def is_durable(self, name: str) -> bool:
        """Whether the registered task ``name`` is a durable task."""
        return bool(getattr(self.app.tasks.get(name), "__durable__", False))

    def rebind(self, url: str | None, clock: Clock | None) -> Callable[[], None]:
        """Point this runtime at another journal and clock (a test harness on a project's
        app, whose tasks hold this runtime); returns the function that restores both."""
        saved = (self.url, self.clock, self.sleep)

        def use(url: str | None, clock: Clock | None, sleep: Callable[[float], None]) -> None:
            self.close()
            for name in ("config", "store", "index", "runs"):
                if name != "store" or not self._given_store:
                    self.__dict__.pop(name, None)
            self.url = url
            self.clock = clock or system_clock
            self.sleep = sleep

        use(url, clock, getattr(clock, "sleep", None) or time.sleep)
        return lambda: use(*saved)

    def close(self) -> None:
        """Release the journal's connections."""
        if "store" in self.__dict__:
            self.store.close()

    @property
    def opened(self) -> bool:
        """Whether the store was built (or given): only then is there a journal to name."""
        return "store" in self.__dict__
