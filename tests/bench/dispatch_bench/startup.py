# ruff: noqa: E501
"""``startup``: launch to first decision with 100,000 schedules, with and without a long
history, for a beat subprocess and for ``Durable()`` + ``dispatcher()`` + ``tick()``."""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from celery_durable import Durable

from .common import (
    Recorder,
    beat_cmd,
    beat_env,
    child_cmd,
    driver_app,
    fmt,
    med,
    pg_journal,
    proc_cpu,
    proc_status,
    read_mark,
    redis_client,
    spawn,
    stop_process,
    tail,
    utcnow,
)
from .seeding import first_decided, seed, startup_schedules, type_counts


def snapshot(url: str) -> None:
    """Keep a copy of the index rows and the position, to undo a repetition's decisions."""
    from sqlalchemy import create_engine

    eng = create_engine(_plain(url))
    with eng.begin() as conn:
        conn.execute(
            text("CREATE TABLE bench_index_backup AS SELECT * FROM celery_durable_schedule_index")
        )
        conn.execute(
            text("CREATE TABLE bench_progress_backup AS SELECT * FROM celery_durable_progress")
        )
    eng.dispose()


def restore(url: str, head: int) -> None:
    """Undo what a start-up repetition stored: later events, index rows, lease."""
    from sqlalchemy import create_engine

    eng = create_engine(_plain(url))
    with eng.begin() as conn:
        conn.execute(text("DELETE FROM celery_durable_events WHERE position > :h"), {"h": head})
        conn.execute(text("DELETE FROM celery_durable_schedule_index"))
        conn.execute(
            text("INSERT INTO celery_durable_schedule_index SELECT * FROM bench_index_backup")
        )
        conn.execute(text("DELETE FROM celery_durable_progress"))
        conn.execute(
            text("INSERT INTO celery_durable_progress SELECT * FROM bench_progress_backup")
        )
        conn.execute(text("DELETE FROM celery_durable_leases"))
    with eng.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE celery_durable_schedule_index"))
        conn.execute(text("VACUUM ANALYZE celery_durable_events"))
    eng.dispose()


def _plain(url: str) -> str:
    from celery_durable.store.journal.urls import normalize_url

    return normalize_url(url).render_as_string(hide_password=False)


def startup_once(
    a: argparse.Namespace,
    dataset: str,
    url: str,
    head: int,
    due_now: int,
    mode: str,
    rep: int,
    rec: Recorder,
) -> None:
    r = redis_client(a.redis_url)
    app = driver_app(a.redis_url)
    restore(url, head)
    r.flushdb()
    durable = Durable(app, url)
    with tempfile.TemporaryDirectory(prefix="bdisp_") as tds:
        td = Path(tds)
        mark = td / "ready"
        env = beat_env(url, a.redis_url, mark)
        cmd = (
            beat_cmd(td)
            if mode == "beat"
            else child_cmd(
                "startup",
                "--url",
                url,
                "--broker",
                a.redis_url,
                "--n",
                str(due_now),
                "--head",
                str(head),
            )
        )
        t0 = time.time()
        p = spawn(cmd, env, td / "proc.log")
        t_decided = t_first_msg = t_all_started = None
        cpu_decided = cpu_started = None
        hwm = 0.0
        try:
            while time.time() - t0 < a.timeout:
                now = time.time() - t0
                cpu = proc_cpu(p.pid)
                if t_decided is None and first_decided(durable, head):
                    t_decided, cpu_decided = now, cpu
                if t_first_msg is None and r.llen("celery"):
                    t_first_msg = time.time() - t0
                hwm = max(hwm, proc_status(p.pid, "VmHWM") or 0.0)
                if (
                    t_decided is not None
                    and t_all_started is None
                    and type_counts(durable, head).get("RunStarted", 0) >= due_now
                ):
                    t_all_started, cpu_started = time.time() - t0, proc_cpu(p.pid)
                if t_all_started is not None or p.poll() is not None:
                    break
                time.sleep(0.01 if t_decided is None else 0.05)
            if mode == "beat" and p.poll() is None:
                time.sleep(1.0)  # a few idle ticks after the burst, for VmHWM
            hwm = max(hwm, proc_status(p.pid, "VmHWM") or 0.0)
            if mode != "beat":
                p.wait(a.timeout)
        finally:
            stop_process(p)
        child: dict[str, Any] = {}
        if mode != "beat":
            lines = (td / "proc.log").read_text(errors="replace").strip().splitlines()
            with contextlib.suppress(IndexError, ValueError):
                child = json.loads(lines[-1])
        t_ready = read_mark(mark, t0)
        log_tail = tail(td / "proc.log") if t_decided is None else ""
    durable.close()
    r.flushdb()
    rec.add(
        {
            "bench": "startup",
            "dataset": dataset,
            "mode": mode,
            "rep": rep,
            "t_ready_s": t_ready,
            "t_first_decision_s": t_decided,
            "t_first_msg_s": t_first_msg,
            "t_due_started_s": t_all_started,
            "due_at_start": due_now,
            "peak_rss_mib": hwm,
            "cpu_first_decision_s": cpu_decided,
            "cpu_due_started_s": cpu_started,
            **{f"child_{k}": v for k, v in child.items()},
            "log_tail": log_tail,
        }
    )


def child_startup(c: argparse.Namespace) -> None:
    """In a fresh process, after imports: Durable(app, url) + dispatcher() + tick()."""
    t_imp = time.perf_counter()
    import dispatch_app

    app = dispatch_app.app
    t0 = time.perf_counter()
    durable = Durable(app, c.url)
    disp = durable.dispatcher()
    disp.load(durable.now())
    t_load = time.perf_counter() - t0
    disp.tick()
    t_tick = time.perf_counter() - t0
    disp.close()
    durable.close()
    print(json.dumps({"import_s": t0 - t_imp, "load_s": t_load, "first_tick_done_s": t_tick}))


def run(a: argparse.Namespace, rec: Recorder) -> None:
    app = driver_app(a.redis_url)
    n, hist = a.n_startup, a.history_runs
    due_now = min(1000, n)
    with pg_journal(a.pg_url) as url_hist, pg_journal(a.pg_url) as url_none:
        now = utcnow()
        urls = {}
        datasets = [("no_history", url_none, 0), ("history", url_hist, hist)]
        if not hist:  # the same dataset twice: seed it once
            datasets = datasets[:1]
        for dataset, url, runs in datasets:
            d = Durable(app, url)
            print(f"seeding {dataset}: {n} schedules, {runs} past runs each …", flush=True)
            seeded = seed(d, startup_schedules(n, due_now, now, runs), batch_rows=20000)
            d.close()
            snapshot(url)
            rec.add(
                {"bench": "startup_seed", "dataset": dataset, **seeded, "run_events": n * runs * 2}
            )
            urls[dataset] = (url, seeded["head"])
        for rep in range(a.reps):
            for dataset in urls:
                url, head = urls[dataset]
                for mode in ("beat", "inproc"):
                    startup_once(a, dataset, url, head, due_now, mode, rep, rec)


def table(rec: Recorder, a: argparse.Namespace) -> list[str]:
    """The markdown lines of this benchmark's table (none without its rows)."""
    out: list[str] = []
    w = out.append
    st = rec.of("startup")
    if st:
        seeds = rec.of("startup_seed")
        w(f"\n### Start-up: {a.n_startup:,} schedules, PostgreSQL, 1,000 due at start\n")
        if seeds:
            w("| dataset | schedule events stored | of which run events | seeding (s) |")
            w("|---|---|---|---|")
            for s in seeds:
                w(
                    f"| {s['dataset']} | {s['events']:,} | {s['run_events']:,} | {s['seed_total_s']:.1f} |"
                )
            w("")
        w(
            "| dataset | start | reps | launch→ready (s) | launch→first decision stored (s) | "
            "CPU to first decision (s) | launch→first msg (s) | launch→1,000 due started (s) | "
            "CPU to 1,000 started (s) | child: Durable+dispatcher()+load (s) "
            "| child: to end of first tick (s) | peak RSS (MiB) |"
        )
        w("|---|---|---|---|---|---|---|---|---|---|---|---|")
        meds: dict[tuple[str, str], float | None] = {}
        for mode in ("beat", "inproc"):
            for ds in ("no_history", "history"):
                rows = [x for x in st if x["dataset"] == ds and x["mode"] == mode]
                if not rows:
                    continue
                meds[(ds, mode)] = med([x["t_first_decision_s"] for x in rows])
                label = (
                    "celery beat subprocess"
                    if mode == "beat"
                    else "python process: Durable()+dispatcher()+tick()"
                )
                w(
                    f"| {ds} | {label} | {len(rows)} | {fmt([x['t_ready_s'] for x in rows])} "
                    f"| {fmt([x['t_first_decision_s'] for x in rows])} "
                    f"| {fmt([x.get('cpu_first_decision_s') for x in rows])} "
                    f"| {fmt([x['t_first_msg_s'] for x in rows])} "
                    f"| {fmt([x['t_due_started_s'] for x in rows])} "
                    f"| {fmt([x.get('cpu_due_started_s') for x in rows])} "
                    f"| {fmt([x.get('child_load_s') for x in rows], 3)} "
                    f"| {fmt([x.get('child_first_tick_done_s') for x in rows], 3)} "
                    f"| {fmt([x['peak_rss_mib'] for x in rows], 1)} |"
                )
        for mode in ("beat", "inproc"):
            h, z = meds.get(("history", mode)), meds.get(("no_history", mode))
            if h and z:
                w(f"\n{mode}: with history ÷ without = **{h / z:.2f}×** (target ≤ 1.2×)")
    return out
