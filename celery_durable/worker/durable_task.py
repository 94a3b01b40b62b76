"""The durable task class, and its type for type checkers (W1).

``@durable.task`` registers the function as a Celery task whose class derives from the app's
``Task`` and :class:`DurableTaskMixin`: each delivery goes through
:func:`~celery_durable.worker.delivery.deliver` (claim, body, end), and the broker delivers
the message again when a worker dies mid-run (``acks_late``), which the journal makes safe.
:class:`DurableTask` is what a type checker sees of the registered task: the function's own
signature for calling it, ``delay``, ``s`` and ``si``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, cast

from celery import Task

from celery_durable.worker.delivery import deliver

if TYPE_CHECKING:
    from celery import Celery
    from celery.canvas import Signature
    from celery.result import AsyncResult, EagerResult

    from celery_durable.runtime import Runtime

__all__ = ["DurableTask", "DurableTaskMixin", "durable_task_base", "make_durable_task"]


class DurableTaskMixin:
    """What makes a Celery task durable; combined with the app's task class."""

    __durable__ = True
    runtime: Runtime
    # The broker redelivers the message of a worker that died mid-run (W1): replay is safe.
    acks_late = True
    reject_on_worker_lost = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        task: Any = self
        return deliver(task, args, kwargs, self._body)

    def _body(self, *args: Any, **kwargs: Any) -> Any:
        parent_call = super().__call__  # type: ignore[misc]
        if getattr(parent_call, "__func__", None) is Task.__call__:
            # Task.__call__ would push a second request without the task id; the tracer has
            # pushed the real one already.
            return self.run(*args, **kwargs)  # type: ignore[attr-defined]
        return parent_call(*args, **kwargs)


def durable_task_base(runtime: Runtime) -> type:
    """The task class of durable tasks for ``runtime``'s app, derived from ``app.Task``.

    Deriving from ``app.Task`` keeps what a framework put there (Django's ``DjangoTask``, a
    Flask app-context task). ``acks_late`` with ``reject_on_worker_lost`` makes the broker
    deliver the message again when a worker dies mid-run: the journal makes that replay safe.
    """
    base: type = runtime.app.Task
    return type(
        "DurableTask",
        (DurableTaskMixin, base),
        {"runtime": runtime, "__module__": __name__},
    )


P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class DurableTask(Protocol[P, R_co]):
    """A durable task as a type checker sees it: the body's signature, and Celery's task API.

    ``@durable.task`` returns the Celery task object. Calling it, ``delay`` and ``si`` take
    the decorated function's parameters, ``s`` any part of them (a chain supplies the rest);
    ``apply_async`` and ``apply`` take Celery's ``args``/``kwargs`` and options. The run ID of
    a delivery is its task id.
    """

    name: str
    app: Celery

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co:
        """Call the body in this process (outside a worker: no run, steps are plain calls)."""
        ...

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> AsyncResult:
        """Send a message for a new run with these arguments."""
        ...

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature of a run with these arguments (for canvas: chains, groups). They may
        be partial: a chain adds the previous task's result as the first argument."""
        ...

    def si(self, *args: P.args, **kwargs: P.kwargs) -> Signature:
        """An immutable signature: a chain does not add the previous result to it."""
        ...

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        task_id: str | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Send a message for the run ``task_id`` (a new ID when ``None``) with Celery options."""
        ...

    def apply(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        task_id: str | None = None,
        **options: Any,
    ) -> EagerResult:
        """Run the delivery of ``task_id`` in this process (the whole claim, body and end)."""
        ...


def make_durable_task(
    runtime: Runtime, base: type, fun: Callable[P, R], options: dict[str, Any]
) -> DurableTask[P, R]:
    """Register ``fun`` as a durable Celery task (every Celery task option passes through)."""
    options = dict(options)
    options.setdefault("base", base)
    # A durable task belongs to this Durable's journal: do not copy it into other apps
    # (Celery's default ``shared=True`` would, with this app's task class and journal).
    options.setdefault("shared", False)
    return cast("DurableTask[P, R]", runtime.app.task(**options)(fun))
