# ruff: noqa: E501
"""``floor`` rows of the burst: what one process can put on Redis, measured in the same run.

Two floors, each in a fresh process on the benchmark's Redis, N messages of ``bench.noop(i)``
to the ``celery`` list (checked with LLEN), wall and CPU seconds:

* ``apply_async_batch``: ``noop.apply_async((i,), task_id=…, producer=p)`` inside kombu's
  ``producer.batch(max_size=1000)`` (a Redis pipeline, 1,000 LPUSHes per round trip): the
  fastest a Celery user publishes, and D13's reference for the burst (≥ 1.0×);
* ``publisher_send``: the dispatcher's own ``Publisher.send`` of N decided runs (the publish
  fast path, D12, batches of 1,000 as the dispatcher sends them), without the journal: the
  publish step of the burst on its own, beside the floor it is measured against;
* ``lpush_pipeline``: raw redis-py LPUSH of one pre-built Celery message (the same bytes each
  time) through a non-transactional pipeline, 1,000 per execute: the broker's own ceiling;
* ``apply_async_batch_cold``: the first floor from a cold launch (:mod:`.floor_cold`): the
  clock starts at ``Popen`` of a fresh interpreter that imports Celery and the beat's app
  module, connects and publishes, as the launch burst's clock starts at ``Popen`` of
  ``celery beat`` (2026-12-06). ``t_imported_s``: ``Popen`` → the app imported.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .common import HERE, ROOT, Recorder, beat_env, child_cmd, fmt, redis_client

BATCH = 1000
VARIANTS = ("apply_async_batch", "apply_async_batch_cold", "publisher_send", "lpush_pipeline")
COLD = HERE / "dispatch_bench" / "floor_cold.py"


def child_json(a: argparse.Namespace, *args: str) -> dict[str, Any]:
    """Run a ``--child`` of the driver and read the JSON line it prints last."""
    out = subprocess.run(child_cmd(*args), cwd=str(ROOT), capture_output=True, timeout=a.timeout)
    try:
        return dict(json.loads(out.stdout.decode().strip().splitlines()[-1]))
    except (IndexError, ValueError):
        print(out.stdout.decode()[-2000:], out.stderr.decode()[-3000:], file=sys.stderr)
        return {"error": True}


def run(a: argparse.Namespace, rec: Recorder, n: int, rep: int) -> None:
    for variant in ("apply_async_batch", "publisher_send", "lpush_pipeline"):
        args = ("--url", "-", "--broker", a.redis_url, "--n", str(n), "--head", "0")
        res = child_json(a, "floor", *args, "--variant", variant)
        rec.add({"bench": "publish_floor", "variant": variant, "n": n, "rep": rep, **res})
    rec.add(
        {"bench": "publish_floor", "variant": "apply_async_batch_cold", "n": n, "rep": rep}
        | run_cold(a, n)
    )


def run_cold(a: argparse.Namespace, n: int) -> dict[str, Any]:
    """The ``apply_async_batch`` floor as a fresh process, clock at ``Popen`` (:mod:`.floor_cold`)."""
    r = redis_client(a.redis_url)
    r.delete("celery")
    env = beat_env(a.pg_url, a.redis_url, Path("/dev/null"))
    t0 = time.time()
    out = subprocess.run(
        [sys.executable, str(COLD), str(n)],
        env=env,
        cwd=str(ROOT),
        capture_output=True,
        timeout=a.timeout,
    )
    llen = r.llen("celery")
    r.delete("celery")
    try:
        res = json.loads(out.stdout.decode().strip().splitlines()[-1])
    except (IndexError, ValueError):
        print(out.stdout.decode()[-2000:], out.stderr.decode()[-3000:], file=sys.stderr)
        return {"error": True}
    wall = res["t_end"] - t0
    return {
        "wall_s": wall,
        "cpu_s": res["cpu_s"],
        "msgs_per_s": n / wall,
        "t_imported_s": res["t_imported"] - t0,
        "t_interpreter_s": res["t_start"] - t0,
        "llen": llen,
    }


def child_floor(c: argparse.Namespace) -> None:
    """In a fresh process: publish N messages one way, print wall, CPU and LLEN as JSON."""
    from celery import Celery

    r = redis_client(c.broker)
    app = Celery("bench_floor", broker=c.broker)
    app.conf.update(broker_connection_retry_on_startup=True)

    @app.task(name="bench.noop", shared=False)
    def noop(*args: Any) -> None:
        return None

    if c.variant == "publisher_send":
        from datetime import datetime, timedelta, timezone

        from celery_durable.core.ids import run_id
        from celery_durable.core.schedule_aggregate import PendingRun
        from celery_durable.dispatch.publisher import Publisher

        due = datetime(2026, 12, 1, tzinfo=timezone.utc)
        publisher = Publisher(app, timedelta(seconds=5))
        runs = [
            (f"s{i}", PendingRun(due=due, run_id=run_id(f"s{i}", due), task="bench.noop", input=i))
            for i in range(c.n)
        ]
        list(publisher.send(runs[:1], due, batch_size=BATCH))  # the shape's template
    r.delete("celery")
    with app.producer_or_acquire() as producer:
        noop.apply_async((0,), task_id="warm-up", producer=producer)  # connect, declare
        r.delete("celery")
        message = None
        if c.variant == "lpush_pipeline":
            with producer.batch(max_size=BATCH):
                noop.apply_async((0,), task_id="template", producer=producer)
            message = r.lpop("celery")
        t0, cpu0 = time.perf_counter(), time.process_time()
        if c.variant == "apply_async_batch":
            with producer.batch(max_size=BATCH):
                for i in range(c.n):
                    noop.apply_async((i,), task_id=f"floor@{i}", producer=producer)
        elif c.variant == "publisher_send":
            for first in range(0, c.n, BATCH):
                chunk = runs[first : first + BATCH]
                for _ in publisher.send(chunk, due, batch_size=BATCH):
                    pass
        else:
            pipe = r.pipeline(transaction=False)
            for i in range(c.n):
                pipe.lpush("celery", message)
                if (i + 1) % BATCH == 0:
                    pipe.execute()
            pipe.execute()
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    llen = r.llen("celery")
    r.delete("celery")
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "msgs_per_s": c.n / wall, "llen": llen}))


def floor_rate(rec: Recorder, n: int, variant: str) -> list[float]:
    return [
        x["msgs_per_s"] for x in rec.of("publish_floor", n=n, variant=variant) if "msgs_per_s" in x
    ]


def table_lines(rec: Recorder, n: int) -> list[str]:
    rows = rec.of("publish_floor", n=n)
    if not rows:
        return []
    out = [
        f"\nPublish floors (same run, fresh process each, {n:,} messages to Redis):\n",
        "| variant | reps | wall (s) | CPU (s) | msgs/s |",
        "|---|---|---|---|---|",
    ]
    cold = [x for x in rows if x.get("variant") == "apply_async_batch_cold" and "wall_s" in x]
    for v in VARIANTS:
        vr = [x for x in rows if x.get("variant") == v and "wall_s" in x]
        if vr:
            out.append(
                f"| {v} | {len(vr)} | {fmt([x['wall_s'] for x in vr], 3)} | {fmt([x['cpu_s'] for x in vr], 3)} "
                f"| {fmt([x['msgs_per_s'] for x in vr], 0)} |"
            )
    if cold:
        out.append(
            "\n`apply_async_batch_cold`: wall and CPU from `Popen` of a fresh interpreter "
            f"(imports of Celery and the app: {fmt([x['t_imported_s'] for x in cold])} s of it)."
        )
    return out
