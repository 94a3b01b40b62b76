# ruff: noqa: E501
"""Benchmark driver for the dispatcher and ``DurableScheduler`` (docs/benchmarks-dispatch.md).

    python tests/bench/bench_dispatch.py                      # everything, full size
    python tests/bench/bench_dispatch.py --quick              # small reps, 15 s steady state
    python tests/bench/bench_dispatch.py --only burst,startup --peers-python /tmp/peersvenv/bin/python

Benchmarks (``--only`` takes a comma-separated subset):

* ``peers``     the peer scripts of ``../shared/peers`` run as subprocesses with the peers' venv
                (``--peers-python``): ``bench_beat.py`` (stock PersistentScheduler and RedBeat,
                N overdue entries) and ``bench_publish.py`` (apply_async one by one vs kombu's
                ``producer.batch()``). They FLUSHALL their Redis, so they get a private Redis
                (and PostgreSQL) started with ``../shared/peers/servers.sh`` on free ports,
                stopped afterwards. Without the venv they are skipped with a note.
* ``burst``     N schedules (``Every(60 s)``, created 61 s before, so all have the same due
                time 1 s in the past) on a fresh PostgreSQL schema and on a SQLite file:
                (a) a real ``celery beat -S celery_durable.beat:DurableScheduler`` subprocess,
                launch → all N on the Redis list (LLEN) → all N ``RunStarted`` in the journal;
                (b) the in-process ``dispatcher().tick()`` loop in a fresh process, with a
                breakdown of where the time goes (decide / store / publish).
* ``startup``   100,000 schedules with 1,000,000 stored run events vs the same 100,000
                schedules without history; 1,000 of them are due at start. Launch → first
                ``RunDecided`` committed (seen by another connection), for a beat subprocess and
                for ``Durable(...)`` + ``dispatcher()`` + ``tick()`` in a fresh process.
* ``steady``    10,000 ``Every(10 s)`` schedules spread evenly (1,000 runs/s; ``--n-steady``,
                ``--steady-period``: 1,000,000 × 3,600 s for D13) for ``--duration``
                seconds under a beat subprocess: lag from due time to the message being on Redis
                (a consumer thread pops the list and reads the ``durable_due`` header), to the
                decision (``RunDecided.at``) and to the recorded start (``RunStarted``'s
                ``recorded_at``); CPU share of the beat process (psutil).
* ``memory``    peak RSS (VmHWM) of a beat process with 100,000 schedules all due at once (every
                state in memory: the worst case); the start-up runs report VmHWM too.
* ``create_many`` ``durable.schedules.create_many`` of 10,000 and 100,000 specs on a fresh
                PostgreSQL schema, in a fresh process: schedules/s, wall and CPU seconds.
* ``visibility`` with a beat running over 1,000 idle schedules, the driver creates a schedule
                (``Once`` due now) through ``durable.schedules.create``: time from ``create()``
                returning to its message on Redis; 50 samples, random gaps.

Raw rows go to ``tests/bench/results/dispatch_<stamp>.jsonl`` (git-ignored); markdown tables
with median (min–max) are printed at the end. PostgreSQL: a fresh schema per repetition
(``bdisp_<hex>``), dropped afterwards. Redis: ``--redis-url`` (default db 9 of the test server;
only that db is flushed, never db 0). Every subprocess has a timeout and is stopped at the end.

Each benchmark is a module of ``tests/bench/dispatch_bench/`` with ``run(a, rec)`` and
``table(rec, a)``; this file only parses the command line, runs the chosen ones in a fixed order
and prints their tables.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from dispatch_bench import (  # noqa: E402
    burst,
    create_many,
    floor,
    memory,
    peers,
    startup,
    steady,
    visibility,
)
from dispatch_bench.common import (  # noqa: E402
    ALL,
    DEFAULT_PEERS_DIR,
    DEFAULT_PG,
    DEFAULT_REDIS,
    RESULTS,
    Recorder,
    _children,
    byte_compile,
    library_fingerprint,
    start_private_redis,
    stop_process,
)


def tables(rec: Recorder, a: argparse.Namespace) -> str:
    """Every benchmark's markdown table, in the order of the page (nothing for one not run)."""
    parts: list[Callable[[Recorder, argparse.Namespace], list[str]]] = [
        burst.table,  # with the peers of the same run
        burst.tick_table,
        startup.table,
        steady.table,
        memory.table,
        visibility.table,
        create_many.table,
    ]
    return "\n".join(line for part in parts for line in part(rec, a))


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="1 rep, 15 s steady state, peers: RedBeat only, 1 rep"
    )
    ap.add_argument("--only", default=",".join(ALL), help=f"comma-separated subset of {ALL}")
    ap.add_argument("--peers-python", default="/tmp/peersvenv/bin/python")
    ap.add_argument("--peers-dir", default=str(DEFAULT_PEERS_DIR))
    ap.add_argument("--peer-reps", type=int, default=None)
    ap.add_argument("--peer-schedulers", default=None)
    ap.add_argument("--peer-timeout", type=float, default=150.0)
    ap.add_argument("--tables-from", default=None, help="print the tables of a results .jsonl")
    ap.add_argument("--tables-extra", action="append", help="more .jsonl rows for --tables-from")
    ap.add_argument("--pg-url", default=DEFAULT_PG)
    ap.add_argument(
        "--redis-url",
        default="private",
        help=f"broker for the durable benchmarks (db != 0), e.g. {DEFAULT_REDIS}; default "
        "'private': a redis-server started on a free port for this run",
    )
    ap.add_argument("--backends", default="postgres,sqlite")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--n-burst", type=int, default=10_000)
    ap.add_argument(
        "--burst-sizes",
        default=None,
        help="comma-separated burst sizes (default: --n-burst), e.g. 10000,100000",
    )
    ap.add_argument("--n-create-many", type=int, default=100_000, help="largest create_many size")
    ap.add_argument("--n-startup", type=int, default=100_000)
    ap.add_argument(
        "--history-runs",
        type=int,
        default=5,
        help="past runs per schedule in the start-up dataset (2 events each)",
    )
    ap.add_argument("--n-steady", type=int, default=10_000)
    ap.add_argument("--steady-period", type=float, default=10.0, help="Every(...) of steady (s)")
    ap.add_argument(
        "--steady-lead", type=float, default=None, help="seconds from seeding to the first due"
    )
    ap.add_argument("--n-memory", type=int, default=100_000)
    ap.add_argument("--duration", type=float, default=None, help="steady-state window (s)")
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--vis-samples", type=int, default=50)
    ap.add_argument("--timeout", type=float, default=180.0, help="per measured process (s)")
    ap.add_argument("--poll", type=float, default=0.02, help="burst polling interval (s)")
    ap.add_argument(
        "--py-spy",
        nargs="?",
        const="/tmp/peersvenv/bin/py-spy",
        default=None,
        help="sample the beat process of steady/memory with py-spy (path to py-spy)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also run the in-process burst under cProfile (results/profile_*.txt)",
    )
    ap.add_argument(
        "--no-byte-compile",
        action="store_true",
        help="do not byte-compile celery_durable/ first (as pip does on install): with "
        "PYTHONDONTWRITEBYTECODE set and no __pycache__, each launch then compiles it",
    )
    a = ap.parse_args(argv)
    a.reps = a.reps or (1 if a.quick else 3)
    a.peer_reps = a.peer_reps or (1 if a.quick else 3)
    a.peer_schedulers = a.peer_schedulers or ("redbeat" if a.quick else "persistent,redbeat")
    a.duration = a.duration or (15.0 if a.quick else 120.0)
    a.backends = [b for b in a.backends.split(",") if b]
    a.burst_sizes = [int(x) for x in (a.burst_sizes or str(a.n_burst)).split(",") if x]
    a.only = [b for b in a.only.split(",") if b]
    unknown = set(a.only) - set(ALL)
    if unknown:
        ap.error(f"unknown benchmark(s) {sorted(unknown)}; choose from {ALL}")
    return a


def child_main(argv: Sequence[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["tick", "startup", "floor", "create_many"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--broker", required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--head", type=int, required=True)
    ap.add_argument("--profile-out", default=None)
    ap.add_argument("--variant", default=None)
    c = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    children = {
        "tick": burst.child_tick,
        "startup": startup.child_startup,
        "floor": floor.child_floor,
        "create_many": create_many.child_create_many,
    }
    children[c.kind](c)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        child_main(argv[1:])
        return
    a = parse(argv)
    if a.tables_from:
        rec = Recorder(Path(os.devnull))
        rec.rows = [json.loads(line) for line in Path(a.tables_from).read_text().splitlines()]
        for extra in a.tables_extra or []:
            rec.rows += [json.loads(line) for line in Path(extra).read_text().splitlines()]
        print(tables(rec, a))
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    rec = Recorder(RESULTS / f"dispatch_{stamp}.jsonl")
    print(f"raw rows: {rec.path}", flush=True)
    compiled = {"byte_compiled": False} if a.no_byte_compile else byte_compile()
    rec.add(
        {
            "bench": "meta",
            **compiled,
            "dont_write_bytecode": os.environ.get("PYTHONDONTWRITEBYTECODE", ""),
            "library": library_fingerprint(),
            "argv": sys.argv,
            "nproc": os.cpu_count(),
            "python": sys.version.split()[0],
            "redis_url": a.redis_url,
            "pg_url": a.pg_url,
            "only": a.only,
            "quick": a.quick,
        }
    )

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    steps = {
        "peers": lambda: peers.run(a, rec, stamp),
        "burst": lambda: burst.run(a, rec),
        "startup": lambda: startup.run(a, rec),
        "steady": lambda: steady.run(a, rec),
        "memory": lambda: memory.run(a, rec),
        "visibility": lambda: visibility.run(a, rec),
        "create_many": lambda: create_many.run(a, rec),
    }
    redis_server = None
    if a.redis_url == "private":
        redis_server, a.redis_url = start_private_redis()
        rec.add({"bench": "meta_redis", "redis_url": a.redis_url})
    try:
        for name in ALL:
            if name in a.only:
                print(f"\n== {name} ({time.strftime('%H:%M:%S')}) ==", flush=True)
                t = time.perf_counter()
                try:
                    steps[name]()
                except Exception as exc:  # one failing benchmark must not lose the others
                    import traceback

                    traceback.print_exc()
                    rec.add({"bench": "error", "step": name, "error": repr(exc)})
                print(f"== {name} done in {time.perf_counter() - t:.0f} s", flush=True)
    finally:
        for p in list(_children):
            stop_process(p)
        if redis_server is not None:
            stop_process(redis_server)
            shutil.rmtree(getattr(redis_server, "bench_workdir", ""), ignore_errors=True)
    md = tables(rec, a)
    print("\n" + md)
    (RESULTS / f"dispatch_{stamp}.md").write_text(md + "\n")


if __name__ == "__main__":
    main()
