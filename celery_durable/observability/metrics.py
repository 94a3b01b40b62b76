"""Optional Prometheus metrics, fed by :mod:`.signals` (extra ``prometheus``).

``install_metrics()`` connects receivers to the signals the dispatcher sends and registers:

==========================================  =========  ==========  ===========================
name                                        type       labels      what
==========================================  =========  ==========  ===========================
``celery_durable_runs_decided_total``       counter    schedule    decisions stored
``celery_durable_runs_started_total``       counter    schedule    runs enqueued
``celery_durable_runs_skipped_total``       counter    schedule,   due times skipped: ``overlap``
                                                       reason      (D7) or ``blackout`` (P4)
``celery_durable_runs_failed_to_start_total`` counter  schedule    runs that can never be sent
``celery_durable_runs_missed_total``        counter    schedule    due times dropped by catch-up
``celery_durable_runs_late_total``          counter    schedule    runs decided late (O4)
``celery_durable_runs_deadline_missed_total`` counter  schedule    runs past their start deadline
``celery_durable_dispatch_lag_seconds``     histogram  —           due time → enqueue
``celery_durable_schedules``                gauge      state       schedules per state (when a
                                                                   ``Durable`` is given)
``celery_durable_lease_held``               gauge      —           1 while a dispatcher holds
                                                                   the lease (O3; with ``Durable``)
``celery_durable_lease_holder``             gauge      holder      1 for the holder
``celery_durable_lease_age_seconds``        gauge      —           since the holder took it
``celery_durable_last_tick_age_seconds``    gauge      —           since its last completed tick
``celery_durable_oldest_waiting_due_seconds`` gauge    —           how long the oldest due run
                                                                   has waited (0: none)
``celery_durable_partition_held``           gauge      partition   1 while a beat holds it (D10)
``celery_durable_partition_holder``         gauge      partition,  1 for each partition's holder
                                                       holder
==========================================  =========  ==========  ===========================

The signals are sent in the process that stores the events, normally ``celery beat``: install
the metrics there and expose them (``prometheus_client.start_http_server``). The schedules
gauge and the health gauges (the facts of ``celery durable health``, :mod:`.health`)
are computed when scraped, from the journal, at most every ``gauge_ttl`` seconds.

``prometheus_client`` is imported only by :func:`install_metrics`; without it a clear
``ImportError`` says which extra to install.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery_durable.observability import signals

if TYPE_CHECKING:
    from celery_durable.durable import Durable

__all__ = ["LAG_BUCKETS", "DurableMetrics", "install_metrics"]

LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
"""Seconds: on-time runs land below 1 s; beyond 60 s a run counts as missed (SPEC §4)."""

SCHEDULE_STATES = ("active", "paused", "deleted", "complete")

log = logging.getLogger("celery_durable.metrics")

_LOCK = threading.Lock()
_INSTALLED: dict[int, DurableMetrics] = {}
_SERIAL = itertools.count(1)


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ImportError(
            "celery_durable.observability.metrics needs prometheus-client: "
            "pip install 'celery-durable[prometheus]'"
        ) from None
    return prometheus_client


@dataclass(eq=False)
class DurableMetrics:
    """The metrics of one registry and the signal receivers that feed them."""

    registry: Any
    decided: Any
    started: Any
    skipped: Any
    failed_to_start: Any
    missed: Any
    lag: Any
    deadline_missed: Any = None
    late: Any = None
    _gauge: _SchedulesCollector | None = field(default=None, repr=False)
    _health: _HealthCollector | None = field(default=None, repr=False)
    _uid: str = field(default_factory=lambda: f"celery_durable.metrics.{next(_SERIAL)}")

    def track(self, durable: Durable, *, gauge_ttl: float = 30.0) -> None:
        """Export ``celery_durable_schedules{state}`` and the health gauges for ``durable``'s
        journal (once)."""
        if self._gauge is None:
            self._gauge = _SchedulesCollector(durable, gauge_ttl)
            self.registry.register(self._gauge)
        if self._health is None:
            self._health = _HealthCollector(durable, gauge_ttl)
            self.registry.register(self._health)

    # Receivers: Celery signals call them with the sender and keyword arguments ---------------

    def on_decided(self, sender: Any = None, schedule: str = "", **_: Any) -> None:
        self.decided.labels(schedule=schedule).inc()

    def on_started(
        self, sender: Any = None, schedule: str = "", lag: float | None = None, **_: Any
    ) -> None:
        self.started.labels(schedule=schedule).inc()
        if lag is not None:
            self.lag.observe(max(0.0, float(lag)))

    def on_skipped(
        self, sender: Any = None, schedule: str = "", reason: str = "", **_: Any
    ) -> None:
        self.skipped.labels(schedule=schedule, reason=skip_kind(reason)).inc()

    def on_failed_to_start(self, sender: Any = None, schedule: str = "", **_: Any) -> None:
        self.failed_to_start.labels(schedule=schedule).inc()

    def on_missed(
        self, sender: Any = None, schedule: str = "", count: int | None = None, **_: Any
    ) -> None:
        # ``count`` is None when too many were dropped to count: record at least one.
        self.missed.labels(schedule=schedule).inc(count if count else 1)

    def on_late(self, sender: Any = None, schedule: str = "", **_: Any) -> None:
        if self.late is not None:
            self.late.labels(schedule=schedule).inc()

    def on_deadline_missed(self, sender: Any = None, schedule: str = "", **_: Any) -> None:
        if self.deadline_missed is not None:
            self.deadline_missed.labels(schedule=schedule).inc()

    def connect(self) -> None:
        uid = self._uid
        signals.run_deadline_missed.connect(self.on_deadline_missed, weak=False, dispatch_uid=uid)
        signals.run_decided.connect(self.on_decided, weak=False, dispatch_uid=uid)
        signals.run_started.connect(self.on_started, weak=False, dispatch_uid=uid)
        signals.run_skipped.connect(self.on_skipped, weak=False, dispatch_uid=uid)
        signals.run_failed_to_start.connect(self.on_failed_to_start, weak=False, dispatch_uid=uid)
        signals.runs_missed.connect(self.on_missed, weak=False, dispatch_uid=uid)
        signals.run_late.connect(self.on_late, weak=False, dispatch_uid=uid)

    def disconnect(self) -> None:
        """Stop feeding the metrics (they stay registered); ``install_metrics`` starts anew."""
        self.disconnect_signals()
        with _LOCK:
            if _INSTALLED.get(id(self.registry)) is self:
                del _INSTALLED[id(self.registry)]

    def disconnect_signals(self) -> None:
        uid = self._uid
        for signal in (
            signals.run_decided,
            signals.run_started,
            signals.run_skipped,
            signals.run_failed_to_start,
            signals.runs_missed,
            signals.run_deadline_missed,
            signals.run_late,
        ):
            signal.disconnect(dispatch_uid=uid)


class _ScrapedCollector:
    """A collector whose value is read from the journal when scraped, at most every ``ttl`` s."""

    def __init__(self, durable: Durable, ttl: float) -> None:
        self._durable = durable
        self._ttl = ttl
        self._at = float("-inf")
        self._value: Any = None
        self._lock = threading.Lock()

    def describe(self) -> list[Any]:
        # Returning no description keeps registration from calling collect() (no I/O then).
        return []

    def _read(self) -> Any:
        raise NotImplementedError

    def _current(self) -> Any:
        with self._lock:
            if time.monotonic() - self._at >= self._ttl:
                self._value = self._read()
                self._at = time.monotonic()
            return self._value


class _SchedulesCollector(_ScrapedCollector):
    """``celery_durable_schedules{state}``, counted from the journal when scraped."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        counts = self._current()
        family = GaugeMetricFamily(
            "celery_durable_schedules", "Durable schedules by state.", labels=["state"]
        )
        for state in SCHEDULE_STATES:
            family.add_metric([state], counts[state])
        yield family

    def _read(self) -> dict[str, int]:
        counts = dict.fromkeys(SCHEDULE_STATES, 0)
        for view in self._durable.schedules.list(include_deleted=True):
            if view.deleted:
                counts["deleted"] += 1
            elif view.paused:
                counts["paused"] += 1
            elif view.complete:
                counts["complete"] += 1
            else:
                counts["active"] += 1
        return counts


class _HealthCollector(_ScrapedCollector):
    """The facts of ``celery durable health`` (O3) as gauges, read from the journal when scraped.

    A journal that cannot be read yields no sample (alert on ``absent(...)``), not a zero that
    would read as "no dispatcher".
    """

    def _read(self) -> Any:
        from celery_durable.observability.health import check

        try:
            return check(self._durable.runtime)
        except Exception:
            log.warning("health gauges: cannot read the journal", exc_info=True)
            return None

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        facts = self._current()
        if facts is None:
            return
        holder = facts.holder
        yield GaugeMetricFamily(
            "celery_durable_lease_held",
            "1 while a dispatcher holds the lease, else 0.",
            value=0 if holder is None else 1,
        )
        holders = GaugeMetricFamily(
            "celery_durable_lease_holder", "The dispatcher holding the lease.", labels=["holder"]
        )
        if holder is not None:
            holders.add_metric([holder], 1)
        yield holders
        for name, text, value in (
            ("lease_age_seconds", "Seconds since the holder took the lease.", facts.lease_age),
            (
                "last_tick_age_seconds",
                "Seconds since the holder's last completed tick (stored with lease renewals).",
                facts.tick_age,
            ),
        ):
            if value is not None:
                yield GaugeMetricFamily(f"celery_durable_{name}", text, value=value)
        held = GaugeMetricFamily(
            "celery_durable_partition_held",
            "1 while a beat holds the partition's lease, else 0 (D10, D11).",
            labels=["partition"],
        )
        by_holder = GaugeMetricFamily(
            "celery_durable_partition_holder",
            "1 for the beat holding each partition.",
            labels=["partition", "holder"],
        )
        for k in range(facts.partitions):
            owner = facts.holders.get(k)
            held.add_metric([str(k)], 0 if owner is None else 1)
            if owner is not None:
                by_holder.add_metric([str(k), owner], 1)
        yield held
        yield by_holder
        yield GaugeMetricFamily(
            "celery_durable_oldest_waiting_due_seconds",
            "Seconds the oldest due run not yet sent has waited (0: none waits).",
            value=facts.lag,
        )


def skip_kind(reason: str) -> str:
    """The ``reason`` label of a skipped due time: ``blackout`` (P4: the stored reason is
    ``blackout <name>``; the name stays out of the label, whose values stay few) or
    ``overlap`` (D7)."""
    return "blackout" if reason.startswith("blackout") else "overlap"


def install_metrics(
    registry: Any = None, *, durable: Durable | None = None, gauge_ttl: float = 30.0
) -> DurableMetrics:
    """Register the metrics in ``registry`` (default: Prometheus' global registry) and feed
    them from the signals. Idempotent: a second call for the same registry returns the same
    :class:`DurableMetrics` (adding the schedules gauge the first time ``durable`` is given).
    """
    prometheus = _prometheus()
    if registry is None:
        registry = prometheus.REGISTRY
    with _LOCK:
        metrics = _INSTALLED.get(id(registry))
        if metrics is not None and metrics.registry is not registry:
            metrics.disconnect_signals()  # a registry that is gone; its id was reused
            metrics = None
        if metrics is None:
            labels = ["schedule"]
            counter = prometheus.Counter
            metrics = DurableMetrics(
                registry=registry,
                decided=counter(
                    "celery_durable_runs_decided",
                    "Runs decided (stored before they are enqueued).",
                    labels,
                    registry=registry,
                ),
                started=counter(
                    "celery_durable_runs_started", "Runs enqueued.", labels, registry=registry
                ),
                skipped=counter(
                    "celery_durable_runs_skipped",
                    "Due times skipped: by the overlap policy (reason=overlap) or a blackout "
                    "window (reason=blackout).",
                    ["schedule", "reason"],
                    registry=registry,
                ),
                failed_to_start=counter(
                    "celery_durable_runs_failed_to_start",
                    "Decided runs that can never be enqueued.",
                    labels,
                    registry=registry,
                ),
                missed=counter(
                    "celery_durable_runs_missed",
                    "Due times dropped by the catch-up policy.",
                    labels,
                    registry=registry,
                ),
                deadline_missed=counter(
                    "celery_durable_runs_deadline_missed",
                    "Runs that never started by their start deadline (P1).",
                    labels,
                    registry=registry,
                ),
                late=counter(
                    "celery_durable_runs_late",
                    "Runs decided more than durable_late_after after their due time (O4).",
                    labels,
                    registry=registry,
                ),
                lag=prometheus.Histogram(
                    "celery_durable_dispatch_lag_seconds",
                    "Seconds from a run's due time to its enqueue.",
                    buckets=LAG_BUCKETS,
                    registry=registry,
                ),
            )
            metrics.connect()
            _INSTALLED[id(registry)] = metrics
    if durable is not None:
        metrics.track(durable, gauge_ttl=gauge_ttl)
    return metrics
