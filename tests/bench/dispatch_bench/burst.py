# ruff: noqa: E501
"""``burst``: N schedules all due at once, under a real ``celery beat`` subprocess (due at its
launch, and due while it runs: :mod:`.burst_running`) and under the in-process
``dispatcher().tick()`` loop (with where the time goes)."""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery_durable import Durable

from . import burst_running, floor
from .common import (
    RESULTS,
    ROOT,
    Recorder,
    beat_cmd,
    beat_env,
    child_cmd,
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
from .peers import peer_bounds
from .pyspy import finish_py_spy, start_py_spy
from .seeding import burst_schedules, last_recorded, seed, type_counts


def burst_beat_once(
    a: argparse.Namespace, backend: str, n: int, rep: int, rec: Recorder, bench: str = "burst_beat"
) -> None:
    r = redis_client(a.redis_url)
    app = driver_app(a.redis_url)
    with journal(backend, a.pg_url) as url, tempfile.TemporaryDirectory(prefix="bdisp_") as tds:
        td = Path(tds)
        durable = Durable(app, url)
        seeded = seed(durable, burst_schedules(n, utcnow() - timedelta(seconds=61)))
        head = seeded["head"]
        r.flushdb()
        mark = td / "ready"
        t0 = time.time()
        p = spawn(beat_cmd(td), beat_env(url, a.redis_url, mark), td / "beat.log")
        spy = start_py_spy(a, p.pid, bench, a.timeout) if bench == "memory_burst" else None
        t_first = t_all_q = t_all_started = None
        cpu_all_started = None
        hwm = 0.0
        llen = 0
        last_count = 0.0
        counts: dict[str, int] = {}
        try:
            while True:
                now = time.time() - t0
                if p.poll() is not None or now > a.timeout:
                    break
                llen = r.llen("celery")
                h = proc_status(p.pid, "VmHWM")
                hwm = max(hwm, h or 0.0)
                if llen and t_first is None:
                    t_first = now
                if llen >= n and t_all_q is None:
                    t_all_q = now
                # The journal is counted only once the queue is full (or once a second, to
                # see progress): a COUNT every 20 ms would compete with beat for the 2 cores.
                if llen >= n or now - last_count >= 1.0:
                    last_count = now
                    counts = type_counts(durable, head)
                    if counts.get("RunStarted", 0) >= n and t_all_started is None:
                        t_all_started, cpu_all_started = time.time() - t0, proc_cpu(p.pid)
                if t_all_q is not None and t_all_started is not None:
                    break
                time.sleep(a.poll)
            hwm = max(hwm, proc_status(p.pid, "VmHWM") or 0.0)
        finally:
            finish_py_spy(spy)
            stop_process(p)
            durable.close()
        t_ready = read_mark(mark, t0)
        counts = type_counts(durable, head)
        t_all_decided = last_recorded(durable, head, "RunDecided", t0)
        t_first_decided = last_recorded(durable, head, "RunDecided", t0, first=True)
        t_last_started_rec = last_recorded(durable, head, "RunStarted", t0)
        llen = r.llen("celery")
        r.flushdb()
        disp = (t_all_q - t_first) if (t_all_q and t_first is not None) else None
        rec.add(
            {
                "bench": bench,
                "backend": backend,
                "n": n,
                "rep": rep,
                "t_ready_s": t_ready,
                "t_first_s": t_first,
                "t_all_queued_s": t_all_q,
                "t_first_decided_s": t_first_decided,
                "t_all_decided_s": t_all_decided,
                "t_all_started_s": t_all_started,
                "cpu_all_started_s": cpu_all_started,
                "t_last_started_recorded_at_s": t_last_started_rec,
                "runs_per_s_e2e": (n / t_all_started) if t_all_started else None,
                "dispatch_s": disp,
                "dispatch_rate": ((n - 1) / disp) if disp else None,
                "peak_rss_mib": hwm,
                "llen_end": llen,
                "decided": counts.get("RunDecided", 0),
                "started": counts.get("RunStarted", 0),
                "timed_out": t_all_started is None,
                "seed_s": seeded["seed_total_s"],
                "log_tail": tail(td / "beat.log") if t_all_started is None else "",
            }
        )


def burst_tick_once(
    a: argparse.Namespace,
    backend: str,
    n: int,
    rep: int,
    rec: Recorder,
    profile: Path | None = None,
) -> None:
    r = redis_client(a.redis_url)
    app = driver_app(a.redis_url)
    with journal(backend, a.pg_url) as url:
        durable = Durable(app, url)
        seeded = seed(durable, burst_schedules(n, utcnow() - timedelta(seconds=61)))
        durable.close()
        r.flushdb()
        args = [
            "tick",
            "--url",
            url,
            "--broker",
            a.redis_url,
            "--n",
            str(n),
            "--head",
            str(seeded["head"]),
        ]
        if profile is not None:
            args += ["--profile-out", str(profile)]
        env = beat_env(url, a.redis_url, Path("/dev/null"))
        t0 = time.time()
        out = subprocess.run(
            child_cmd(*args), env=env, cwd=str(ROOT), capture_output=True, timeout=a.timeout + 60
        )
        wall = time.time() - t0
        llen = r.llen("celery")
        r.flushdb()
    try:
        res = json.loads(out.stdout.decode().strip().splitlines()[-1])
    except (IndexError, ValueError):
        print(out.stdout.decode()[-2000:], out.stderr.decode()[-3000:], file=sys.stderr)
        res = {"error": True}
    rec.add(
        {
            "bench": "burst_tick" if profile is None else "burst_tick_profiled",
            "backend": backend,
            "n": n,
            "rep": rep,
            "llen_end": llen,
            "process_wall_s": wall,
            **res,
        }
    )


def child_tick(c: argparse.Namespace) -> None:
    """In a fresh process: Durable + dispatcher(), load, then tick() until all N started."""
    import dispatch_app

    durable = dispatch_app.durable
    acc = {"decide_s": 0.0, "append_s": 0.0, "send_s": 0.0, "states_s": 0.0}
    t0 = time.perf_counter()
    disp = durable.dispatcher()

    def timed(name: str, fn: Any, materialise: bool = False) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            result = fn(*args, **kwargs)
            if materialise:
                result = iter(list(result))
            acc[name] += time.perf_counter() - t
            return result

        return wrapper

    recorder, publisher, cache = disp.recorder, disp.publisher, disp.cache
    recorder.decide = timed("decide_s", recorder.decide)  # type: ignore[method-assign]
    recorder.append = timed("append_s", recorder.append)  # type: ignore[method-assign]
    publisher.send = timed("send_s", publisher.send, materialise=True)  # type: ignore[method-assign]
    cache.states_of = timed("states_s", cache.states_of)  # type: ignore[method-assign]
    t_ctor = time.perf_counter() - t0
    disp.load(durable.now())
    t_load = time.perf_counter() - t0
    profiler = cProfile.Profile() if c.profile_out else None
    ticks = 0
    t_ticks0 = time.perf_counter()
    cpu0 = time.process_time()
    started = 0
    while ticks < 50:
        if profiler:
            profiler.enable()
        disp.tick()
        if profiler:
            profiler.disable()
        ticks += 1
        started = type_counts(durable, c.head).get("RunStarted", 0)
        if started >= c.n:
            break
    t_ticks = time.perf_counter() - t_ticks0
    cpu_ticks = time.process_time() - cpu0
    total = time.perf_counter() - t0
    if profiler:
        buf = io.StringIO()
        stats = pstats.Stats(profiler, stream=buf)
        stats.sort_stats("cumulative").print_stats(45)
        buf.write("\n\n=== by internal time ===\n")
        stats.sort_stats("tottime").print_stats(30)
        Path(c.profile_out).write_text(buf.getvalue())
    disp.close()
    durable.close()
    store = acc["append_s"] - acc["decide_s"]
    print(
        json.dumps(
            {
                "ctor_s": t_ctor,
                "load_s": t_load,
                "ticks": ticks,
                "ticks_s": t_ticks,
                "ticks_cpu_s": cpu_ticks,
                "total_s": total,
                "decide_s": acc["decide_s"],
                "store_s": store,
                "send_s": acc["send_s"],
                "states_s": acc["states_s"],
                "other_s": t_ticks - acc["append_s"] - acc["send_s"] - acc["states_s"],
                "started": started,
                "runs_per_s_inproc": c.n / total if total else None,
                "profiled": bool(profiler),
            }
        )
    )


def run(a: argparse.Namespace, rec: Recorder) -> None:
    for n in a.burst_sizes:
        for rep in range(a.reps):
            floor.run(a, rec, n, rep)  # the same run's floors, beside each repetition
            for backend in a.backends:
                burst_beat_once(a, backend, n, rep, rec)
                burst_running.once(a, backend, n, rep, rec)
                burst_tick_once(a, backend, n, rep, rec)
    if a.profile:
        for backend in a.backends:
            burst_tick_once(
                a, backend, a.n_burst, 0, rec, profile=RESULTS / f"profile_burst_tick_{backend}.txt"
            )


def table(rec: Recorder, a: argparse.Namespace) -> list[str]:
    """The markdown lines of this benchmark's tables, one per burst size (none without rows)."""
    sizes = sorted({x["n"] for x in rec.of("burst_beat")} | set(getattr(a, "burst_sizes", [])))
    return [line for n in sizes or [a.n_burst] for line in _table(rec, a, n)]


def _table(rec: Recorder, a: argparse.Namespace, n: int) -> list[str]:
    out: list[str] = []
    w = out.append
    peers = rec.of("peer_beat")
    pub = rec.of("peer_publish")
    bb = {b: rec.of("burst_beat", backend=b, n=n) for b in ("postgres", "sqlite", "mysql")}
    if peers or any(bb.values()) or rec.of("publish_floor", n=n):
        w(f"\n### Burst: {n:,} schedules all due at once → on Redis and recorded (same run)\n")
        w(
            "| scheduler | journal | reps | launch→ready (s) | launch→1st msg (s) | launch→all N "
            "on Redis (s) | launch→all N started recorded (s) | runs/s end to end | msgs/s while "
            "dispatching | peak RSS (MiB) | timed out |"
        )
        w("|---|---|---|---|---|---|---|---|---|---|---|")
        for b, rows in bb.items():
            if rows:
                w(
                    f"| **DurableScheduler** | {b} | {len(rows)} | {fmt([x['t_ready_s'] for x in rows])} "
                    f"| {fmt([x['t_first_s'] for x in rows])} | {fmt([x['t_all_queued_s'] for x in rows])} "
                    f"| {fmt([x['t_all_started_s'] for x in rows])} "
                    f"| {fmt([x['runs_per_s_e2e'] for x in rows], 0)} "
                    f"| {fmt([x['dispatch_rate'] for x in rows], 0)} "
                    f"| {fmt([x['peak_rss_mib'] for x in rows], 1)} "
                    f"| {sum(1 for x in rows if x['timed_out'])} |"
                )
        for sched in ("persistent", "redbeat"):
            rows = [x for x in peers if x.get("scheduler") == sched and x.get("n") == n]
            if rows:
                for x in rows:
                    peer_bounds(x, n, a.peer_timeout)
                late = any(x["timed_out"] for x in rows)
                ge, le = ("≥ ", "≤ ") if late else ("", "")
                queued = ", ".join(f"{x['queued_at_end']:,}" for x in rows if x["timed_out"])
                w(
                    f"| {sched} (peer) | – | {len(rows)} | {fmt([x['t_ready_s'] for x in rows])} "
                    f"| {fmt([x['t_first_s'] for x in rows])} "
                    f"| {ge}{fmt([x['t_all_bound_s'] for x in rows])} "
                    f"| – | {le}{fmt([x['e2e_rate_bound'] for x in rows], 0)} "
                    f"| {le}{fmt([x['rate_bound'] for x in rows], 0)} "
                    f"| {fmt([x['peak_rss_mib'] for x in rows], 1)} "
                    f"| {sum(1 for x in rows if x['timed_out'])}"
                    + (f" (queued when stopped: {queued})" if queued else "")
                    + " |"
                )
        if pub:
            w("\nPublish floor (peer `bench_publish.py`, same run, one process, N messages):\n")
            w("| variant | reps | wall (s) | msgs/s |")
            w("|---|---|---|---|")
            for v in ("apply_async", "apply_async_producer", "apply_async_batch"):
                rows = [x for x in pub if x.get("variant") == v]
                if rows:
                    w(
                        f"| {v} | {len(rows)} | {fmt([x['wall_s'] for x in rows], 3)} "
                        f"| {fmt([x['msgs_per_s'] for x in rows], 0)} |"
                    )
        out.extend(floor.table_lines(rec, n))
        out.extend(cold_lines(rec, n))
        out.extend(burst_running.table_lines(rec, n))
        pg = bb["postgres"]
        if pg:
            d_all = med([x["t_all_started_s"] for x in pg])
            d_rate = med([x["runs_per_s_e2e"] for x in pg])
            d_disp = med([x["dispatch_rate"] for x in pg])
            w(
                "\nRatios, DurableScheduler on PostgreSQL vs each peer (medians of the same run; "
                "> 1× means the durable scheduler is faster):\n"
            )
            w(
                "| compared with | launch→all N time: peer ÷ durable (durable: all *started "
                "recorded*) | end-to-end rate: durable runs/s ÷ peer msgs/s | while dispatching: "
                "durable msgs/s ÷ peer msgs/s |"
            )
            w("|---|---|---|---|")
            for sched in ("redbeat", "persistent"):
                rows = [x for x in peers if x.get("scheduler") == sched and x.get("n") == n]
                if rows:
                    for x in rows:
                        peer_bounds(x, n, a.peer_timeout)
                    ge = "≥ " if any(x["timed_out"] for x in rows) else ""
                    t = med([x["t_all_bound_s"] for x in rows])
                    w(
                        f"| {sched} | {ge}{ratio(t, d_all)} | {ge}{ratio(d_rate, n / t if t else None)} "
                        f"| {ge}{ratio(d_disp, med([x['rate_bound'] for x in rows]))} |"
                    )
            for v in ("apply_async_batch", "apply_async_batch_cold", "lpush_pipeline"):
                rates = floor.floor_rate(rec, n, v)
                if rates:
                    f = med(rates)
                    what = (
                        "from its `Popen`: process start, imports of Celery and the app, connect"
                        if v.endswith("_cold")
                        else "publishing only: no process start, no journal"
                    )
                    w(
                        f"| floor `{v}` (same run, {what}) "
                        f"| {ratio(n / f if f else None, d_all)} | **{ratio(d_rate, f)}** "
                        f"| {'–' if v.endswith('_cold') else ratio(d_disp, f)} |"
                    )
            for v in ("apply_async_producer", "apply_async_batch"):
                rows = [x for x in pub if x.get("variant") == v]
                if rows:
                    t = med([x["wall_s"] for x in rows])
                    f = med([x["msgs_per_s"] for x in rows])
                    w(
                        f"| `{v}` publishing only (no process start, no journal) | {ratio(t, d_all)} "
                        f"| {ratio(d_rate, f)} | {ratio(d_disp, f)} |"
                    )
    return out


def cold_lines(rec: Recorder, n: int) -> list[str]:
    """Each launch burst on PostgreSQL beside the floors of its repetition: the floor whose
    clock starts once it is connected (warm) and the one whose clock starts at its ``Popen``
    (cold), both ratios side by side, and the same for CPU seconds (the floor's over the
    beat's: > 1× when the beat needs less), which depend less on the machine's load
    (2026-12-06)."""
    rows = [x for x in rec.of("burst_beat", backend="postgres", n=n) if x["t_all_started_s"]]
    if not rows:
        return []
    out = [
        f"\nFrom a cold launch, {n:,} due, PostgreSQL: each repetition beside its floors "
        "(warm: clock from connected; cold: clock from `Popen`, imports of Celery and the app "
        "counted):\n",
        "| rep | load (1 min) | launch→ready (s) | launch→1st decision stored (s) | launch→1st msg (s) "
        "| launch→all N started recorded (s) | beat CPU to then (s) | floor warm wall (CPU) s "
        "| floor cold wall (CPU) s | **cold beat ÷ warm floor** | **cold beat ÷ cold floor** "
        "| CPU: warm floor ÷ beat | CPU: cold floor ÷ beat |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in rows:
        warm = rec.of("publish_floor", n=n, rep=x["rep"], variant="apply_async_batch")
        cold = rec.of("publish_floor", n=n, rep=x["rep"], variant="apply_async_batch_cold")
        w, c = (f[0] if f and "wall_s" in f[0] else {} for f in (warm, cold))
        out.append(
            f"| {x['rep']} | {x.get('loadavg_1m', 0.0):.2f} | {fmt([x['t_ready_s']])} "
            f"| {fmt([x.get('t_first_decided_s')])} | {fmt([x['t_first_s']])} "
            f"| {fmt([x['t_all_started_s']])} | {fmt([x['cpu_all_started_s']])} "
            f"| {fmt([w.get('wall_s')])} ({fmt([w.get('cpu_s')])}) "
            f"| {fmt([c.get('wall_s')])} ({fmt([c.get('cpu_s')])}) "
            f"| **{ratio(x['runs_per_s_e2e'], w.get('msgs_per_s'))}** "
            f"| **{ratio(x['runs_per_s_e2e'], c.get('msgs_per_s'))}** "
            f"| {ratio(w.get('cpu_s'), x['cpu_all_started_s'])} "
            f"| {ratio(c.get('cpu_s'), x['cpu_all_started_s'])} |"
        )
    return out


def tick_table(rec: Recorder, a: argparse.Namespace) -> list[str]:
    """The in-process loop's table."""
    out: list[str] = []
    w = out.append
    tk = rec.of("burst_tick")
    if tk:
        w("\n### Burst, in-process `dispatcher().tick()` loop (fresh process, N due)\n")
        w(
            "Time spent in each part, summed over both threads: the starts of one round are "
            "stored by the writer thread while the next round is decided and sent, so the parts "
            "add up to more than the tick loop. CPU = the process's CPU time in the loop.\n"
        )
        w(
            "| N | journal | reps | Durable+dispatcher()+load (s) | ticks | tick loop (s) | CPU (s) | "
            "decide (s) | store: events+commit (s) | publish (s) | index reads (s) | runs/s |"
        )
        w("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for n, b in [
            (n, b) for n in sorted({x["n"] for x in tk}) for b in ("postgres", "sqlite", "mysql")
        ]:
            rows = [x for x in tk if x["backend"] == b and x["n"] == n and "ticks_s" in x]
            if rows:
                w(
                    f"| {n:,} | {b} | {len(rows)} | {fmt([x['load_s'] for x in rows], 3)} "
                    f"| {fmt([x['ticks'] for x in rows], 0)} | {fmt([x['ticks_s'] for x in rows])} "
                    f"| {fmt([x.get('ticks_cpu_s') for x in rows])} "
                    f"| {fmt([x['decide_s'] for x in rows])} | {fmt([x['store_s'] for x in rows])} "
                    f"| {fmt([x['send_s'] for x in rows])} | {fmt([x['states_s'] for x in rows])} "
                    f"| {fmt([x['runs_per_s_inproc'] for x in rows], 0)} |"
                )
    return out
