"""A traced ``celery worker`` app: the OpenTelemetry SDK, Celery's instrumentation, durable steps.

Configured from the environment (set by tests/test_tracing.py for the worker subprocess):

* ``E2E_BROKER``  -- broker URL (Redis);
* ``E2E_JOURNAL`` -- journal URL (a SQLite file the test shares);
* ``E2E_SPANS``   -- a file where every ended span is appended as one JSON line.

Run with ``celery -A tests.support.traced_app worker --pool=solo``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

from celery import Celery
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from celery_durable import Durable, ScheduledRun
from celery_durable.worker.primitives import sleep
from tests.support.spans import span_record


class FileExporter(SpanExporter):
    """Appends each span to a JSON-lines file (flushed at once: the worker may be killed)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(s), default=str) + "\n" for s in spans)
        with self.lock, open(self.path, "a", encoding="utf-8") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ.get("E2E_SPANS", "spans"))))
trace.set_tracer_provider(provider)
CeleryInstrumentor().instrument()

app = Celery("traced_e2e", broker=os.environ.get("E2E_BROKER", "redis://127.0.0.1:6379/0"))
app.conf.task_ignore_result = True
app.conf.worker_prefetch_multiplier = 1
app.conf.worker_hijack_root_logger = False
durable = Durable(app, os.environ.get("E2E_JOURNAL", "sqlite:///traced.db"))


@durable.step(name="fetch")
def fetch() -> int:
    return 20


@durable.step(name="store")
def store(value: int) -> int:
    return value + 1


@durable.task(name="traced.job")
def job(run: ScheduledRun | None = None) -> int:
    """Two steps around a short durable sleep: the second delivery replays ``fetch``."""
    value = fetch()
    sleep(1.2)  # past the inline limit: the worker is given back, a countdown brings it back
    return store(value)
