"""Several beats sharing a burst through partitions (D10, D13): N schedules due at once, 1, 2
and 3 ``celery beat -S durable`` subprocesses on one PostgreSQL journal with ``P`` partitions.

For each beat count, in a fresh schema: seed ``N`` schedules of ``Every(60 s)`` first due
``--due-in`` seconds later, start the beats, let them share the partitions (a beat that starts
first takes every partition; the others get their share within two lease periods, D10), and
time the due instant → every one of the ``N`` runs' start recorded in the journal (and on
Redis). Reports the partitions each beat held at the due time, each beat's CPU seconds during
the burst, their sum per 1,000 runs (the figure that predicts scaling on more cores: it must
not grow with the number of beats), how many runs each beat started (the ``RunStarted`` events
of the schedules in the partitions it holds at the end), and the time against one beat. A
2-core machine cannot show more than two beats running at once: read the CPU column.

Usage::

    python tests/bench/bench_partitions.py [--n 100000] [--partitions 16] [--beats 1,2,3] \
        [--redis-url redis://127.0.0.1:6379/9] [--pg-url postgresql+psycopg://…/test]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

from dispatch_bench.common import (  # noqa: E402
    DEFAULT_PG,
    DEFAULT_REDIS,
    beat_cmd,
    beat_env,
    driver_app,
    journal,
    proc_cpu,
    redis_client,
    spawn,
    stop_process,
    tail,
    utcnow,
)
from dispatch_bench.seeding import burst_schedules, seed, type_counts  # noqa: E402
from sqlalchemy import text  # noqa: E402

from celery_durable import Durable  # noqa: E402


def started_per_beat(durable: Durable, head: int, parts: int) -> dict[str, int]:
    """``RunStarted`` events after ``head``, by the beat holding their schedule's partition
    when the run finished (the lease rows name the holders)."""
    with durable.journal.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT l.owner, count(*) FROM celery_durable_events e "
                "JOIN celery_durable_schedule_index i ON e.stream = 'schedule/' || i.schedule_id "
                "JOIN celery_durable_leases l ON l.name = 'dispatcher/' || "
                "(i.slot % :parts) WHERE e.position > :head AND e.type = 'RunStarted' "
                "GROUP BY l.owner"
            ),
            {"head": head, "parts": parts},
        ).all()
    return {str(owner): int(count) for owner, count in rows}


def holders(durable: Durable) -> list[int]:
    """How many partition leases each beat holds now, largest first."""
    with durable.journal.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT owner, count(*) FROM celery_durable_leases "
                "WHERE name LIKE 'dispatcher/%' AND expires_at > now() GROUP BY owner"
            )
        ).all()
    return sorted((int(count) for _, count in rows), reverse=True)


def one(a: argparse.Namespace, beats: int) -> dict[str, Any]:
    """Seed N schedules first due ``a.due_in`` seconds from now, start the beats, let them
    share the partitions, then time the due instant → every run's start recorded."""
    r = redis_client(a.redis_url)
    app = driver_app(a.redis_url)
    with journal("postgres", a.pg_url) as url, tempfile.TemporaryDirectory(prefix="bpart_") as t:
        td = Path(t)
        durable = Durable(app, url)
        created = utcnow() + timedelta(seconds=a.due_in - 60)  # Every(60 s): first due +60 s
        seed(durable, burst_schedules(a.n, created))
        head = durable.journal.head()
        due_at = (created + timedelta(seconds=60)).timestamp()
        r.flushdb()
        extra = {"BENCH_PARTITIONS": str(a.partitions)}
        procs = []
        for i in range(beats):
            work = td / f"beat{i}"
            work.mkdir()
            env = beat_env(url, a.redis_url, work / "ready", extra)
            procs.append(spawn(beat_cmd(work), env, work / "beat.log"))
        early = due_at - time.time()
        t_all = cpu = None
        held: list[int] = []
        last = 0.0
        try:
            while time.time() < due_at - 0.5:
                time.sleep(0.1)
            held = holders(durable)
            while time.time() < due_at:
                time.sleep(0.01)
            cpu0 = [proc_cpu(p.pid) or 0.0 for p in procs]
            while time.time() - due_at < a.timeout:
                if any(p.poll() is not None for p in procs):
                    break
                now = time.time() - due_at
                if now - last >= 0.5:
                    last = now
                    if type_counts(durable, head).get("RunStarted", 0) >= a.n:
                        t_all = time.time() - due_at
                        cpu = [
                            (proc_cpu(p.pid) or 0.0) - c for p, c in zip(procs, cpu0, strict=True)
                        ]
                        break
                time.sleep(0.05)
            queued = r.llen("celery")
            shares = started_per_beat(durable, head, a.partitions) if t_all is not None else {}
        finally:
            for p in procs:
                stop_process(p)
            durable.close()
        logs = "" if t_all is not None else "\n".join(tail(td / f"beat{i}" / "beat.log")
                                                      for i in range(beats))  # fmt: skip
        r.flushdb()
    return {
        "beats": beats,
        "t_all_started_s": t_all,
        "cpu_s": cpu,
        "queued": queued,
        "held": held,
        "early_s": early,
        "shares": sorted(shares.values(), reverse=True),
        "log_tail": logs,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--beats", default="1,2,3")
    ap.add_argument("--redis-url", default=DEFAULT_REDIS)
    ap.add_argument("--pg-url", default=DEFAULT_PG)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument(
        "--due-in", type=float, default=150.0,
        help="seconds from the start of seeding to the burst's due time (seeding, start-up "
        "and the beats' sharing of the partitions must fit in it)",
    )  # fmt: skip
    a = ap.parse_args()
    print(f"N={a.n:,} due at once, {a.partitions} partitions, PostgreSQL, Redis; "
          f"load {os.getloadavg()[0]:.2f} at the start")  # fmt: skip
    print("| beats | partitions held per beat at the due time | due → all started (s) | "
          "× one beat | CPU per beat during the burst (s) | CPU per 1,000 runs, all beats (s) | "
          "runs started per beat | on Redis |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    first: float | None = None
    for beats in [int(b) for b in a.beats.split(",")]:
        row = one(a, beats)
        wall, cpu = row["t_all_started_s"], row["cpu_s"]
        held = " / ".join(str(h) for h in row["held"])
        if row["early_s"] < 20:
            print(f"  (warning: the beats started only {row['early_s']:.0f} s before the due time)")
        if wall is None:
            print(f"| {beats} | {held} | did not finish in {a.timeout:.0f} s | | | | | "
                  f"{row['queued']} |")  # fmt: skip
            print(row["log_tail"])
            continue
        first = first or wall
        per_k = sum(cpu) / (a.n / 1000)
        print(
            f"| {beats} | {held} | {wall:.2f} | {wall / first:.2f} | "
            f"{' / '.join(f'{c:.2f}' for c in cpu)} | {per_k:.3f} | "
            f"{' / '.join(f'{s:,}' for s in row['shares'])} | {row['queued']:,} |"
        )
        print(f"  (load {os.getloadavg()[0]:.2f})", flush=True)


if __name__ == "__main__":
    main()
