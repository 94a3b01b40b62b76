"""Prometheus metrics fed by the dispatcher's signals (celery_durable.observability.metrics)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from celery import Celery
from prometheus_client import CollectorRegistry  # the 'prometheus' extra (in 'test' too)

from celery_durable import CatchUp, Durable, Every, Overlap
from celery_durable.observability import signals
from celery_durable.observability.metrics import install_metrics

UTC = timezone.utc
T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def app() -> Celery:
    # kombu's in-memory transport: the dispatcher enqueues for real, nothing consumes.
    app = Celery("metrics_tests", broker="memory://", set_as_current=False)

    @app.task(name="report", shared=False)
    def report(*_: object) -> None:  # pragma: no cover - never consumed
        return None

    return app


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    registry = CollectorRegistry()
    yield registry
    install_metrics(registry).disconnect()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_counters_move_when_runs_are_decided_started_and_skipped(
    durable: Durable, clock: FakeClock, registry: CollectorRegistry
) -> None:
    install_metrics(registry)
    durable.schedules.create(
        "tidy", "report", None, Every(timedelta(seconds=10)), CatchUp.ALL, overlap=Overlap.SKIP
    )
    durable.schedules.create("ping", "report", None, Every(timedelta(seconds=10)))
    dispatcher = durable.dispatcher()
    dispatcher.tick()
    assert value(registry, "celery_durable_runs_decided_total", schedule="tidy") == 0

    clock.now += timedelta(seconds=10)
    dispatcher.tick()
    for sid in ("tidy", "ping"):
        assert value(registry, "celery_durable_runs_decided_total", schedule=sid) == 1
        assert value(registry, "celery_durable_runs_started_total", schedule=sid) == 1

    # The first run of "tidy" never ends (nothing consumes it): SKIP records the next due time.
    clock.now += timedelta(seconds=10)
    dispatcher.tick()
    assert (
        value(registry, "celery_durable_runs_skipped_total", schedule="tidy", reason="overlap") == 1
    )
    assert value(registry, "celery_durable_runs_started_total", schedule="tidy") == 1
    assert value(registry, "celery_durable_runs_started_total", schedule="ping") == 2
    assert value(registry, "celery_durable_dispatch_lag_seconds_count") == 3
    assert value(registry, "celery_durable_runs_failed_to_start_total", schedule="tidy") == 0


def test_lag_histogram_records_a_late_run(
    durable: Durable, clock: FakeClock, registry: CollectorRegistry
) -> None:
    install_metrics(registry)
    durable.schedules.create("late", "report", None, Every(timedelta(minutes=10)), CatchUp.LATEST)
    dispatcher = durable.dispatcher()
    dispatcher.tick()
    clock.now += timedelta(minutes=10, seconds=45)  # the dispatcher was away: 45 s late
    dispatcher.tick()
    assert value(registry, "celery_durable_dispatch_lag_seconds_count") == 1
    assert value(registry, "celery_durable_dispatch_lag_seconds_sum") == pytest.approx(45)
    assert value(registry, "celery_durable_dispatch_lag_seconds_bucket", le="30.0") == 0
    assert value(registry, "celery_durable_dispatch_lag_seconds_bucket", le="60.0") == 1


def test_install_is_idempotent_and_gauge_counts_schedules_by_state(
    durable: Durable, clock: FakeClock, registry: CollectorRegistry
) -> None:
    first = install_metrics(registry, durable=durable, gauge_ttl=0)
    assert install_metrics(registry, durable=durable) is first
    for sid in ("a", "b", "c", "d"):
        durable.schedules.create(sid, "report", None, Every(timedelta(seconds=10)))
    durable.schedules.pause("b")
    durable.schedules.delete("c")
    durable.schedules.create("once", "report", None, Every(timedelta(seconds=10), max_runs=1))
    dispatcher = durable.dispatcher()
    clock.now += timedelta(seconds=10)
    dispatcher.tick()  # "once" decides its only run and completes
    counts = {
        state: value(registry, "celery_durable_schedules", state=state)
        for state in ("active", "paused", "deleted", "complete")
    }
    assert counts == {"active": 2, "paused": 1, "deleted": 1, "complete": 1}
    # Installed twice, fed once: one decision counts once.
    assert value(registry, "celery_durable_runs_decided_total", schedule="a") == 1


def test_missing_prometheus_client_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"celery-durable\[prometheus\]"):
        install_metrics(CollectorRegistry())


def test_the_signal_example_of_docs_observability_md_receives_the_started_run(
    durable: Durable, clock: FakeClock
) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    receiver_py, metrics_py = re.findall(r"^```python\n(.*?)^```", doc, re.M | re.S)
    compile(metrics_py, "docs/observability.md metrics", "exec")
    alerts: list[str] = []
    namespace = {"alert": alerts.append}
    exec(compile(receiver_py, "docs/observability.md signals", "exec"), namespace)
    try:
        durable.schedules.create("late", "report", None, Every(timedelta(minutes=10)))
        dispatcher = durable.dispatcher()
        dispatcher.tick()
        clock.now += timedelta(minutes=11, seconds=30)
        dispatcher.tick()
    finally:
        signals.run_started.disconnect(namespace["on_started"])
    assert alerts == ["late@2026-11-02T12:10:00.0000000Z started 90 s late"]


def test_a_missed_start_deadline_is_counted_and_signalled(
    durable: Durable, clock: FakeClock, registry: CollectorRegistry
) -> None:
    from celery_durable.core.schedule_aggregate import MarkMissed
    from celery_durable.worker.run_ends import MISSED_IN_QUEUE

    install_metrics(registry)
    heard: list[dict] = []

    def receiver(sender: object = None, **fields: object) -> None:
        heard.append(fields)

    signals.run_deadline_missed.connect(receiver, weak=False, dispatch_uid="test-deadline")
    try:
        durable.schedules.create(
            "d", "report", None, Every(timedelta(seconds=10)), start_deadline=5
        )
        dispatcher = durable.dispatcher()
        dispatcher.tick()
        clock.now += timedelta(seconds=10)
        dispatcher.tick()
        [run] = durable.schedules.runs("d")
        clock.now += timedelta(seconds=6)
        # What the worker stores when the message reaches it after the deadline (P1).
        durable._store.execute(
            "d", lambda now: MarkMissed(due=run.due, reason=MISSED_IN_QUEUE, now=now, sent=True)
        )
    finally:
        signals.run_deadline_missed.disconnect(dispatch_uid="test-deadline")
    assert value(registry, "celery_durable_runs_deadline_missed_total", schedule="d") == 1
    assert heard == [
        {"schedule": "d", "run_id": run.run_id, "due": run.due, "reason": MISSED_IN_QUEUE,
         "signal": signals.run_deadline_missed}
    ]  # fmt: skip


def test_a_blackout_skip_is_counted_with_its_reason_and_signalled(
    durable: Durable, clock: FakeClock, registry: CollectorRegistry
) -> None:
    """O4, P4: a due time inside a blackout window is counted as skipped with the label
    ``reason="blackout"`` (not with the overlap skips) and sends ``run_skipped``."""
    from celery_durable import Blackout

    install_metrics(registry)
    heard: list[dict] = []

    def receiver(sender: object = None, **fields: object) -> None:
        heard.append(fields)

    signals.run_skipped.connect(receiver, weak=False, dispatch_uid="test-blackout-skip")
    try:
        freeze = Blackout.between("freeze", T0 + timedelta(seconds=5), T0 + timedelta(seconds=15))
        durable.schedules.create(
            "b", "report", None, Every(timedelta(seconds=10)), blackouts=[freeze]
        )
        dispatcher = durable.dispatcher()
        dispatcher.tick()
        clock.now += timedelta(seconds=10)
        dispatcher.tick()
    finally:
        signals.run_skipped.disconnect(dispatch_uid="test-blackout-skip")
    skipped = "celery_durable_runs_skipped_total"
    assert value(registry, skipped, schedule="b", reason="blackout") == 1
    assert value(registry, skipped, schedule="b", reason="overlap") == 0
    assert value(registry, "celery_durable_runs_started_total", schedule="b") == 0
    due = T0 + timedelta(seconds=10)
    assert heard == [
        {"schedule": "b", "run_id": "b@2026-11-02T12:00:10.0000000Z", "due": due,
         "reason": "blackout freeze", "signal": signals.run_skipped}
    ]  # fmt: skip
