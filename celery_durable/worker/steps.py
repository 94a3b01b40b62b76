"""Journaled steps (W2, W3, W5): ``@durable.step`` and the attempt loop behind it.

A step call inside a durable run takes the next position. If the journal holds a result there,
the result is returned without running the function; a stored failure is raised again as the
same :class:`StepFailed`; otherwise the function runs, and its JSON result is stored with one
append (one INSERT and its commit). Outside a durable run, and inside another step, a step is a
plain call.
"""

from __future__ import annotations

import functools
import math
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

from celery_durable import tracing
from celery_durable.core.codec import check_json_value, time_to_json
from celery_durable.core.journal import NewEvent
from celery_durable.core.retry import GiveUp, Retry, decide_retry, type_name
from celery_durable.core.run_aggregate import (
    FORMAT,
    STEP_ATTEMPT_FAILED,
    STEP_COMPLETED,
    STEP_FAILED,
    STEP_STARTED,
    PositionId,
)
from celery_durable.errors import AttemptTimeout, DurableError, StepFailed
from celery_durable.worker.context import Changed, RunContext, StepContext, current_run

P = ParamSpec("P")
R = TypeVar("R")

INLINE_WAIT = 1.0
"""Waits up to this many seconds (retry backoff, short sleeps) happen inside the worker;
longer ones give the worker back and come back by a broker countdown or the dispatcher."""

FAILURE_KINDS = ("error", "timeout", "cancelled", "not_retryable")


class _NotJson(DurableError, ValueError):
    pass


def step_name_of(fun: Callable[..., Any]) -> str:
    """The default stored name of a step: the function's ``__qualname__``."""
    return str(getattr(fun, "__qualname__", None) or getattr(fun, "__name__", repr(fun)))


def make_step(
    fun: Callable[P, R], *, retry: Retry | None = None, name: str | None = None
) -> Callable[P, R]:
    """Wrap ``fun`` as a journaled step (what ``@durable.step`` does)."""
    if not callable(fun):
        raise TypeError(f"a step must be callable, not {type(fun).__name__}")
    if retry is not None and not isinstance(retry, Retry):
        raise TypeError(f"retry must be a Retry, not {type(retry).__name__}")
    policy = retry if retry is not None else Retry.none()
    stored_name = name if name is not None else step_name_of(fun)
    if not isinstance(stored_name, str) or not stored_name:
        raise TypeError("a step name must be a non-empty str")

    @functools.wraps(fun)
    def step(*args: P.args, **kwargs: P.kwargs) -> R:
        run = current_run()
        if run is None or run.in_step:
            return fun(*args, **kwargs)
        found = run.tracer
        if found is None:
            reached = run.reach(stored_name, "step")
            record = reached[1]
            if record is not None and record.status == "completed":
                return record.result  # replayed (W2): what run_step would return first
            return run_step(run, stored_name, "step", policy, fun, args, kwargs, None, reached)
        # Traced: the position first, so that the span starts with all it says (replayed,
        # attempt) and is never changed afterwards but by an inline retry.
        reached = run.reach(stored_name, "step")
        position, record = reached
        with tracing.StepSpan(found, run.run_id, position, stored_name, "step", record) as span:
            return run_step(run, stored_name, "step", policy, fun, args, kwargs, span, reached)

    step.__durable_step__ = stored_name  # type: ignore[attr-defined]
    step.retry_policy = policy  # type: ignore[attr-defined]
    return step


def step_failed(
    run_id: str, position: PositionId, name: str, error: dict[str, Any], attempts: int
) -> StepFailed:
    """The ``StepFailed`` for a stored failure (the same on the first run and on replay)."""
    failure = error.get("failure", "error")
    error_type = error.get("error_type", "Exception")
    message = error.get("message", "")
    return StepFailed(
        f"step {name!r} at position {position} of run {run_id!r} failed ({failure}): "
        f"{error_type}: {message}",
        kind=failure,
        error_type=error_type,
        error_message=message,
        position=position,
        step=name,
        attempts=attempts,
        run_id=run_id,
    )


def fail(
    run: RunContext,
    position: PositionId,
    name: str,
    kind: str,
    *,
    failure: str,
    error_type: str,
    message: str,
    attempts: int,
) -> StepFailed:
    """Store a step's final failure and return the ``StepFailed`` to raise."""
    error = {"failure": failure, "error_type": error_type, "message": message}
    run.append([run.event(STEP_FAILED, position, name=name, kind=kind, attempts=attempts, **error)])
    return step_failed(run.run_id, position, name, error, attempts)


def cancelled(
    run: RunContext, position: PositionId, name: str, kind: str, attempts: int = 0
) -> StepFailed:
    """Deliver a pending cancel request at this position (W7)."""
    return fail(
        run,
        position,
        name,
        kind,
        failure="cancelled",
        error_type="celery_durable.errors.RunCancelled",
        message="the run was cancelled",
        attempts=attempts,
    )


def run_step(
    run: RunContext,
    name: str,
    kind: str,
    policy: Retry,
    fun: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    span: Any = None,
    reached: tuple[PositionId, Any] | None = None,
) -> Any:
    """Replay or execute one step at the run's next position (``reached``: the position and
    its record, taken already by a traced caller); a traced ``span`` is told of inline
    retries."""
    position, record = run.reach(name, kind) if reached is None else reached
    if record is not None:
        if record.status == "completed":
            return record.result
        if record.status == "failed":
            raise step_failed(run.run_id, position, name, record.error or {}, record.attempts)
    if run.state.cancel_pending:
        raise cancelled(run, position, name, kind, record.attempts if record else 0)
    attempt = 1
    first_started = None
    if record is not None:
        first_started = record.first_started
        if record.status == "retrying":
            attempt = record.attempts + 1
            if record.retry_at is not None and record.retry_at > run.now():
                # Early delivery (or woken for something else): back to sleep until the retry.
                _wait_or_suspend(run, position, name, kind, record.retry_at, [], attempt - 1)
    if first_started is None and policy.deadline is not None:
        # The deadline counts from here, also across crashes: store the start (W3).
        first_started = run.now()
        run.append(
            [
                run.event(
                    STEP_STARTED, position, name=name, kind=kind, at=time_to_json(first_started)
                )
            ]
        )
    # Without a stored start, the first attempt's start is only needed if it fails: it is
    # then worked out from a monotonic clock instead of reading the clock before every step.
    began = time.monotonic()
    shown = attempt  # the attempt the span started with (tracing.attempt_of)
    while True:
        run.step = StepContext(run.run_id, position, attempt, run.key(position), run.task)
        if span is not None and attempt != shown:
            tracing.next_attempt(span, attempt)
            shown = attempt
        run.notify("call", position, name)
        run.in_step = True
        try:
            result = _call(fun, args, kwargs, policy.timeout)
        except Exception as exc:
            if first_started is None:
                first_started = run.now() - timedelta(seconds=time.monotonic() - began)
            failure = "timeout" if isinstance(exc, AttemptTimeout) else "error"
            decision = decide_retry(
                policy,
                exc,
                attempt=attempt,
                first_started=first_started,
                now=run.now(),
                kind=failure,
            )
            error_type = type_name(type(exc))
            message = str(exc)
            if isinstance(decision, GiveUp):
                raise fail(
                    run, position, name, kind,
                    failure=decision.kind, error_type=error_type, message=message, attempts=attempt,
                ) from exc  # fmt: skip
            attempt_failed = run.event(
                STEP_ATTEMPT_FAILED,
                position,
                name=name,
                kind=kind,
                attempt=attempt,
                failure=failure,
                error_type=error_type,
                message=message,
                first_started_at=time_to_json(first_started),
                retry_at=time_to_json(decision.at),
            )
            _wait_or_suspend(run, position, name, kind, decision.at, [attempt_failed], attempt)
            attempt = decision.attempt
            continue
        finally:
            run.step = None
            run.in_step = False
        try:
            if not _plain(result, run.max_bytes):
                check_json_value(
                    result,
                    f"the result of step {name!r} at position {position}",
                    max_bytes=run.max_bytes,
                    error=_NotJson,
                )
        except _NotJson as exc:
            raise fail(
                run, position, name, kind,
                failure="not_retryable", error_type=type_name(TypeError), message=str(exc),
                attempts=attempt,
            ) from None  # fmt: skip
        # What run.event() builds, in the same key order (the stored text stays the same).
        data: dict[str, Any] = {
            "v": FORMAT, "position": position, "name": name, "kind": kind, "result": result,
        }  # fmt: skip
        if attempt > 1:
            data["attempt"] = attempt
        run.append([NewEvent(type=STEP_COMPLETED, data=data)])
        run.notify("stored", position, name)
        return result


def _plain(value: Any, max_bytes: int) -> bool:
    """A scalar that certainly survives a JSON round trip within ``max_bytes`` (fast path)."""
    kind = type(value)
    if value is None or kind is bool:
        return True
    if kind is int:
        return -(1 << 63) <= value < (1 << 63)
    if kind is str:
        return len(value) * 6 + 2 <= max_bytes  # worst case: every character escaped
    if kind is float:
        return math.isfinite(value)
    return False


def _wait_or_suspend(
    run: RunContext,
    position: PositionId,
    name: str,
    kind: str,
    at: Any,
    events: list[Any],
    attempts: int,
) -> None:
    """Wait for a retry in the worker if it is due within :data:`INLINE_WAIT`, else store it
    and give the worker back. Returns when the next attempt may start."""
    wait = (at - run.now()).total_seconds()
    if (wait <= INLINE_WAIT or run.inline_waits) and not run.state.cancel_pending:
        if events:
            run.append(events)
        run.retry_wait(wait)
        return
    if run.state.cancel_pending:
        raise cancelled(run, position, name, kind, attempts)
    try:
        raise run.suspend(at, "retry", events)
    except Changed:
        raise cancelled(run, position, name, kind, attempts) from None


def _call(
    fun: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None
) -> Any:
    """Call ``fun``; with a ``timeout``, interrupt it by ``SIGALRM`` in the main thread (the
    solo and prefork pools), elsewhere check the elapsed time afterwards."""
    if timeout is None:
        return fun(*args, **kwargs)
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "setitimer"
    ):
        started = time.monotonic()
        result = fun(*args, **kwargs)
        elapsed = time.monotonic() - started
        if elapsed > timeout:
            raise AttemptTimeout(f"the attempt took {elapsed:.3f} s; the limit is {timeout:g} s")
        return result

    def on_alarm(_signum: int, _frame: Any) -> None:
        raise AttemptTimeout(f"the attempt ran past its limit of {timeout:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    old_timer = signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return fun(*args, **kwargs)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if old_timer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, *old_timer)
