"""Spans for the positions of a durable run that are not ``@durable.step`` (W4, W9, W10).

``now``, ``uuid4``, ``random``, ``sleep``, ``wait_signal``, ``parallel``/``gather``/``race``
and the child-run calls each take a position as a step does; :func:`traced` gives each call a
span at the position it is about to take (``tracing.StepSpan``: position, kind, name, attempt,
replayed), current while it runs, so that the steps of parallel branches and the spans of a
child's start are its children. :func:`branch_span` gives each parallel branch its own span.

Untraced (no OpenTelemetry, or no provider), the wrapper costs one call to ``tracer()``. The
step path itself (``worker/steps.py``) makes its span inline: it is the hot path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

from celery_durable import tracing
from celery_durable.worker.context import current_run

P = ParamSpec("P")
R = TypeVar("R")

BRANCH = "branch"
"""The kind of a parallel branch's span (its position is the branch's prefix, ``3.1``)."""


def traced(
    kind: str,
    name: Callable[..., str] | None = None,
    at: Callable[..., tuple[Any, Any]] | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a position-taking call: traced, it runs inside a span of ``kind`` at the run's
        next position (``at(run, *args, **kwargs)``: another position and its record, e.g. the
        child a ``wait_child`` waits for); ``name(*args, **kwargs)`` names it (default: the name
    stored at the position, else ``kind``).
        Outside a durable run, or inside a step, the call is plain and has no span of its own."""

    def decorate(fun: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fun)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            found = tracing.tracer()
            run = None if found is None else current_run()
            if run is None or run.in_step:
                return fun(*args, **kwargs)
            position, record = run.peek() if at is None else at(run, *args, **kwargs)
            if name is not None:
                label = name(*args, **kwargs)
            else:
                label = kind if record is None else record.name
            with tracing.StepSpan(found, run.run_id, position, label, kind, record):
                return fun(*args, **kwargs)

        return wrapper

    return decorate


@contextmanager
def branch_span(run: Any, prefix: str) -> Iterator[None]:
    """The span of one parallel branch (W9), around its body; nothing when untraced."""
    found = tracing.tracer()
    if found is None:
        yield
        return
    with tracing.StepSpan(found, run.run_id, prefix, BRANCH, BRANCH):
        yield


__all__ = ["BRANCH", "branch_span", "traced"]
