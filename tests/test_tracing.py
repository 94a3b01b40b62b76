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
        tracing.OUTCOME: "decided",
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
            s["attributes"][tracing.STEP_KIND],
            s["attributes"][tracing.POSITION],
            s["attributes"][tracing.ATTEMPT],
            s["attributes"][tracing.REPLAYED],
            s["parent_id"],
        )
        for s in there
        if s["name"] == tracing.STEP_SPAN
    ]
    assert steps == [
        ("fetch", "step", 0, 1, False, first["span_id"]),
        ("sleep", "sleep", 1, 1, False, first["span_id"]),  # gives the worker back
        ("fetch", "step", 0, 1, True, second["span_id"]),  # the second delivery replays it
        ("sleep", "sleep", 1, 1, False, second["span_id"]),  # over: nothing more is stored
        ("store", "step", 2, 1, False, second["span_id"]),
    ]
    [suspended] = [s for s in there if s["attributes"].get(tracing.SUSPENDED)]
    assert (suspended["attributes"][tracing.STEP_KIND], suspended["parent_id"]) == (
        "sleep",
        first["span_id"],
    )


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


BLOCK_OTEL = """
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ImportError(f"blocked: {name}")
        return None

sys.meta_path.insert(0, Block())
"""

TICK_WITHOUT_OTEL = (
    BLOCK_OTEL
    + """
from datetime import datetime, timedelta, timezone
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
)


def run_blocked(script: str, url: str) -> None:
    """Run ``script`` in a fresh interpreter (OpenTelemetry blocked there); it prints ok."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_without_opentelemetry_nothing_is_imported_and_a_tick_runs(sqlite_url: str) -> None:
    run_blocked(TICK_WITHOUT_OTEL, sqlite_url)


def test_every_kind_of_position_has_a_span_and_replay_marks_them(
    spans: InMemorySpanExporter, celery_app: Celery, sqlite_url: str
) -> None:
    """``now``, ``uuid4``, ``random``, ``sleep``, ``wait_signal``, ``parallel`` (each branch
    too, its steps under it) and the child-run calls each get a span with their position,
    kind and whether the journal answered them; a second delivery replays them."""
    from celery_durable import now, parallel, random, sleep, uuid4, wait_signal
    from celery_durable.testing import DurableHarness, TestClock
    from tests.support.clock import T0

    with DurableHarness(celery_app, sqlite_url, clock=TestClock(T0)) as durable:
        durable.start()

        @durable.step(name="part")
        def part(x: int) -> int:
            return x

        @durable.task(name="traced.kid")
        def kid(x: int) -> int:
            return part(x)

        @durable.task(name="traced.all")
        def everything() -> list[Any]:
            stamp, ident, luck = now(), uuid4(), random()
            sleep(0.01)
            payload = wait_signal("go", timeout=60)
            both = parallel(lambda: part(1), lambda: part(2))
            handle = durable.start_child(kid, 3)
            return [str(stamp), str(ident), luck, payload, both, durable.wait_child(handle)]

        everything.apply_async(task_id="all-1")
        durable.run_until_idle()
        durable.signal("all-1", "go", "ready")
        durable.run_until_idle()
        assert durable.result("all-1")[3:] == ["ready", [1, 2], 3]
        first_pass = len(spans.get_finished_spans())
        everything.apply_async(task_id="all-1")  # a redelivery of the finished run: no body
        durable.run_until_idle()
    records = [span_record(s) for s in spans.get_finished_spans()[:first_pass]]
    ours = [r for r in records if r["name"] == tracing.STEP_SPAN]
    parent = [
        (
            r["attributes"][tracing.STEP_KIND],
            r["attributes"][tracing.POSITION],
            r["attributes"][tracing.STEP_NAME],
        )
        for r in ours
        if r["attributes"][tracing.RUN_ID] == "all-1"
    ]
    for expected in [
        ("now", 0, "now"),
        ("uuid4", 1, "uuid4"),
        ("random", 2, "random"),
        ("sleep", 3, "sleep"),
        ("signal", 4, "go"),
        ("parallel", 5, "parallel"),
        ("branch", "5.0", "branch"),
        ("branch", "5.1", "branch"),
        ("step", "5.0.0", "part"),
        ("step", "5.1.0", "part"),
        ("child", 6, "traced.kid"),
    ]:
        assert expected in parent, expected
    assert sum(1 for k, p, _ in parent if (k, p) == ("child", 6)) >= 2  # start, then wait
    by_id = {r["span_id"]: r for r in records}
    branch_steps = [r for r in ours if r["attributes"][tracing.POSITION] in ("5.0.0", "5.1.0")]
    for step in branch_steps:  # a branch's steps are children of its branch span
        branch = by_id[step["parent_id"]]
        assert branch["attributes"][tracing.STEP_KIND] == "branch"
        assert by_id[branch["parent_id"]]["attributes"][tracing.STEP_KIND] == "parallel"
    # The body ran more than once (the sleep, the signal, the child gave the worker back):
    # positions answered by the journal on a later delivery are marked replayed.
    replayed = {
        r["attributes"][tracing.STEP_KIND]
        for r in ours
        if r["attributes"][tracing.RUN_ID] == "all-1" and r["attributes"][tracing.REPLAYED]
    }
    assert {"now", "uuid4", "random", "signal", "step"} <= replayed
    kid_steps = [r for r in ours if r["attributes"][tracing.RUN_ID] == "all-1:6"]
    assert [r["attributes"][tracing.STEP_NAME] for r in kid_steps] == ["part"]


def test_a_skipped_due_time_has_a_decision_span_with_its_outcome(
    spans: InMemorySpanExporter, sqlite_url: str
) -> None:
    """P4, D7: a due time skipped by a blackout window gets a decision span whose outcome and
    reason say so; a deferred one says deferred; neither has a send span."""
    from celery_durable import Blackout

    clock = FakeClock(datetime(2026, 11, 2, 12, tzinfo=UTC))
    app = Celery("traced-skip", broker="memory://", set_as_current=False)
    app.task(name="tick", shared=False)(_tick)
    durable = Durable(app, sqlite_url, clock=clock)
    try:
        t0 = clock.now
        freeze = Blackout.between("freeze", t0 + timedelta(seconds=5), t0 + timedelta(seconds=25))
        every = Every(timedelta(seconds=10))
        durable.schedules.create("skip", "tick", None, every, blackouts=[freeze])
        durable.schedules.create(
            "defer", "tick", None, every, blackouts=[freeze], on_blackout="defer"
        )
        dispatcher = durable.dispatcher()
        for seconds in (0, 10):
            clock.now = t0 + timedelta(seconds=seconds)
            dispatcher.tick()
        dispatcher.close()
    finally:
        durable.close()
    decisions = {
        s.attributes[tracing.SCHEDULE]: dict(s.attributes)
        for s in spans.get_finished_spans()
        if s.name == tracing.DECIDE_SPAN
    }
    assert decisions["skip"][tracing.OUTCOME] == "skipped"
    assert decisions["skip"][tracing.REASON] == "blackout freeze"
    assert decisions["skip"][tracing.RUN_ID] == "skip@2026-11-02T12:00:10.0000000Z"
    assert decisions["defer"][tracing.OUTCOME] == "deferred"
    assert not [s for s in spans.get_finished_spans() if s.name == tracing.SEND_SPAN]


def _tick() -> None:  # pragma: no cover - never consumed
    return None


STEPS_WITHOUT_OTEL = (
    BLOCK_OTEL
    + """
from celery import Celery
from celery_durable import Durable, now, parallel, random, sleep, tracing, uuid4

app = Celery("blocked-steps", broker="memory://", set_as_current=False)
durable = Durable(app, sys.argv[1])

@durable.step(name="inc")
def inc(x):
    return x + 1

@durable.task(name="steps")
def steps():
    now(); uuid4(); random(); sleep(0)
    return parallel(lambda: inc(1), lambda: inc(2)) + [inc(3)]

assert steps.apply(task_id="r1").get() == [2, 3, 4]
assert steps.apply(task_id="r1").get() == [2, 3, 4]  # replayed
assert tracing.tracer() is None
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
assert not loaded, loaded
durable.close()
print("ok")
"""
)


def test_without_opentelemetry_nothing_is_imported_by_the_worker_and_step_path(
    sqlite_url: str,
) -> None:
    run_blocked(STEPS_WITHOUT_OTEL, sqlite_url)
