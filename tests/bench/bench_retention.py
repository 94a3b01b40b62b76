# ruff: noqa: E501
"""Benchmarks of retention and snapshots (O1, O2); figures in docs/retention.md.

    python tests/bench/bench_retention.py                 # everything, default (scaled) sizes
    python tests/bench/bench_retention.py --only state,startup --url postgresql+psycopg://…/test

* ``steady``  N ``Every(10 s)`` schedules (``--n-steady``, default 1,000: 100 runs/s) whose
              streams hold ``--history`` old runs each, driven by the in-process dispatcher on
              the real clock for ``--duration`` s after a warm-up: decision lag (``RunDecided.at``
              minus due) p50/p99/max with background pruning (retention 1 day, the first pass at
              the end of the warm-up, so the history is being pruned during the window) and
              without.
* ``startup`` dispatcher start-up (``Durable`` + ``dispatcher()`` + ``load``) over
              ``--n-startup`` schedules whose streams each hold 200 old events, vs the same
              schedules without history.
* ``state``   ``schedules.state()`` of a schedule with 100,000 stored events vs one with 10
              (before and after a prune that snapshots the big one).
* ``late``    one ``durable.prune()`` after a beat downtime of 68 days: a catch-up ``ALL`` of a
              two-hourly schedule and a backfill of ``--n-late`` schedules of ``Every(10 min)``
              (9,648 runs each) record old due times at new positions; the call must remove
              every eligible record (O1): events removed, read, batches and seconds, with
              ``--dry-run`` before it.
* ``size``    journal size (SQLite file after a checkpoint, and event rows) after 30 and after
              120 simulated days of ``--n-size`` hourly schedules with retention 30 days.

The journal is a fresh SQLite file per case unless ``--url`` names a PostgreSQL database (a fresh
schema per case is not made: use an empty database).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import sqlalchemy as sa  # noqa: E402
from celery import Celery  # noqa: E402
from dispatch_bench.common import TASK  # noqa: E402
from dispatch_bench.seeding import content, seed  # noqa: E402

from celery_durable import CatchUp, Durable, Every  # noqa: E402
from celery_durable.core.codec import time_from_json  # noqa: E402
from celery_durable.core.ids import run_id  # noqa: E402
from celery_durable.core.schedule_events import (  # noqa: E402
    RunDecided,
    RunSent,
    ScheduleCreated,
)
from celery_durable.store.journal.schema import events as events_table  # noqa: E402

UTC = timezone.utc


PRUNE_BATCH = [100]


def app(retention: timedelta, prune_interval: float = 300.0) -> Celery:
    a = Celery("bench_retention", broker="memory://", set_as_current=False)
    a.conf.update(
        durable_prune_batch=PRUNE_BATCH[0],
        durable_retention=retention,
        durable_prune_interval=prune_interval,
        durable_sqlite_synchronous="NORMAL",
    )

    @a.task(name=TASK, shared=False)
    def noop(*args: object, **kwargs: object) -> None:
        return None

    return a


def journal_url(a: argparse.Namespace, td: Path, name: str) -> str:
    return a.url or f"sqlite:///{td / name}.db"


def history(
    n: int, runs: int, period: timedelta, last_due: datetime, prefix: str
) -> Iterator[tuple[str, list[Any]]]:
    """``n`` schedules of ``Every(period)`` with ``runs`` past runs each, the last at ``last_due``."""
    rule = Every(period)
    for i in range(n):
        sid = f"{prefix}-{i:06d}"
        created = last_due - period * runs + period * (i / max(n, 1))
        evs: list[Any] = [ScheduleCreated(at=created, content=content(i, rule))]
        for k in range(1, runs + 1):
            due = created + period * k
            evs.append(RunDecided(at=due, due=due, run_id=run_id(sid, due), task=TASK, input=i))
            evs.append(RunSent(at=due, due=due))
        yield sid, evs


def median_time(fun: Callable[[], object], reps: int) -> float:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fun()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# -- steady ----------------------------------------------------------------------------------


def steady_case(a: argparse.Namespace, td: Path, pruning: bool) -> dict[str, Any]:
    url = journal_url(a, td, f"steady-{pruning}")
    period = timedelta(seconds=10)
    retention = timedelta(days=1) if pruning else timedelta(days=366)
    # The first pass starts as the measured window does (one interval after the first tick).
    durable = Durable(app(retention, a.warmup if pruning else 1e9), url)
    # History ends two days ago: all of it is older than the 1-day retention.
    start = datetime.now(UTC)
    seeded = seed(durable, history(a.n_steady, a.history, period, start - timedelta(days=2), "e"))
    head = durable.journal.head()
    dispatcher = durable.dispatcher()
    t0 = time.time()
    w0, w1 = t0 + a.warmup, t0 + a.warmup + a.duration
    while time.time() < w1:
        time.sleep(min(dispatcher.tick(), 0.5))
    passing = dispatcher.pruning.last
    dispatcher.close()
    with durable.journal.engine.connect() as conn:
        left = conn.execute(sa.select(sa.func.count()).where(events_table.c.position <= head))
        remaining_history = int(left.scalar() or 0)
    lags = []
    query = sa.select(events_table.c.data).where(
        events_table.c.position > head, events_table.c.type == "RunDecided"
    )
    with durable.journal.engine.connect() as conn:
        for (data,) in conn.execute(query):
            payload = json.loads(data)
            due = time_from_json(payload["due"]).timestamp()
            if w0 <= due < w1:
                lags.append(time_from_json(payload["at"]).timestamp() - due)
    durable.close()
    return {
        "bench": "steady",
        "pruning": pruning,
        "n": a.n_steady,
        "history_events": seeded["events"],
        "runs": len(lags),
        "expected": int(a.duration * a.n_steady / 10),
        "lag_p50_s": percentile(lags, 50),
        "lag_p99_s": percentile(lags, 99),
        "lag_max_s": max(lags),
        "history_left": remaining_history,
        "prune_batch": PRUNE_BATCH[0],
        "last_pass": None if passing is None else passing.to_json(),
    }


# -- startup ---------------------------------------------------------------------------------


def startup_case(a: argparse.Namespace, td: Path, runs: int) -> dict[str, Any]:
    url = journal_url(a, td, f"startup-{runs}")
    durable = Durable(app(timedelta(days=366)), url)
    last = datetime.now(UTC) - timedelta(minutes=30)
    seeded = seed(durable, history(a.n_startup, runs, timedelta(hours=1), last, "s"))
    durable.close()

    def start() -> None:
        d = Durable(app(timedelta(days=366)), url)
        dispatcher = d.dispatcher()
        dispatcher.load(d.now())
        dispatcher.lease.release()
        d.close()

    return {
        "bench": "startup",
        "n": a.n_startup,
        "events": seeded["events"],
        "startup_s": median_time(start, 5),
    }


# -- state -----------------------------------------------------------------------------------


def state_case(a: argparse.Namespace, td: Path) -> list[dict[str, Any]]:
    url = journal_url(a, td, "state")
    durable = Durable(app(timedelta(days=30)), url)
    last = datetime.now(UTC) - timedelta(days=40)
    seed(durable, history(1, 50_000, timedelta(minutes=1), last, "big"))
    seed(durable, history(1, 5, timedelta(minutes=1), last, "small"))
    rows = []
    for phase in ("unpruned", "pruned"):
        if phase == "pruned":
            report = durable.prune()
            assert report.schedule_events > 90_000, report
        for sid in ("big-000000", "small-000000"):
            events = len(durable.journal.read_stream(f"schedule/{sid}"))
            rows.append(
                {
                    "bench": "state",
                    "phase": phase,
                    "schedule": sid,
                    "stored_events": events,
                    "state_s": median_time(lambda s=sid: durable.schedules.state(s), 300),
                }
            )
    durable.close()
    return rows


# -- late ------------------------------------------------------------------------------------


def late_case(a: argparse.Namespace, td: Path) -> list[dict[str, Any]]:
    url = journal_url(a, td, "late")
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    durable = Durable(app(timedelta(days=366)), url, clock=lambda: now[0])
    schedules = durable.schedules
    schedules.create("two-hourly", TASK, 0, Every(timedelta(hours=2)), CatchUp.ALL)
    ids = [f"late-{i}" for i in range(a.n_late)]
    for i, sid in enumerate(ids):
        schedules.create(sid, TASK, i, Every(timedelta(minutes=10)), CatchUp.LATEST)
    dispatcher = durable.dispatcher()
    dispatcher.tick()
    start = now[0]
    now[0] += timedelta(days=68)
    dispatcher.tick()
    backfilled = sum(len(schedules.backfill(sid, start, now[0] - timedelta(days=1))) for sid in ids)
    for _ in range(50):  # the backfilled runs go out
        now[0] += timedelta(seconds=1)
        dispatcher.tick()
    dispatcher.close()
    rows = []
    for dry_run in (True, False):
        t0 = time.perf_counter()
        report = durable.prune(timedelta(days=30), dry_run=dry_run)
        rows.append(
            {
                "bench": "late",
                "backfilled_runs": backfilled,
                "dry_run": dry_run,
                "schedule_events": report.schedule_events,
                "events_read": report.events_read,
                "batches": report.batches,
                "complete": report.complete,
                "seconds": time.perf_counter() - t0,
            }
        )
    again = durable.prune(timedelta(days=30))
    rows.append({"bench": "late", "second_call_removed": again.schedule_events})
    durable.close()
    return rows


# -- size ------------------------------------------------------------------------------------


def size_case(a: argparse.Namespace, td: Path) -> list[dict[str, Any]]:
    url = journal_url(a, td, "size")
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    a_ = app(timedelta(days=30), 6 * 3600.0)
    durable = Durable(a_, url, clock=lambda: now[0])
    for i in range(a.n_size):
        durable.schedules.create(f"h-{i}", TASK, i, Every(timedelta(hours=1)), CatchUp.ALL)
    dispatcher = durable.dispatcher()
    rows = []
    for hour in range(2, 120 * 24 + 1, 2):
        now[0] += timedelta(hours=2)
        dispatcher.tick()
        if hour % (24 * 30) == 0:
            dispatcher.pruning.wait()
            rows.append({"bench": "size", "day": hour // 24, **measure(durable)})
    dispatcher.close()
    durable.close()
    return rows


def measure(durable: Durable) -> dict[str, Any]:
    engine = durable.journal.engine
    with engine.connect() as conn:
        events = int(
            conn.execute(sa.select(sa.func.count()).select_from(events_table)).scalar() or 0
        )
        if engine.dialect.name != "sqlite":
            size = int(
                conn.exec_driver_sql(
                    "SELECT pg_total_relation_size('celery_durable_events')"
                ).scalar()
                or 0
            )
            return {"event_rows": events, "bytes": size}
    path = engine.url.database or ""
    raw = sqlite3.connect(path)
    try:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        raw.close()
    return {"event_rows": events, "bytes": os.path.getsize(path)}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", default="steady,startup,state,late,size")
    ap.add_argument(
        "--url", default=None, help="a PostgreSQL URL (an empty database) instead of SQLite files"
    )
    ap.add_argument("--n-steady", type=int, default=1000)
    ap.add_argument("--history", type=int, default=100, help="old runs per schedule in steady")
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--n-startup", type=int, default=10_000)
    ap.add_argument("--n-size", type=int, default=20)
    ap.add_argument("--n-late", type=int, default=1, help="backfilled schedules in late")
    ap.add_argument("--prune-batch", type=int, default=100, help="durable_prune_batch")
    a = ap.parse_args()
    PRUNE_BATCH[0] = a.prune_batch
    chosen = set(a.only.split(","))
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bret_") as tds:
        td = Path(tds)
        if "state" in chosen:
            out += state_case(a, td)
        if "startup" in chosen:
            out += [startup_case(a, td, 100), startup_case(a, td, 0)]
        if "late" in chosen:
            out += late_case(a, td)
        if "size" in chosen:
            out += size_case(a, td)
        if "steady" in chosen:
            out += [steady_case(a, td, False), steady_case(a, td, True)]
    for row in out:
        print(json.dumps(row, default=str))


if __name__ == "__main__":
    main()
