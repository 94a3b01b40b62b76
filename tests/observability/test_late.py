"""Late and missed runs (O4): counted per schedule, logged and signalled with schedule, due and
lateness; ``durable_late_after``; a catch-up window's drops (P3) counted too."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from prometheus_client import CollectorRegistry

from celery_durable import CatchUp, Durable, Every
from celery_durable.observability import signals
from celery_durable.observability.metrics import install_metrics
from tests.support.clock import T0, FakeClock


def make_durable(url: str, clock: FakeClock, **conf: Any) -> Durable:
    app = Celery("late_tests", broker="memory://", set_as_current=False)
    app.conf.update(conf)

    @app.task(name="report", shared=False)
    def report(*_: object) -> None:  # pragma: no cover - never consumed
        return None

    return Durable(app, url, clock=clock)


@pytest.fixture
def heard() -> Iterator[dict[str, list[dict[str, Any]]]]:
    found: dict[str, list[dict[str, Any]]] = {"late": [], "missed": []}

    def on_late(sender: object = None, **fields: Any) -> None:
        found["late"].append(fields)

    def on_missed(sender: object = None, **fields: Any) -> None:
        found["missed"].append(fields)

    signals.run_late.connect(on_late, weak=False, dispatch_uid="test-late")
    signals.runs_missed.connect(on_missed, weak=False, dispatch_uid="test-missed")
    yield found
    signals.run_late.disconnect(dispatch_uid="test-late")
    signals.runs_missed.disconnect(dispatch_uid="test-missed")


def test_late_and_dropped_runs_are_counted_logged_and_signalled(
    sqlite_url: str, heard: dict[str, list[dict[str, Any]]], caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    durable = make_durable(sqlite_url, clock)
    registry = CollectorRegistry()
    metrics = install_metrics(registry)
    try:
        durable.schedules.create("ten", "report", None, Every(timedelta(minutes=10)))
        durable.schedules.create(
            "all", "report", None, Every(timedelta(minutes=10)), CatchUp.ALL,
            catch_up_window=timedelta(minutes=25),
        )  # fmt: skip
        dispatcher = durable.dispatcher(lease_ttl=3600)
        dispatcher.tick()
        clock.advance(minutes=10, seconds=30)  # 30 s late: on time (durable_late_after = 60 s)
        dispatcher.tick()
        assert heard["late"] == [] and heard["missed"] == []
        clock.advance(minutes=50)  # down: due 12:20 … 13:00, reached at 13:00:30
        with caplog.at_level(logging.WARNING, logger="celery_durable.dispatcher"):
            dispatcher.tick()
        dispatcher.close()
        late = sorted((h["schedule"], h["due"], h["lateness"]) for h in heard["late"])
        # LATEST keeps 13:00 (30 s late: on time); ALL within 25 min keeps 12:40 … 13:00.
        assert late == [
            ("all", T0 + timedelta(minutes=40), 20 * 60 + 30.0),
            ("all", T0 + timedelta(minutes=50), 10 * 60 + 30.0),
        ]
        assert all(h["run_id"].startswith("all@") for h in heard["late"])
        missed = {h["schedule"]: h for h in heard["missed"]}
        assert missed["ten"]["count"] == 4 and missed["ten"]["through"] < T0 + timedelta(hours=1)
        assert missed["all"]["count"] == 2  # 12:20 and 12:30: older than the window (P3)
        assert missed["all"]["lateness"] > 25 * 60
        value = registry.get_sample_value
        assert value("celery_durable_runs_late_total", {"schedule": "all"}) == 2
        assert value("celery_durable_runs_late_total", {"schedule": "ten"}) is None
        assert value("celery_durable_runs_missed_total", {"schedule": "ten"}) == 4
        assert value("celery_durable_runs_missed_total", {"schedule": "all"}) == 2
        lines = [r for r in caplog.records if "(late)" in r.getMessage()]
        assert len(lines) == 2 and all(r.levelno == logging.WARNING for r in lines)
        assert lines[0].schedule == "all" and lines[0].lateness > 60  # type: ignore[attr-defined]
        assert "decided 1230.0s after its due time 2026-11-02T12:40:00" in lines[0].getMessage()
    finally:
        metrics.disconnect()
        durable.close()


def test_late_after_is_a_setting_and_backfills_are_never_late(
    sqlite_url: str, heard: dict[str, list[dict[str, Any]]]
) -> None:
    clock = FakeClock()
    durable = make_durable(sqlite_url, clock, durable_late_after=5)
    try:
        assert durable.config.late_after == 5
        durable.schedules.create("m", "report", None, Every(timedelta(minutes=1)))
        dispatcher = durable.dispatcher(lease_ttl=3600)
        dispatcher.tick()
        clock.advance(minutes=1, seconds=6)
        dispatcher.tick()
        assert [round(h["lateness"]) for h in heard["late"]] == [6]
        durable.schedules.backfill("m", T0 - timedelta(minutes=3), T0)
        dispatcher.tick()
        assert len(heard["late"]) == 1
        dispatcher.close()
    finally:
        durable.close()


def test_a_bad_late_after_is_refused(sqlite_url: str) -> None:
    from celery_durable.config import ConfigError

    with pytest.raises(ConfigError, match="durable_late_after must be positive"):
        make_durable(sqlite_url, FakeClock(), durable_late_after=0).config  # noqa: B018


@pytest.mark.parametrize(
    ("key", "bad"),
    [
        ("durable_late_after", float("nan")),
        ("durable_leader_lease", float("inf")),
        ("durable_leader_lease", 1e300),
        ("durable_run_lease", float("inf")),
        ("durable_check_interval", 1e300),
        ("durable_poll_interval", float("inf")),
        ("durable_short_sleep", float("inf")),
        ("durable_max_input_bytes", float("inf")),
        ("durable_max_input_bytes", 1.5),
    ],
)
def test_a_setting_no_date_can_hold_is_refused_naming_it(key: str, bad: float) -> None:
    """O3: leases and intervals are added to dates; a value no date can hold is a
    ConfigError when the settings are read, not an OverflowError at a tick (nor, for a byte
    count, at ``int()``)."""
    from celery_durable.config import ConfigError, DurableConfig

    with pytest.raises(ConfigError, match=key):
        DurableConfig.from_app({key: bad})


def test_the_view_says_since_when_a_schedule_waits(sqlite_url: str) -> None:
    clock = FakeClock()
    durable = make_durable(sqlite_url, clock)
    try:
        durable.schedules.create("w", "report", None, Every(timedelta(minutes=1)))
        view = durable.schedules.state("w")
        assert view is not None and view.waiting_since(clock.now) is None
        clock.advance(minutes=3)
        view = durable.schedules.state("w")
        assert view is not None and view.waiting_since(clock.now) == T0 + timedelta(minutes=1)
    finally:
        durable.close()
