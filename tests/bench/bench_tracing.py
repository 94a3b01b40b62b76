"""Cost of tracing durable steps: the step benchmark with tracing off and on, in one run.

The durable task of ``bench_steps.py`` (a body of ``--steps`` journaled steps, run through
``task.apply()``) on each database (SQLite with ``synchronous=FULL``, the default, and
``NORMAL``; PostgreSQL), alternating repetitions:

* ``off`` -- ``opentelemetry-api`` installed, no tracer provider configured (the default of an
  application that has not set one up): no span is made;
* ``on``  -- an SDK ``TracerProvider`` with a ``BatchSpanProcessor`` (what production uses)
  whose exporter drops the spans, so the figure is the library's and the SDK's cost, not a
  collector's; one span per step.

Measured in the same run, two floors: a bare SDK span (start, end) with as many attributes as a
step span, without celery_durable, in a loop of its own; and ``bare``, the step loop with
tracing off and such a span made around each step with the SDK's own idiom
(``start_as_current_span``: current while the step runs, as ours is) -- the SDK's cost in situ,
against which ``on`` shows celery_durable's own part.

Reports per-step wall time (median of the per-step latencies and the whole run per step) and
the process's CPU seconds per run (the batch processor's thread included), the spread of the
CPU figures (lowest and highest run), the garbage collections per run, and the ratios on/off.
Target: on/off <= 1.10 (docs/tracing.md). ``--no-gc`` turns Python's collector off during the
runs, to tell the spans' own cost from the collections their queued objects cause.

Usage::

    python tests/bench/bench_tracing.py [--steps 1000] [--reps 5] [--no-gc]
        [--backends sqlite_full sqlite_normal postgres]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for entry in (str(HERE), str(HERE.parents[1])):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from bench_steps import DEFAULT_PG, build_app, drop_pg_schema, fresh_pg_schema  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import (  # noqa: E402
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

from celery_durable import tracing  # noqa: E402


class Dropping(SpanExporter):
    """Counts the spans it is handed and keeps none."""

    def __init__(self) -> None:
        self.count = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.count += len(spans)
        return SpanExportResult.SUCCESS


def one_run(task: Any, latencies: list[float], steps: int, collect: bool) -> dict[str, float]:
    latencies.clear()
    if not collect:
        gc.disable()
    collections = sum(g["collections"] for g in gc.get_stats())
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        task.apply((steps,), task_id=f"run-{uuid.uuid4()}").get()
    finally:
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        gc.enable()
    return {
        "step_median_us": statistics.median(latencies) * 1e6,
        "wall_per_step_us": wall / steps * 1e6,
        "cpu_per_step_us": cpu / steps * 1e6,
        "gc_runs": sum(g["collections"] for g in gc.get_stats()) - collections,
        "wall_s": wall,
        "cpu_s": cpu,
    }


def sdk_floor(provider: Any, n: int) -> dict[str, float]:
    """The SDK's own cost: ``n`` bare spans with as many attributes as a step span."""
    tracer = provider.get_tracer("floor")
    attributes = {"a": "fetch", "b": "step", "c": "run-1", "d": 0}
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for i in range(n):
        span = tracer.start_span("floor", attributes={**attributes, "e": 1, "f": bool(i & 1)})
        span.end()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {"wall_per_span_us": wall / n * 1e6, "cpu_per_span_us": cpu / n * 1e6}


def bare_span(provider: Any) -> Any:
    """``around`` for the in-situ floor: the SDK's own idiom, ``start_as_current_span``, with a
    step span's attributes, around the untraced step."""
    tracer = provider.get_tracer("bare")

    def span(i: int) -> Any:
        return tracer.start_as_current_span(
            "bare",
            attributes={"a": "work", "b": "step", "c": "run-1", "d": i, "e": 1, "f": False},
        )

    return span


def bench_backend(
    url: str, synchronous: str, steps: int, reps: int, collect: bool = True
) -> dict[str, list[dict[str, float]]]:
    around: dict[str, Any] = {}
    durable, task, _crash, latencies = build_app(url, synchronous, around)
    exporter = Dropping()
    provider = TracerProvider()
    processor = BatchSpanProcessor(exporter, max_queue_size=max(4096, steps * 2))
    provider.add_span_processor(processor)
    task.apply((50,), task_id=f"warm-{uuid.uuid4()}").get()
    rows: dict[str, list[dict[str, float]]] = {"off": [], "on": [], "bare": [], "floor": []}
    hand_made = bare_span(provider)
    for rep in range(reps):
        rows["floor"].append(sdk_floor(provider, steps))
        modes = ("off", "on", "bare")
        for mode in modes if rep % 2 == 0 else modes[::-1]:
            tracing.use_tracer_provider(provider if mode == "on" else None)
            around["span"] = hand_made if mode == "bare" else None
            row = one_run(task, latencies, steps, collect)
            if mode != "off":
                processor.force_flush()
            rows[mode].append(row)
    around["span"] = None
    tracing.use_tracer_provider(None)
    provider.shutdown()
    durable.close()
    expected = 2 * reps * steps
    assert exporter.count >= expected, f"{exporter.count} spans for {expected} traced steps"
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pg-url", default=os.environ.get("CELERY_DURABLE_TEST_PG_URL", DEFAULT_PG))
    ap.add_argument("--backends", nargs="+", default=["sqlite_full", "sqlite_normal", "postgres"])
    ap.add_argument("--no-gc", action="store_true", help="Python's collector off during runs")
    a = ap.parse_args()
    collect = not a.no_gc
    directory = tempfile.mkdtemp(prefix="bench_tracing_")
    print(f"{'backend':14s} {'metric':18s} {'off':>9s} {'on':>9s} {'on/off':>7s} {'bare':>9s}")
    for kind in a.backends:
        if kind == "postgres":
            url, schema = fresh_pg_schema(a.pg_url)
            try:
                rows = bench_backend(url, "FULL", a.steps, a.reps, collect)
            finally:
                drop_pg_schema(a.pg_url, schema)
        else:
            url = f"sqlite:///{os.path.join(directory, kind + '.db')}"
            synchronous = "NORMAL" if kind == "sqlite_normal" else "FULL"
            rows = bench_backend(url, synchronous, a.steps, a.reps, collect)
        for metric in ("step_median_us", "wall_per_step_us", "cpu_per_step_us", "gc_runs"):
            off, on, bare = (
                statistics.median(r[metric] for r in rows[mode]) for mode in ("off", "on", "bare")
            )
            ratio = f"{on / off:7.3f}" if off else "      -"
            print(f"{kind:14s} {metric:18s} {off:9.1f} {on:9.1f} {ratio} {bare:9.1f}")
        spread = {
            mode: (
                min(r["cpu_per_step_us"] for r in rows[mode]),
                max(r["cpu_per_step_us"] for r in rows[mode]),
            )
            for mode in ("off", "on")
        }
        print(
            f"{kind:14s} cpu spread (µs/step): off {spread['off'][0]:.1f}-{spread['off'][1]:.1f},"
            f" on {spread['on'][0]:.1f}-{spread['on'][1]:.1f}"
        )
        floor_wall = statistics.median(r["wall_per_span_us"] for r in rows["floor"])
        floor_cpu = statistics.median(r["cpu_per_span_us"] for r in rows["floor"])
        print(f"{kind:14s} bare SDK span: {floor_wall:.1f} µs wall, {floor_cpu:.1f} µs CPU")
    note = "; collector off" if a.no_gc else ""
    print(
        f"(medians of {a.reps} alternating repetitions of a {a.steps}-step run; µs per step{note})"
    )


if __name__ == "__main__":
    main()
