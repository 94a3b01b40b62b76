"""Overlap of parallel branches (W9): 10 branches, each one step that waits 0.5 s.

In one process, per journal (a SQLite file and a fresh PostgreSQL schema) and repetition:

* ``parallel`` -- a durable task whose body is ``parallel`` of 10 branches, each calling one
  step that sleeps 0.5 s, run through ``task.apply()`` (claim, 10 journaled steps, end);
* ``threads``  -- the floor: the same 10 sleeps in a bare ``ThreadPoolExecutor`` (no journal);
* ``sequence`` -- the same 10 steps one after another in a durable body (no branches).

Wall time and the process's CPU seconds are printed for each, with ``parallel / threads``.
The target (issue: parallel branches) is ``parallel`` ≤ 1.0 s.

Usage::

    python tests/bench/bench_branches.py [--reps 3] [--pg-url URL] [--branches 10] [--wait 0.5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from celery import Celery

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from celery_durable import Durable, parallel  # noqa: E402

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(
    url: str, branches: int, wait: float, reps: int
) -> dict[str, list[tuple[float, float]]]:
    app = Celery(f"bench-{uuid.uuid4().hex[:6]}", broker="memory://")
    durable = Durable(app, url)

    @durable.step(name="wait")
    def step(i: int) -> int:
        time.sleep(wait)
        return i

    @durable.task(name="bench.parallel")
    def together() -> list[int]:
        return parallel(*[(lambda i=i: step(i)) for i in range(branches)])

    @durable.task(name="bench.sequence")
    def one_by_one() -> list[int]:
        return [step(i) for i in range(branches)]

    def threads() -> None:
        with ThreadPoolExecutor(branches) as pool:
            list(pool.map(lambda _: time.sleep(wait), range(branches)))

    found: dict[str, list[tuple[float, float]]] = {"parallel": [], "threads": [], "sequence": []}
    together.apply(task_id=f"warm-{uuid.uuid4()}").get()
    for _ in range(reps):
        found["threads"].append(timed(threads))
        found["parallel"].append(timed(lambda: together.apply(task_id=f"p-{uuid.uuid4()}").get()))
        found["sequence"].append(timed(lambda: one_by_one.apply(task_id=f"s-{uuid.uuid4()}").get()))
    durable.close()
    return found


def fresh_pg_schema(url: str) -> tuple[str, Callable[[], None]]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))

    def drop() -> None:
        with engine.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()

    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}", drop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--branches", type=int, default=10)
    parser.add_argument("--wait", type=float, default=0.5)
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        journals = {"sqlite": (f"sqlite:///{tmp}/journal.db", lambda: None)}
        journals["postgres"] = fresh_pg_schema(args.pg_url)
        for name, (url, drop) in journals.items():
            try:
                found = measure(url, args.branches, args.wait, args.reps)
            finally:
                drop()
            medians = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
                       for k, v in found.items()}  # fmt: skip
            ratio = medians["parallel"][0] / medians["threads"][0]
            print(f"{name}: " + ", ".join(
                f"{k} {w:.3f} s wall / {c:.3f} s CPU" for k, (w, c) in medians.items()
            ) + f"; parallel/threads {ratio:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
