# ruff: noqa: E501
"""``burst`` with the beat already running: N schedules all due at one instant ``T`` a few
seconds after a ``celery beat`` subprocess has started (midnight's cron jobs, say).

The burst of :mod:`.burst` starts its clock at the beat's launch, so it counts the process
start, the imports and the set-up, which the floor it is compared with (a process already
running, publishing) does not. Here the clock starts at ``T``, the due time itself: ``T`` →
first message on Redis, ``T`` → all N on Redis, ``T`` → all N ``RunStarted`` in the journal,
and the beat's CPU seconds from ``T`` to then. The floor of the same repetition is the one
:func:`.floor.run` measures beside it. A repetition whose beat was not ready before ``T`` is
marked (``late_start``) and left out of the ratios.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from celery_durable import Durable

from .common import (
    Recorder,
    beat_cmd,
    beat_env,
    driver_app,
    fmt,
    journal,
    med,
    proc_cpu,
    proc_status,
    ratio,
    read_mark,
    redis_client,
    spawn,
    stop_process,
    tail,
    utcnow,
)
from .floor import floor_rate
from .seeding import burst_schedules, last_recorded, seed, type_counts

BENCH = "burst_running"
LEAD_S = 6.0
"""Seconds from the beat's launch to ``T`` (after seeding): its launch takes about 1 s."""


def once(a: argparse.Namespace, backend: str, n: int, rep: int, rec: Recorder) -> None:
    r = redis_client(a.redis_url)
    app = driver_app(a.redis_url)
    with journal(backend, a.pg_url) as url, tempfile.TemporaryDirectory(prefix="bdisp_") as tds:
        td = Path(tds)
        durable = Durable(app, url)
        # Created one period (60 s) before T: the first due time of every schedule is T. The
        # seeding's own time is estimated generously (≈ 4,000 schedules/s here, loaded).
        seed_budget = timedelta(seconds=2 + n / 4000)
        due_at = utcnow() + seed_budget + timedelta(seconds=LEAD_S)
        seeded = seed(durable, burst_schedules(n, due_at - timedelta(seconds=60), prefix="w"))
        head = seeded["head"]
        r.flushdb()
        mark = td / "ready"
        t_launch = time.time()
        p = spawn(beat_cmd(td), beat_env(url, a.redis_url, mark), td / "beat.log")
        t_due = due_at.timestamp()
        t_first = t_all_q = t_all_started = None
        cpu_at_due = cpu_all_started = None
        hwm = 0.0
        last_count = 0.0
        try:
            while True:
                wall = time.time()
                if p.poll() is not None or wall - t_launch > a.timeout:
                    break
                if cpu_at_due is None and wall >= t_due:
                    cpu_at_due = proc_cpu(p.pid)
                llen = r.llen("celery")
                hwm = max(hwm, proc_status(p.pid, "VmHWM") or 0.0)
                now = wall - t_due
                if llen and t_first is None:
                    t_first = now
                if llen >= n and t_all_q is None:
                    t_all_q = now
                if wall >= t_due and (llen >= n or now - last_count >= 1.0):
                    last_count = now
                    if type_counts(durable, head).get("RunStarted", 0) >= n:
                        t_all_started, cpu_all_started = time.time() - t_due, proc_cpu(p.pid)
                if t_all_q is not None and t_all_started is not None:
                    break
                time.sleep(a.poll)
        finally:
            stop_process(p)
            durable.close()
        t_ready = read_mark(mark, t_launch)
        counts = type_counts(durable, head)
        t_last_started_rec = last_recorded(durable, head, "RunStarted", t_due)
        r.flushdb()
        late = t_ready is None or t_launch + t_ready > t_due
        cpu = (
            cpu_all_started - cpu_at_due
            if cpu_all_started is not None and cpu_at_due is not None
            else None
        )
        rec.add(
            {
                "bench": BENCH,
                "backend": backend,
                "n": n,
                "rep": rep,
                "launch_to_due_s": t_due - t_launch,
                "t_ready_after_launch_s": t_ready,
                "late_start": late,
                "t_first_s": t_first,
                "t_all_queued_s": t_all_q,
                "t_all_started_s": t_all_started,
                "t_last_started_recorded_at_s": t_last_started_rec,
                "cpu_s": cpu,
                "runs_per_s": (n / t_all_started) if t_all_started else None,
                "peak_rss_mib": hwm,
                "decided": counts.get("RunDecided", 0),
                "started": counts.get("RunStarted", 0),
                "timed_out": t_all_started is None,
                "seed_s": seeded["seed_total_s"],
                "log_tail": tail(td / "beat.log") if t_all_started is None or late else "",
            }
        )


def table_lines(rec: Recorder, n: int) -> list[str]:
    """One row per journal: due time → all N, and the ratio to the same run's floor."""
    out: list[str] = []
    for backend in ("postgres", "sqlite", "mysql"):
        rows = [x for x in rec.of(BENCH, backend=backend, n=n) if not x["late_start"]]
        late = len(rec.of(BENCH, backend=backend, n=n)) - len(rows)
        if not rows and not late:
            continue
        if not out:
            out += [
                f"\nBeat already running, {n:,} schedules due at one instant T (same run; clock from T):\n",
                "| journal | reps | T → 1st msg (s) | T → all N on Redis (s) | T → all N started recorded (s) "
                "| beat CPU T → then (s) | runs/s | floor `apply_async_batch` msgs/s | **runs/s ÷ floor** | not ready by T |",
                "|---|---|---|---|---|---|---|---|---|---|",
            ]
        floor = med(floor_rate(rec, n, "apply_async_batch"))
        out.append(
            f"| {backend} | {len(rows)} | {fmt([x['t_first_s'] for x in rows])} "
            f"| {fmt([x['t_all_queued_s'] for x in rows])} | {fmt([x['t_all_started_s'] for x in rows])} "
            f"| {fmt([x['cpu_s'] for x in rows])} | {fmt([x['runs_per_s'] for x in rows], 0)} "
            f"| {fmt([floor], 0)} | **{ratio(med([x['runs_per_s'] for x in rows]), floor)}** | {late} |"
        )
    return out
