"""OpenTelemetry spans for decisions, sends and durable steps (the ``otel`` extra).

With ``opentelemetry-api`` installed and a tracer provider configured by the application (an
SDK ``TracerProvider`` set with ``trace.set_tracer_provider``), the dispatcher emits a span per
decision and per send, and the worker one per durable step (docs/tracing.md). The send span's
context goes into the Celery message headers (W3C ``traceparent``), so the task span of
``opentelemetry-instrumentation-celery`` on the worker is its child, and the step spans are
children of that task span.

Without the package nothing is imported (one failed import, remembered); with it but without
a configured provider, :func:`tracer` answers ``None`` after one ``isinstance`` check, and every
call site then skips its tracing work.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery_durable.core.ids import format_due

if TYPE_CHECKING:
    from celery_durable.core.schedule_aggregate import PendingRun
    from celery_durable.core.schedule_events import ScheduleEvent

INSTRUMENTATION = "celery_durable"
"""The tracer's (instrumentation scope's) name."""

DECIDE_SPAN = "celery_durable.decide"
"""Name of the span of one decided run: deciding it and storing the decision (A5, A6)."""
SEND_SPAN = "celery_durable.send"
"""Name of the span of one run's message handed to the broker (S2)."""
STEP_SPAN = "celery_durable.step"
"""Name of the span of one position of a durable run: a step, replayed from the journal or
run (W2, W3), or ``now``, ``uuid4``, ``random``, ``sleep``, a signal wait, a parallel call,
a branch, a child run (W4, W9, W10); ``celery_durable.step.kind`` says which."""

SCHEDULE = "celery_durable.schedule"
RUN_ID = "celery_durable.run_id"
TASK = "celery_durable.task"
DUE = "celery_durable.due"
"""The due time, in the run ID's UTC form (as the message's ``durable_due`` header)."""
LATENESS = "celery_durable.lateness"
"""Seconds from the due time to the decision (or to the send)."""
REASON = "celery_durable.reason"
"""A decision's reason: ``rule``, ``backfill``, ``trigger``; a skip's: ``overlap`` or
``blackout <name>`` (P4)."""
OUTCOME = "celery_durable.outcome"
"""What a decision span decided: ``decided``, ``deferred`` (P4: sent when a blackout is over)
or ``skipped`` (D7, P4)."""
STEP_NAME = "celery_durable.step.name"
STEP_KIND = "celery_durable.step.kind"
POSITION = "celery_durable.step.position"
ATTEMPT = "celery_durable.step.attempt"
REPLAYED = "celery_durable.step.replayed"
"""``True``: the result (or failure) came from the journal and the function did not run."""
SUSPENDED = "celery_durable.step.suspended"
"""``True``: the step gave the worker back (a retry waits beyond the inline limit)."""

KEEP_DECIDED = 10_000
"""Decision spans remembered until their send (the send span is their child); the oldest go
first, so a run never sent (a broker away for long) costs a bounded amount of memory."""


class _State:
    """What this process knows about the OpenTelemetry API: loaded once, per provider."""

    __slots__ = ("api", "chosen", "context", "decided", "provider", "tracer")

    def __init__(self) -> None:
        self.api: Any = None  # the ``opentelemetry.trace`` module; False when not installed
        self.context: Any = None  # the ``opentelemetry.context`` module, once a span needs it
        self.chosen: Any = None  # a provider given to use_tracer_provider, else the global one
        self.provider: Any = None
        self.tracer: Any = None
        self.decided: OrderedDict[str, Any] = OrderedDict()  # run ID -> decision SpanContext


_STATE = _State()


def _api() -> Any:
    api = _STATE.api
    if api is None:
        try:
            from opentelemetry import trace as api
        except ImportError:
            api = False
        _STATE.api = api
    return api


def tracer() -> Any | None:
    """The package's tracer, or ``None`` when tracing is off (no API, no provider).

    Asked at each use: a provider the application sets after start-up is seen at once (by
    a durable run's steps, from its next delivery: a delivery asks once).
    """
    api = _api()
    if api is False:
        return None
    provider = _STATE.chosen or api.get_tracer_provider()
    if provider is _STATE.provider:
        return _STATE.tracer
    found = None
    if not isinstance(provider, (api.ProxyTracerProvider, api.NoOpTracerProvider)):
        found = provider.get_tracer(INSTRUMENTATION, _version())
    _STATE.provider, _STATE.tracer = provider, found
    return found


def use_tracer_provider(provider: Any | None) -> None:
    """Trace with ``provider`` rather than OpenTelemetry's global one; ``None``: the global.

    For an application that keeps its provider to itself, and for tests (the global provider
    can be set only once per process).
    """
    _STATE.chosen = provider
    _STATE.provider = _STATE.tracer = None


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("celery-durable")
    except PackageNotFoundError:  # run from a source tree
        return None


def started() -> int:
    """The moment a traced piece of work begins (nanoseconds, the spans' clock)."""
    return time.time_ns()


def decided(
    tracer: Any, decisions: Mapping[str, tuple[list[ScheduleEvent], Any]], began: int
) -> None:
    """One span per due time settled in a stored round, from ``began`` to now: a decided run
    (its send span will be its child), and a due time skipped (overlap, D7; blackout, P4) or
    whose send a blackout defers, with the outcome.

    ``decisions`` maps a schedule ID to its stored events (and the state after them). The
    spans of decided runs are remembered by run ID so that the run's send span is their child.
    """
    from celery_durable.core.ids import run_id
    from celery_durable.core.schedule_events import RunDecided, RunDeferred, RunSkipped

    keep = _STATE.decided
    attributes: dict[str, Any]
    for sid, (events, _state) in decisions.items():
        for event in events:
            if isinstance(event, RunDecided):
                outcome = "decided" if event.blackout is None else "deferred"
                attributes = {
                    RUN_ID: event.run_id,
                    TASK: event.task,
                    REASON: event.reason,
                }
            elif isinstance(event, RunSkipped):
                outcome = "skipped"
                attributes = {RUN_ID: run_id(sid, event.due), REASON: event.reason}
            elif isinstance(event, RunDeferred):
                outcome = "deferred"
                attributes = {RUN_ID: run_id(sid, event.due), REASON: f"blackout {event.blackout}"}
            else:
                continue
            attributes |= {
                SCHEDULE: sid,
                DUE: format_due(event.due),
                LATENESS: (event.at - event.due).total_seconds(),
                OUTCOME: outcome,
            }
            span = tracer.start_span(DECIDE_SPAN, start_time=began, attributes=attributes)
            span.end()
            if isinstance(event, RunDecided):
                keep[event.run_id] = span.get_span_context()
    while len(keep) > KEEP_DECIDED:
        keep.popitem(last=False)


class _Untraced:
    """``sending`` when tracing is off: hands back the headers as they are."""

    __slots__ = ("headers",)

    def __init__(self, headers: dict[str, Any]) -> None:
        self.headers = headers

    def __enter__(self) -> dict[str, Any]:
        return self.headers

    def __exit__(self, *_exc: object) -> None:
        return None


def sending(sid: str, pending: PendingRun, now: datetime | None, headers: dict[str, Any]) -> Any:
    """Context of one run's send: ``with sending(...) as headers: <publish with headers>``.

    Traced, it is a span (the child of the run's decision span) and the headers to publish
    are a copy of ``headers`` carrying its context (:func:`inject_headers`); the stored form
    of a durable run's message keeps the headers without it. Untraced, ``headers`` as given.
    Every path that publishes a decided run goes through here.
    """
    found = tracer()
    if found is None:
        return _Untraced(headers)
    return _sending(found, sid, pending, now, headers)


@contextmanager
def _sending(
    found: Any, sid: str, pending: PendingRun, now: datetime | None, headers: dict[str, Any]
) -> Iterator[dict[str, Any]]:
    api = _STATE.api
    parent = None
    decision = _STATE.decided.pop(pending.run_id, None)
    if decision is not None:
        parent = api.set_span_in_context(api.NonRecordingSpan(decision))
    attributes: dict[str, Any] = {
        SCHEDULE: sid,
        RUN_ID: pending.run_id,
        TASK: pending.task,
        DUE: format_due(pending.due),
        "messaging.message.id": pending.run_id,
    }
    if now is not None:
        attributes[LATENESS] = (now - pending.due).total_seconds()
    with found.start_as_current_span(
        SEND_SPAN, context=parent, kind=api.SpanKind.PRODUCER, attributes=attributes
    ):
        yield inject_headers(headers)


def inject_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a message's ``headers`` with the current trace context added.

    The one place the trace context enters a run's message (``traceparent``, and
    ``tracestate``/``baggage`` when set): Celery copies message headers onto the worker's
    ``task.request``, where ``opentelemetry-instrumentation-celery`` reads them.
    """
    out = dict(headers)
    from opentelemetry.propagate import inject

    inject(out)
    return out


def attempt_of(record: Any) -> tuple[int, bool]:
    """The attempt a position starts at and whether the journal answers it (replayed): from
    what the journal holds there (``None``: nothing yet, the first attempt runs)."""
    if record is None:
        return 1, False
    status = record.status
    if status == "completed":  # the attempts that failed before the one that succeeded
        return record.attempts + 1, True
    if status == "failed":
        return max(record.attempts, 1), True
    if status == "timed_out":
        return 1, True
    return record.attempts + 1, False


class StepSpan:
    """The span of one position of a durable run — a step, or ``now``, ``sleep``, a signal
    wait, a parallel call, a child run — a child of the current (the task's) span, and current
    while the position's work runs, so that spans made inside it are its children.

    Made once the position is reached (``run.reach``), so that every attribute, the attempt
    and whether it is replayed included, is given when the span starts: one SDK call, no
    ``set_attributes`` after. A span the sampler drops is not made current (nothing is
    recorded under it anyway). A class rather than a generator: it is made per step.
    """

    __slots__ = ("span", "token")

    def __init__(
        self, found: Any, run_id: str, position: Any, name: str, kind: str, record: Any = None
    ) -> None:
        attempt, replayed = attempt_of(record)
        self.span = found.start_span(
            STEP_SPAN,
            attributes={
                STEP_NAME: name,
                STEP_KIND: kind,
                RUN_ID: run_id,
                POSITION: position,
                ATTEMPT: attempt,
                REPLAYED: replayed,
            },
            record_exception=False,
            set_status_on_exception=False,
        )
        self.token: Any = None

    def __enter__(self) -> Any:
        span = self.span
        if span.is_recording():
            self.token = _context().attach(_STATE.api.set_span_in_context(span))
        return span

    def __exit__(self, kind: Any, exc: BaseException | None, _tb: Any) -> None:
        span = self.span
        if self.token is not None:
            _context().detach(self.token)
        if isinstance(exc, Exception):
            span.record_exception(exc)
            span.set_status(_STATE.api.Status(_STATE.api.StatusCode.ERROR, kind.__name__))
        elif exc is not None and kind.__name__ == "Suspend":  # control flow, not an error
            span.set_attribute(SUSPENDED, True)
        span.end()


def _context() -> Any:
    """``opentelemetry.context``, imported once (a ``from … import`` inside a function runs
    importlib's Python code at every call: twice per traced step)."""
    module = _STATE.context
    if module is None:
        from opentelemetry import context as module

        _STATE.context = module
    return module


def next_attempt(span: Any, attempt: int) -> None:
    """A step retried inside the worker (W3): its span shows the attempt now running."""
    if span.is_recording():
        span.set_attribute(ATTEMPT, attempt)
