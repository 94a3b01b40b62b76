"""``visibility``: time from ``schedules.create()`` returning to the new run's message on Redis,
with a beat running over 1,000 idle schedules."""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from celery_durable import Durable, Once

from .common import (
    TASK,
    Recorder,
    beat_cmd,
    beat_env,
    driver_app,
    percentile,
    pg_journal,
    read_mark,
    redis_client,
    spawn,
    stop_process,
    tail,
    utcnow,
)
from .consumer import Consumer
from .seeding import seed, startup_schedules


def run(a: argparse.Namespace, rec: Recorder) -> None:
    r = redis_client(a.redis_url)
    app = driver_app(a.redis_url)
    with pg_journal(a.pg_url) as url, tempfile.TemporaryDirectory(prefix="bdisp_") as tds:
        td = Path(tds)
        durable = Durable(app, url)
        # 1,000 idle schedules, next due an hour away: beat is in its idle loop.
        seed(durable, startup_schedules(1000, 0, utcnow() + timedelta(minutes=30), 0))
        r.flushdb()
        consumer = Consumer(a.redis_url, keep=False)
        consumer.start()
        mark = td / "ready"
        t0 = time.time()
        p = spawn(beat_cmd(td), beat_env(url, a.redis_url, mark), td / "beat.log")
        samples: list[float | None] = []
        rng = random.Random(1)
        try:
            deadline = time.time() + 60
            while read_mark(mark, t0) is None and time.time() < deadline and p.poll() is None:
                time.sleep(0.05)
            time.sleep(2.0)  # past the first ticks
            for k in range(a.vis_samples):
                if p.poll() is not None:
                    break
                time.sleep(rng.uniform(0.2, 1.2))  # random phase against beat's poll loop
                sid = f"vis-{k:03d}"
                durable.schedules.create(sid, TASK, k, Once(utcnow()))
                t_ret = time.time()
                end = t_ret + 10
                while sid not in consumer.by_schedule and time.time() < end:
                    time.sleep(0.002)
                seen = consumer.by_schedule.get(sid)
                samples.append(None if seen is None else seen - t_ret)
        finally:
            stop_process(p)
            consumer.stop()
            durable.close()
        ok = [s for s in samples if s is not None]
        rec.add(
            {
                "bench": "visibility",
                "samples": len(samples),
                "missed": len(samples) - len(ok),
                "p50_s": percentile(ok, 50),
                "p90_s": percentile(ok, 90),
                "p99_s": percentile(ok, 99),
                "max_s": max(ok) if ok else None,
                "min_s": min(ok) if ok else None,
                "all_s": samples,
                "log_tail": tail(td / "beat.log") if len(ok) < len(samples) else "",
            }
        )
        r.flushdb()


def table(rec: Recorder, a: argparse.Namespace) -> list[str]:
    """The markdown lines of this benchmark's table (none without its rows)."""
    out: list[str] = []
    w = out.append
    vis = rec.of("visibility")
    if vis:
        x = vis[-1]
        w("\n### Change visibility: `schedules.create()` returns → first run on Redis\n")
        w("| samples | missed (>10 s) | min (s) | p50 (s) | p90 (s) | p99 (s) | max (s) |")
        w("|---|---|---|---|---|---|---|")
        vals = [x.get(k) for k in ("min_s", "p50_s", "p90_s", "p99_s", "max_s")]
        w(
            f"| {x['samples']} | {x['missed']} | "
            + " | ".join("n/a" if v is None else f"{v:.3f}" for v in vals)
            + " |"
        )
    return out
