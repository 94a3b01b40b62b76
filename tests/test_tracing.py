"""OpenTelemetry traces from a decision through the task to its steps (docs/tracing.md).

The dispatcher runs here, with a fake clock and the SDK's in-memory exporter; the task runs in
a real ``celery worker`` subprocess (``tests/support/traced_app.py``) with
``opentelemetry-instrumentation-celery`` and an exporter writing each span to a file. Both
share a SQLite journal file and the test's Redis database.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, Every, ScheduledRun, tracing
from celery_durable.core.outcomes import Finished
from tests.support.clock import FakeClock
from tests.support.processes import python_command, running_process, wait_for
from tests.support.spans import span_record

otel_sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

UTC = timezone.utc
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """A tracer provider of this test only (the global one is left alone)."""
    exporter = InMemorySpanExporter()
    provider = otel_sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    yield exporter
    tracing.use_tracer_provider(None)
    provider.shutdown()


def client(broker: str, journal: str, clock: FakeClock) -> tuple[Celery, Durable]:
    """The dispatcher's side: the durable task is registered (its body runs in the worker)."""
    app = Celery("traced-client", broker=broker, set_as_current=False)
    app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=False)
    durable = Durable(app, journal, clock=clock)

    @durable.task(name="traced.job")
    def job(run: ScheduledRun | None = None) -> int:  # pragma: no cover - runs in the worker
        raise AssertionError("runs in the worker")

    return app, durable


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(120)
def test_one_trace_from_the_decision_through_the_worker_to_its_steps(
    spans: InMemorySpanExporter, tmp_path: Path, redis_url: str, sqlite_url: str
) -> None:
    clock = FakeClock(datetime.now(UTC).replace(microsecond=0))
    _app, durable = client(redis_url, sqlite_url, clock)
    span_file = tmp_path / "worker-spans.jsonl"
    try:
        durable.schedules.create("nightly", "traced.job", None, Every(timedelta(seconds=10)))
        dispatcher = durable.dispatcher()
        dispatcher.tick()
        clock.advance(seconds=12)  # due 2 s ago
        dispatcher.tick()
        dispatcher.close()
        [run] = durable.schedules.runs("nightly")
        cmd = python_command(
            "-m", "celery", "-A", "tests.support.traced_app", "worker", "--pool=solo",
            "--concurrency=1", "--without-heartbeat", "--without-mingle", "--without-gossip",
            "--loglevel=INFO",
        )  # fmt: skip
        env = {"E2E_BROKER": redis_url, "E2E_JOURNAL": sqlite_url, "E2E_SPANS": str(span_file)}
        with running_process(cmd, log_path=tmp_path / "worker.log", env=env) as worker:
            assert durable.outcome(run.run_id, 60) == Finished(21)
            wait_for(
                lambda: sum(s["name"] == "run/traced.job" for s in read_spans(span_file)) == 2,
                timeout=20,
                processes=[worker],
            )
    finally:
        durable.close()

    here = [span_record(s) for s in spans.get_finished_spans()]
    [decide] = [s for s in here if s["name"] == tracing.DECIDE_SPAN]
    [send] = [s for s in here if s["name"] == tracing.SEND_SPAN]
    assert decide["attributes"] == {
        tracing.SCHEDULE: "nightly",
        tracing.RUN_ID: run.run_id,
        tracing.TASK: "traced.job",
        tracing.DUE: run.run_id.split("@", 1)[1],
        tracing.LATENESS: 2.0,
        tracing.REASON: "rule",
    }
    assert send["parent_id"] == decide["span_id"]
    assert send["attributes"][tracing.RUN_ID] == run.run_id
    assert send["attributes"][tracing.LATENESS] == 2.0

    there = read_spans(span_file)
    trace_id = decide["trace_id"]
    assert {s["trace_id"] for s in there} == {trace_id}, "the worker's spans left the trace"
    first, second = [s for s in there if s["name"] == "run/traced.job"]
    assert first["parent_id"] == send["span_id"], "Celery's task span is the send's child"
    steps = [
        (
            s["attributes"][tracing.STEP_NAME],
            s["attributes"][tracing.POSITION],
            s["attributes"][tracing.ATTEMPT],
            s["attributes"][tracing.REPLAYED],
            s["parent_id"],
        )
        for s in there
        if s["name"] == tracing.STEP_SPAN
    ]
    assert steps == [
        ("fetch", 0, 1, False, first["span_id"]),
        ("fetch", 0, 1, True, second["span_id"]),  # the second delivery replays it
        ("store", 2, 1, False, second["span_id"]),
    ]


def test_a_failed_step_is_an_error_span_and_its_replay_is_marked(
    spans: InMemorySpanExporter, sqlite_url: str
) -> None:
    app = Celery("traced-eager", broker="memory://", set_as_current=False)
    crash: dict[str, Any] = {"on": True, "offset": timedelta(0)}
    durable = Durable(app, sqlite_url, clock=lambda: datetime.now(UTC) + crash["offset"])

    class Crash(BaseException):
        pass

    @durable.step(name="boom")
    def boom() -> None:
        raise ValueError("no disk")

    @durable.task(name="traced.failing")
    def failing() -> str:
        try:
            boom()
        except Exception as exc:
            if crash["on"]:
                raise Crash() from exc
            return type(exc).__name__
        return "unreachable"

    try:
        with pytest.raises(Crash):
            failing.apply(task_id="r1")
        crash["offset"] = timedelta(hours=1)  # the crashed delivery's claim has expired
        crash["on"] = False
        assert failing.apply(task_id="r1").get() == "StepFailed"
    finally:
        durable.close()
    ran, replayed = [s for s in spans.get_finished_spans() if s.name == tracing.STEP_SPAN]
    assert ran.attributes[tracing.REPLAYED] is False
    assert ran.status.status_code.name == "ERROR"
    assert [e.name for e in ran.events] == ["exception"]
    assert replayed.attributes[tracing.REPLAYED] is True
    assert replayed.attributes[tracing.ATTEMPT] == 1
    assert replayed.status.status_code.name == "ERROR"


def test_untraced_without_a_provider_the_message_carries_no_trace_context(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry import trace

    # as in a process where no provider was ever set (another test may have set one)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)
    monkeypatch.setattr(tracing._STATE, "chosen", None)
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert tracing.tracer() is None
    with tracing.sending("s", None, None, {"a": 1}) as headers:  # type: ignore[arg-type]
        assert headers == {"a": 1}


TICK_WITHOUT_OTEL = """
import sys
from datetime import datetime, timedelta, timezone

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ImportError(f"blocked: {name}")
        return None

sys.meta_path.insert(0, Block())
from celery import Celery
from celery_durable import Durable, Every
from celery_durable import tracing

now = [datetime(2026, 11, 2, 12, tzinfo=timezone.utc)]
app = Celery("blocked", broker="memory://", set_as_current=False)

@app.task(name="ping", shared=False)
def ping():
    return None

durable = Durable(app, sys.argv[1], clock=lambda: now[0])
durable.schedules.create("ping", "ping", None, Every(timedelta(seconds=1)))
dispatcher = durable.dispatcher()
dispatcher.tick()
now[0] += timedelta(seconds=1)
dispatcher.tick()
assert [r.state for r in durable.schedules.runs("ping")] == ["started"]
assert tracing.tracer() is None
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
assert not loaded, loaded
try:
    import opentelemetry.trace
except ImportError:
    pass
else:
    raise SystemExit("the blocker let opentelemetry in")
durable.close()
print("ok")
"""


def test_without_opentelemetry_nothing_is_imported_and_a_tick_runs(sqlite_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(TICK_WITHOUT_OTEL), sqlite_url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
