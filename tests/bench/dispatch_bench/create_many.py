# ruff: noqa: E501
"""``create_many``: ``durable.schedules.create_many(specs)`` on a fresh PostgreSQL schema (D13).

N ``ScheduleSpec`` of ``Every(60 s)`` for ``bench.noop(i)``, created in one call in a fresh
process (after one ``create`` that opens the journal and builds the schema); wall and CPU
seconds of the call, then the same call again (every spec already there: nothing stored,
A1) and a count of the stored schedules.
"""

from __future__ import annotations

import argparse
import json
import time

from .common import Recorder, fmt, journal
from .floor import child_json

SIZES = (10_000, 100_000)


def run(a: argparse.Namespace, rec: Recorder) -> None:
    sizes = [n for n in SIZES if n <= max(a.n_create_many, SIZES[0])] if not a.quick else [SIZES[0]]
    for rep in range(a.reps):
        for n in sizes:
            with journal("postgres", a.pg_url) as url:
                args = ("--url", url, "--broker", "memory://", "--n", str(n), "--head", "0")
                res = child_json(a, "create_many", *args)
            rec.add({"bench": "create_many", "backend": "postgres", "n": n, "rep": rep, **res})


def child_create_many(c: argparse.Namespace) -> None:
    from datetime import timedelta

    from celery import Celery

    from celery_durable import Durable, Every, ScheduleSpec

    app = Celery("bench_create_many", broker="memory://")

    @app.task(name="bench.noop", shared=False)
    def noop(i: int) -> None:
        return None

    durable = Durable(app, c.url)
    rule = Every(timedelta(seconds=60))
    durable.schedules.create("warm-up", "bench.noop", 0, rule)
    specs = [
        ScheduleSpec(id=f"s{i:07d}", task="bench.noop", input=i, rule=rule) for i in range(c.n)
    ]
    t0, cpu0 = time.perf_counter(), time.process_time()
    created = durable.schedules.create_many(specs)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    t1, cpu1 = time.perf_counter(), time.process_time()
    again = durable.schedules.create_many(specs)
    wall_again, cpu_again = time.perf_counter() - t1, time.process_time() - cpu1
    stored = len(durable.schedules.store.load_many([s.id for s in specs]))
    durable.close()
    print(
        json.dumps(
            {
                "created": created,
                "again_created": again,
                "stored": stored,
                "wall_s": wall,
                "cpu_s": cpu,
                "per_s": c.n / wall,
                "again_wall_s": wall_again,
                "again_cpu_s": cpu_again,
            }
        )
    )


def table(rec: Recorder, a: argparse.Namespace) -> list[str]:
    rows = rec.of("create_many")
    if not rows:
        return []
    out = [
        "\n### `schedules.create_many(specs)`, PostgreSQL, fresh schema, one call\n",
        "| N | reps | wall (s) | CPU (s) | schedules/s | again, all present (s, CPU s) |",
        "|---|---|---|---|---|---|",
    ]
    for n in sorted({x["n"] for x in rows}):
        nr = [x for x in rows if x["n"] == n and "wall_s" in x]
        if nr:
            out.append(
                f"| {n:,} | {len(nr)} | {fmt([x['wall_s'] for x in nr], 3)} | {fmt([x['cpu_s'] for x in nr], 3)} "
                f"| {fmt([x['per_s'] for x in nr], 0)} "
                f"| {fmt([x['again_wall_s'] for x in nr], 3)}, {fmt([x['again_cpu_s'] for x in nr], 3)} |"
            )
    return out
