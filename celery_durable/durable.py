"""``Durable``: the entry point binding a Celery app to a journal (SPEC §8)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from datetime import datetime, timezone
from functools import cached_property
from typing import TYPE_CHECKING, Any

from celery import Celery

from celery_durable import ends
from celery_durable.config import DurableConfig
from celery_durable.errors import DurableError, InvalidSchedule, UnknownTask
from celery_durable.ids import check_text
from celery_durable.index import ScheduleIndex
from celery_durable.journal import SqlJournal
from celery_durable.schedules import Schedules, ScheduleStore

if TYPE_CHECKING:
    from celery_durable.dispatcher import Dispatcher

Clock = Callable[[], datetime]

_BY_APP: weakref.WeakKeyDictionary[Celery, Durable] = weakref.WeakKeyDictionary()
_BY_APP_LOCK = threading.Lock()


def _system_clock() -> datetime:
    return datetime.now(timezone.utc)


class Durable:
    """Durable schedules and tasks for one Celery app, stored in one SQL journal.

    ``url`` falls back to ``app.conf.durable_url``, then ``CELERY_DURABLE_URL``, then
    ``sqlite:///celery_durable.db``. Construction opens no connection. ``clock`` (a callable
    returning an aware UTC datetime) replaces the system clock in tests.

    >>> app = Celery("proj", broker="redis://localhost")
    >>> durable = Durable(app)
    >>> durable.schedules.create("nightly", "proj.backup", "/srv", Daily("02:00", "Europe/Oslo"))
    """

    def __init__(self, app: Celery, url: str | None = None, *, clock: Clock | None = None) -> None:
        if not isinstance(app, Celery):
            raise TypeError(f"app must be a Celery app, not {type(app).__name__}")
        if clock is not None and not callable(clock):
            raise TypeError("clock must be a callable returning an aware UTC datetime")
        self.app = app
        self._url = url
        self._clock: Clock = clock or _system_clock
        self.schedules = Schedules(self)
        self._store = ScheduleStore(self)
        with _BY_APP_LOCK:
            _BY_APP.setdefault(app, self)
        ends.install()

    @classmethod
    def for_app(cls, app: Celery) -> Durable:
        """The ``Durable`` made for ``app`` first, or a new one from its configuration."""
        with _BY_APP_LOCK:
            found = _BY_APP.get(app)
        return found if found is not None else cls(app)

    @classmethod
    def registered(cls, app: Celery) -> Durable | None:
        """The ``Durable`` made for ``app`` first, or ``None`` (nothing is made)."""
        with _BY_APP_LOCK:
            return _BY_APP.get(app)

    @cached_property
    def config(self) -> DurableConfig:
        """Settings read once from ``app.conf``."""
        return DurableConfig.from_app(self.app.conf, self._url)

    @cached_property
    def journal(self) -> SqlJournal:
        """The SQL journal (connects on first use)."""
        return SqlJournal(self.config.url, sqlite_synchronous=self.config.sqlite_synchronous)

    @cached_property
    def index(self) -> ScheduleIndex:
        """The schedule index projection's table access."""
        return ScheduleIndex(self.journal)

    def now(self) -> datetime:
        """The current time from the clock, checked to be aware and converted to UTC."""
        moment = self._clock()
        if not isinstance(moment, datetime) or moment.utcoffset() is None:
            raise DurableError(f"clock returned {moment!r}; an aware datetime is required")
        return moment.astimezone(timezone.utc)

    def dispatcher(self, **options: Any) -> Dispatcher:
        """The dispatcher core without beat: ``.tick()`` decides and enqueues what is due."""
        from celery_durable.dispatcher import Dispatcher

        return Dispatcher(self, **options)

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
                f"A7: task {name!r} is not registered in app {self.app.main!r}", task=name
            )
        return task

    def is_durable(self, name: str) -> bool:
        """Whether the registered task ``name`` was made with :meth:`task`."""
        return bool(getattr(self.app.tasks.get(name), "__durable__", False))

    @cached_property
    def task_base(self) -> type:
        """The Celery task class durable tasks of this app derive from."""
        from celery_durable.tasks import durable_task_base

        return durable_task_base(self)

    def task(self, *args: Any, **options: Any) -> Any:
        """Register a durable Celery task; usable as ``@durable.task`` or ``@durable.task(...)``."""
        from celery_durable.tasks import make_durable_task

        if len(args) == 1 and callable(args[0]) and not options:
            return make_durable_task(self, args[0], {})
        return lambda fun: make_durable_task(self, fun, options)

    def run_ended(self, run_id: str) -> str | None:
        """``finished``, ``faulted`` or ``cancelled`` once a durable run ended, else ``None``."""
        try:
            outcome = self.outcome(run_id, timeout=0)
        except (TimeoutError, LookupError):
            return None
        return type(outcome).__name__.lower()

    # Durable runs ---------------------------------------------------------------------------
    # (worker side: celery_durable.tasks, .steps, .helpers, .control, .runs)

    def step(self, fun: Any = None, *, retry: Any = None, name: str | None = None) -> Any:
        """A journaled step (W2); usable as ``@durable.step`` or ``@durable.step(retry=…)``.

        Inside a durable task the result is stored by position and returned on replay;
        elsewhere the function is called as it is.
        """
        from celery_durable.steps import make_step

        if fun is not None:
            return make_step(fun, retry=retry, name=name)
        return lambda f: make_step(f, retry=retry, name=name)

    @cached_property
    def runs(self) -> Any:
        """The run table (:class:`celery_durable.runs.RunStore`): stale runs and wake-ups (D8)."""
        from celery_durable.runs import RunStore

        return RunStore(self.journal)

    def outcome(self, run_id: str, timeout: float | None = None) -> Any:
        """``Finished(value)``, ``Faulted(error)`` or ``Cancelled()`` of a run, from the journal
        (W7). ``TimeoutError`` when it does not end in time; ``LookupError`` if never started."""
        from celery_durable import control

        return control.outcome(self, run_id, timeout)

    def result(self, run_id: str, timeout: float | None = None) -> Any:
        """The value of a finished run; raises ``RunFaulted`` or ``RunCancelled`` (W7)."""
        from celery_durable import control

        return control.result(self, run_id, timeout)

    def cancel(self, run_id: str) -> bool:
        """Ask a run to stop: its body sees ``StepFailed`` (kind ``cancelled``) at its next step."""
        from celery_durable import control

        return control.cancel(self, run_id)

    def signal(self, run_id: str, name: str, payload: Any = None) -> None:
        """Store a signal for a run (W4); an ended run refuses it (``RunEnded``)."""
        from celery_durable import control

        control.signal(self, run_id, name, payload)

    # ------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the journal's connections."""
        if "journal" in self.__dict__:
            self.journal.close()

    def __repr__(self) -> str:
        url = self.journal.url if "journal" in self.__dict__ else "(not opened)"
        return f"<Durable app={self.app.main!r} journal={url}>"
