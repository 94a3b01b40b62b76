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
"""Name of the span of one durable step: replayed from the journal or run (W2, W3)."""

SCHEDULE = "celery_durable.schedule"
RUN_ID = "celery_durable.run_id"
TASK = "celery_durable.task"
DUE = "celery_durable.due"
"""The due time, in the run ID's UTC form (as the message's ``durable_due`` header)."""
LATENESS = "celery_durable.lateness"
"""Seconds from the due time to the decision (or to the send)."""
REASON = "celery_durable.reason"
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

    __slots__ = ("api", "chosen", "decided", "provider", "tracer")

    def __init__(self) -> None:
        self.api: Any = None  # the ``opentelemetry.trace`` module; False when not installed
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

    Asked at each use: a provider the application sets after start-up is seen at once.
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
    """One span per run decided in a stored round, from ``began`` to now.

    ``decisions`` maps a schedule ID to its stored events (and the state after them). The
    spans are remembered by run ID so that the run's send span is their child.
    """
    from celery_durable.core.schedule_events import RunDecided

    keep = _STATE.decided
    for sid, (events, _state) in decisions.items():
        for event in events:
            if not isinstance(event, RunDecided):
                continue
            span = tracer.start_span(
                DECIDE_SPAN,
                start_time=began,
                attributes={
                    SCHEDULE: sid,
                    RUN_ID: event.run_id,
                    TASK: event.task,
                    DUE: format_due(event.due),
                    LATENESS: (event.at - event.due).total_seconds(),
                    REASON: event.reason,
                },
            )
            span.end()
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


class StepSpan:
    """The span of one durable step, a child of the current (the task's) span, current
    while the step runs (spans the function makes are its children).

    Made at the step's position (the run's next one); the step loop marks it with
    :func:`mark_step` once it knows whether the step is replayed or run. A class rather than
    a generator, and every attribute known at the start given at once: it is made per step.
    """

    __slots__ = ("span", "token")

    def __init__(self, found: Any, run: Any, name: str, kind: str) -> None:
        self.span = found.start_span(
            STEP_SPAN,
            attributes={
                STEP_NAME: name,
                STEP_KIND: kind,
                RUN_ID: run.run_id,
                POSITION: run.position,
            },
            record_exception=False,
            set_status_on_exception=False,
        )
        self.token: Any = None

    def __enter__(self) -> Any:
        from opentelemetry import context

        self.token = context.attach(_STATE.api.set_span_in_context(self.span))
        return self.span

    def __exit__(self, kind: Any, exc: BaseException | None, _tb: Any) -> None:
        from opentelemetry import context

        context.detach(self.token)
        span = self.span
        if isinstance(exc, Exception):
            span.record_exception(exc)
            span.set_status(_STATE.api.Status(_STATE.api.StatusCode.ERROR, kind.__name__))
        elif exc is not None and kind.__name__ == "Suspend":  # control flow, not an error
            span.set_attribute(SUSPENDED, True)
        span.end()


def mark_step(span: Any, attempt: int, *, replayed: bool) -> None:
    """Record on a step's span its attempt and whether it was replayed from the journal."""
    if span.is_recording():  # not when the sampler dropped the trace
        span.set_attributes({ATTEMPT: attempt, REPLAYED: replayed})
