"""``Durable``: the entry point binding a Celery app to a journal (SPEC §8)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from celery import Celery

from celery_durable import run_control
from celery_durable.blackouts import GlobalBlackouts
from celery_durable.config import DurableConfig, install_report_filter
from celery_durable.runtime import Clock, Runtime
from celery_durable.schedules import Schedules, ScheduleStore
from celery_durable.store.stores import AnyIndex, AnyJournal, AnyRunTable, AnyStore
from celery_durable.worker import run_ends as ends
from celery_durable.worker import secret_masking

if TYPE_CHECKING:
    from celery_durable.core.children import ChildHandle
    from celery_durable.core.outcomes import Outcome
    from celery_durable.core.retry import Retry
    from celery_durable.dispatch.dispatcher import Dispatcher
    from celery_durable.store.retention import PruneProgress, PruneReport
    from celery_durable.worker.durable_task import DurableTask

P = ParamSpec("P")
R = TypeVar("R")

_BY_APP: weakref.WeakKeyDictionary[Celery, Durable] = weakref.WeakKeyDictionary()
_BY_APP_LOCK = threading.Lock()


class Durable:
    """Durable schedules and tasks for one Celery app, stored in one SQL journal.

    ``url`` falls back to ``app.conf.durable_url``, then ``CELERY_DURABLE_URL``, then
    ``sqlite:///celery_durable.db``. Construction opens no connection. ``clock`` (a callable
    returning an aware UTC datetime) replaces the system clock in tests; ``store`` (a
    :class:`~celery_durable.store.memory.MemoryStore`) keeps everything in this process's
    memory instead of a journal URL, for unit tests.

    >>> app = Celery("proj", broker="redis://localhost")
    >>> durable = Durable(app)
    >>> durable.schedules.create("nightly", "proj.backup", "/srv", Daily("02:00", "Europe/Oslo"))

    A facade: the work is done by services that receive its :class:`~.runtime.Runtime`.
    """

    def __init__(
        self,
        app: Celery,
        url: str | None = None,
        *,
        clock: Clock | None = None,
        store: AnyStore | None = None,
    ) -> None:
        self.runtime = Runtime(app, url, clock=clock, store=store)
        self.app = app
        self.schedules = Schedules(self.runtime)
        self.blackouts = GlobalBlackouts(self.runtime)
        """The global blackout windows (P4), kept in the journal."""
        with _BY_APP_LOCK:
            _BY_APP.setdefault(app, self)
        ends.install()
        secret_masking.install()  # P5: retries and debug lines show references only
        install_report_filter()

    @classmethod
    def for_app(cls, app: Celery) -> Durable:
        """The ``Durable`` made for ``app`` first, or a new one from its configuration."""
        with _BY_APP_LOCK:
            found = _BY_APP.get(app)
        return found if found is not None else cls(app)

    @property
    def config(self) -> DurableConfig:
        """Settings read once from ``app.conf``."""
        return self.runtime.config

    @property
    def journal(self) -> AnyJournal:
        """The journal (a SQL journal connects on first use)."""
        return self.runtime.journal

    @property
    def index(self) -> AnyIndex:
        """The schedule index projection's table access."""
        return self.runtime.index

    @property
    def _store(self) -> ScheduleStore:
        """Kept for tests written against it; use ``durable.schedules.store``."""
        return self.schedules.store

    def now(self) -> datetime:
        """The current time from the clock, checked to be aware and converted to UTC."""
        return self.runtime.now()

    def dispatcher(self, **options: Any) -> Dispatcher:
        """The dispatcher core without beat: ``.tick()`` decides and enqueues what is due."""
        from celery_durable.dispatch.dispatcher import Dispatcher

        return Dispatcher(self.runtime, **options)

    # Tasks ---------------------------------------------------------------------------------

    def task_name(self, task: Any) -> str:
        """The name of a task given by name or as a task object."""
        return self.runtime.task_name(task)

    def require_task(self, name: str) -> Any:
        """The registered task called ``name``; ``UnknownTask`` when the app has none (A7)."""
        return self.runtime.require_task(name)

    def is_durable(self, name: str) -> bool:
        """Whether the registered task ``name`` was made with :meth:`task`."""
        return self.runtime.is_durable(name)

    @cached_property
    def task_base(self) -> type:
        """The Celery task class durable tasks of this app derive from."""
        from celery_durable.worker.durable_task import durable_task_base

        return durable_task_base(self.runtime)

    @overload
    def task(self, fun: Callable[P, R], /) -> DurableTask[P, R]: ...

    @overload
    def task(self, **options: Any) -> Callable[[Callable[P, R]], DurableTask[P, R]]: ...

    def task(self, *args: Any, **options: Any) -> Any:
        """Register a durable Celery task; usable as ``@durable.task`` or ``@durable.task(...)``.

        The task keeps the decorated function's signature for type checkers.
        """
        from celery_durable.worker.durable_task import make_durable_task

        if len(args) == 1 and callable(args[0]) and not options:
            return make_durable_task(self.runtime, self.task_base, args[0], {})
        return lambda fun: make_durable_task(self.runtime, self.task_base, fun, options)

    def run_ended(self, run_id: str) -> str | None:
        """``finished``, ``faulted`` or ``cancelled`` once a durable run ended, else ``None``."""
        return run_control.run_ended(self.runtime, run_id)

    # Durable runs ---------------------------------------------------------------------------
    # (worker side: celery_durable.worker, .run_control, .store.runs)

    @overload
    def step(
        self, fun: Callable[P, R], *, retry: Retry | None = None, name: str | None = None
    ) -> Callable[P, R]: ...

    @overload
    def step(
        self, fun: None = None, *, retry: Retry | None = None, name: str | None = None
    ) -> Callable[[Callable[P, R]], Callable[P, R]]: ...

    def step(self, fun: Any = None, *, retry: Any = None, name: str | None = None) -> Any:
        """A journaled step (W2); usable as ``@durable.step`` or ``@durable.step(retry=…)``.

        Inside a durable task the result is stored by position and returned on replay;
        elsewhere the function is called as it is.
        """
        from celery_durable.worker.steps import make_step

        if fun is not None:
            return make_step(fun, retry=retry, name=name)
        return lambda f: make_step(f, retry=retry, name=name)

    @property
    def runs(self) -> AnyRunTable:
        """The run table (:class:`~.store.runs.RunStore`): stale runs and wake-ups (D8)."""
        return self.runtime.runs

    def outcome(self, run_id: str, timeout: float | None = None) -> Outcome:
        """``Finished(value)``, ``Faulted(error)`` or ``Cancelled()`` of a run, from the journal
        (W7). ``TimeoutError`` when it does not end in time; ``LookupError`` if never started."""
        return run_control.outcome(self.runtime, run_id, timeout)

    def result(self, run_id: str, timeout: float | None = None) -> Any:
        """The value of a finished run; raises ``RunFaulted`` or ``RunCancelled`` (W7)."""
        return run_control.result(self.runtime, run_id, timeout)

    def cancel(self, run_id: str) -> bool:
        """Ask a run to stop: its body sees ``StepFailed`` (kind ``cancelled``) at its next step."""
        return run_control.cancel(self.runtime, run_id)

    # Child runs (W10-W13) ----------------------------------------------------------------------

    def child(self, task: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Run ``task(*args, **kwargs)`` as a child run of the current durable run and return
        its result; the parent gives its worker back while it waits (W10)."""
        from celery_durable.worker import children

        return children.child(self.runtime, task, args, kwargs)

    def start_child(self, task: Any, /, *args: Any, **kwargs: Any) -> ChildHandle:
        """Start ``task`` as a child run; returns its :class:`ChildHandle` once the start is
        stored. A child never waited for runs on by itself (W10)."""
        from celery_durable.worker import children

        return children.start_child(self.runtime, task, args, kwargs)

    def wait_child(self, handle: ChildHandle) -> Any:
        """The result of a child started with :meth:`start_child`, waited for durably (W10)."""
        from celery_durable.worker import children

        return children.wait_child(self.runtime, handle)

    def map_children(self, task: Any, inputs: Iterable[Any], *, at_most: int = 10) -> list[Any]:
        """One child run ``task(input)`` per input, at most ``at_most`` running at a time,
        results in input order (W11)."""
        from celery_durable.worker import children

        return children.map_children(self.runtime, task, inputs, at_most)

    def children(self, run_id: str) -> list[tuple[str, str]]:
        """``(run ID, state)`` of each child run ``run_id`` started, in start order (W13)."""
        from celery_durable.worker import children

        return children.child_states(self.runtime, run_id)

    def signal(self, run_id: str, name: str, payload: Any = None) -> None:
        """Store a signal for a run (W4); an ended run refuses it (``RunEnded``)."""
        run_control.signal(self.runtime, run_id, name, payload)

    def prune(
        self,
        older_than: timedelta | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[PruneProgress], None] | None = None,
    ) -> PruneReport:
        """Remove the runs that are over and due before ``now - older_than`` (O1).

        ``older_than`` defaults to ``durable_retention`` (30 days). One call removes everything
        eligible, whatever order it was recorded in, in small batches, each one short
        transaction; safe while beat runs. With ``dry_run`` only counts. ``progress`` is called
        after each batch with a :class:`~.store.retention.PruneProgress`. Returns a
        :class:`~.store.retention.PruneReport`. See docs/retention.md.
        """
        from celery_durable.errors import JournalError
        from celery_durable.store.index import ScheduleIndex
        from celery_durable.store.retention import Pruner

        config = self.config
        index = self.index
        if not isinstance(index, ScheduleIndex):
            raise JournalError("retention needs a SQL journal; a memory store keeps everything")
        pruner = Pruner(
            self.runtime.sql_journal, index, batch=config.prune_batch, fault=self.runtime.fault
        )
        now = self.now()
        if not dry_run:
            pruner.catch_up_index(now)
        return pruner.prune(now, older_than or config.retention, dry_run=dry_run, progress=progress)

    # ------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the journal's connections."""
        self.runtime.close()

    def __repr__(self) -> str:
        url = self.runtime.store.url if self.runtime.opened else "(not opened)"
        return f"<Durable app={self.app.main!r} journal={url}>"
