# ruff: noqa: E501
"""``steady``: ``--n-steady`` schedules of ``Every(--steady-period)`` (10,000 × 10 s by default;
1,000,000 × 1 h for D13's steady state) under a beat subprocess: lag from due time to decision,
to the message on Redis and to the recorded start; the beat process's CPU share and RSS.

The first due times come ``--steady-lead`` seconds after seeding starts (default: 5 s plus
seeding at 2,000 schedules/s), so that a million schedules are stored before any is due; the
window starts ``--warmup`` seconds after the beat's launch or after the first due time,
whichever is later."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select

from celery_durable import Durable
from celery_durable.core.codec import time_from_json
from celery_durable.core.ids import parse_due
from celery_durable.store.journal.schema import events as events_table

from .common import (
    RESULTS,
    Recorder,
    beat_cmd,
    beat_env,
    driver_app,
    percentile,
    pg_journal,
    proc_status,
    read_mark,
    redis_client,
    spawn,
    stop_process,
    tail,
    utcnow,
)
from .consumer import Consumer
from .pyspy import finish_py_spy, start_py_spy
from .seeding import seed, steady_schedules


def run(a: argparse.Namespace, rec: Recorder) -> None:
    n, period = a.n_steady, a.steady_period
    warmup, duration = a.warmup, a.duration
    lead = a.steady_lead if a.steady_lead is not None else 5.0 + n / 2000
    r = redis_client(a.redis_url)
    app = driver_app(a.redis_url)
    with pg_journal(a.pg_url) as url, tempfile.TemporaryDirectory(prefix="bdisp_") as tds:
        td = Path(tds)
        durable = Durable(app, url)
        base = utcnow() - timedelta(seconds=period - lead)
        first_due = (base + timedelta(seconds=period)).timestamp()
        seeded = seed(durable, steady_schedules(n, base, period), batch_rows=20000)
        head = seeded["head"]
        r.flushdb()
        consumer = Consumer(a.redis_url)
        consumer.start()
        mark = td / "ready"
        t0 = time.time()
        p = spawn(beat_cmd(td), beat_env(url, a.redis_url, mark), td / "beat.log")
        import psutil

        proc = psutil.Process(p.pid)
        w0 = max(t0, first_due) + warmup
        w1 = w0 + duration
        cpu0 = cpu1 = None
        hwm = 0.0
        sys_cpu: list[float] = []
        spy = None
        try:
            psutil.cpu_percent(None)
            while time.time() < w1 + 3 and p.poll() is None:
                now = time.time()
                if cpu0 is None and now >= w0:
                    cpu0 = (now, sum(proc.cpu_times()[:2]))
                    psutil.cpu_percent(None)
                    spy = start_py_spy(a, p.pid, "steady", duration)
                if cpu0 is not None and cpu1 is None and now >= w1:
                    cpu1 = (now, sum(proc.cpu_times()[:2]))
                    sys_cpu.append(psutil.cpu_percent(None))
                hwm = max(hwm, proc_status(p.pid, "VmHWM") or 0.0)
                time.sleep(0.25)
        finally:
            finish_py_spy(spy)
            stop_process(p)
            time.sleep(0.5)
            consumer.stop()
            shutil.copy(td / "beat.log", RESULTS / "beat_steady.log")
        alive_to_end = cpu1 is not None
        # Lags: message seen on Redis, decision stored, start recorded (journal).
        redis_lags = []
        for seen, sid_, due_text in consumer.seen:
            if not due_text or not sid_.startswith("e-"):
                continue
            due = parse_due(due_text).timestamp()
            if w0 <= due < w1:
                redis_lags.append(seen - due)
        decided_lags, started_lags = [], []
        q = select(events_table.c.type, events_table.c.data, events_table.c.recorded_at).where(
            events_table.c.category == "schedule",
            events_table.c.position > head,
            events_table.c.type.in_(["RunDecided", "RunStarted"]),
        )
        with durable.journal.engine.connect() as conn:
            for typ, data, recorded in conn.execute(q):
                payload = json.loads(data)
                due = time_from_json(payload["due"]).timestamp()
                if not w0 <= due < w1:
                    continue
                if typ == "RunDecided":
                    decided_lags.append(time_from_json(payload["at"]).timestamp() - due)
                else:
                    started_lags.append(recorded.timestamp() - due)
        durable.close()
        expected = int(duration * n / period)
        cpu_share = ((cpu1[1] - cpu0[1]) / (cpu1[0] - cpu0[0])) if (cpu0 and cpu1) else None
        row = {
            "bench": "steady",
            "n": n,
            "period_s": period,
            "seed_s": seeded["seed_total_s"],
            "duration_s": duration,
            "warmup_s": warmup,
            "expected_runs": expected,
            "seen_runs": len(redis_lags),
            "decided_runs": len(decided_lags),
            "started_runs": len(started_lags),
            "alive_to_end": alive_to_end,
            "beat_cpu_share": cpu_share,
            "system_cpu_pct": sys_cpu[0] if sys_cpu else None,
            "peak_rss_mib": hwm,
            "t_ready_s": read_mark(mark, t0),
            "log_tail": tail(td / "beat.log") if not alive_to_end else "",
        }
        for name, lags in (
            ("redis", redis_lags),
            ("decided", decided_lags),
            ("started", started_lags),
        ):
            for p_ in (50, 90, 99, 100):
                row[f"{name}_lag_p{p_}_s"] = percentile(lags, p_)
        r.flushdb()
        rec.add(row)


def table(rec: Recorder, a: argparse.Namespace) -> list[str]:
    """The markdown lines of this benchmark's table (none without its rows)."""
    out: list[str] = []
    w = out.append
    sd = rec.of("steady")
    if sd:
        x = sd[-1]
        w(
            f"\n### Steady state: {x['n']:,} × Every({x['period_s']:g} s) = "
            f"{x['n'] / x['period_s']:,.0f} runs/s, "
            f"{x['duration_s']:.0f} s window after {x['warmup_s']:.0f} s warm-up, PostgreSQL\n"
        )
        w(
            f"Runs in the window: expected {x['expected_runs']:,}, seen on Redis {x['seen_runs']:,}, "
            f"decided {x['decided_runs']:,}, started recorded {x['started_runs']:,}.\n"
        )
        w("| lag from due time to … | p50 (s) | p90 (s) | p99 (s) | max (s) |")
        w("|---|---|---|---|---|")
        for name, label in (
            ("decided", "decision stored (`RunDecided.at`)"),
            ("redis", "message seen on Redis (consumer thread)"),
            ("started", "start recorded (`RunStarted` recorded_at)"),
        ):
            vals = [x.get(f"{name}_lag_p{p}_s") for p in (50, 90, 99, 100)]
            w(f"| {label} | " + " | ".join("n/a" if v is None else f"{v:.3f}" for v in vals) + " |")
        cpu = x["beat_cpu_share"]
        w(
            f"\nBeat process CPU share over the window: **{'n/a' if cpu is None else f'{cpu * 100:.1f} %'}** "
            f"of one core (machine-wide CPU at the end of the window: {x['system_cpu_pct']} %); "
            f"peak RSS {x['peak_rss_mib']:.1f} MiB."
        )
    return out
