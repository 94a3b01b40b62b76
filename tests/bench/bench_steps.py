"""Per-step cost of durable steps, against the floor and DBOS Transact (docs/durable-tasks.md).

For each database (SQLite file in WAL mode with ``synchronous=FULL`` and ``NORMAL``, a fresh
PostgreSQL schema, and with ``--backends mysql`` a fresh MariaDB/MySQL database) and each
repetition, in one process:

* ``durable`` -- a 1,000-step durable task run through ``task.apply()`` (the whole delivery
  machinery: read, claim, steps, end); per-step latency measured around each step call in the
  body, plus statements and commits counted (SQLite: as SQLite runs them, by its trace;
  PostgreSQL and MySQL: with SQLAlchemy events on the journal's engine);
* ``floor``   -- 1,000 bare single-row ``INSERT`` + ``COMMIT`` with SQLAlchemy Core into a side
  table with the same settings (same SQLite directory and pragmas, same PostgreSQL schema);
  after the durable run, or with ``--interleave`` one floor transaction after each step inside
  the body (both then see the same load at the same moment: steadier ratios on a shared
  machine, where the load changes between a run and the floor measured after it);
* ``replay``  -- SQLite: a second delivery of a run whose 1,000 step results are all stored
  (the first delivery was killed after the last step): one read, 1,000 steps served from memory,
  one final append; wall clock and the process's CPU time (which waiting for a CPU does not add to).

Then, as subprocesses, the peers' own scripts (not copied): ``bench_floor.py`` and
``bench_dbos.py`` from ``--peers`` (default ``/work/shared/peers``) run by the Python of
``--peers-venv`` (default ``/tmp/dbosvenv``, made with ``pip install dbos==3.4.0 psycopg[binary]``).
Without that venv the DBOS column is skipped with a note.

Usage::

    python tests/bench/bench_steps.py [--steps 1000] [--reps 3] [--pg-url URL]
        [--peers-venv /tmp/dbosvenv] [--no-peers] [--interleave]
    python tests/bench/bench_steps.py --backends mysql --no-peers \
        --mysql-url mysql+pymysql://root@127.0.0.1:3306/test_h6
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from celery import Celery
from sqlalchemy import event

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from celery_durable import Durable  # noqa: E402
from celery_durable.store.journal.urls import normalize_url  # noqa: E402

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_MYSQL = "mysql+pymysql://root@127.0.0.1:3306/test"


class Crash(BaseException):
    """Stands for a worker killed after the body's last step (nothing stored for it)."""


def build_app(
    url: str, synchronous: str, around: dict[str, Any] | None = None
) -> tuple[Durable, Any, Any, list[float]]:
    """The app, its step task, the crash switch and the latencies list. ``around["span"]``,
    when set, is called per step for a context manager to run the step in (bench_tracing's
    in-situ floor: a bare SDK span around an untraced step); ``around["between"]``, when set,
    is called after each step, outside its timing (``--interleave``: one floor transaction)."""
    app = Celery(f"bench-{uuid.uuid4().hex[:6]}", broker="memory://")
    app.conf.durable_sqlite_synchronous = synchronous
    # The replay benchmark moves the clock past the crashed delivery's lease.
    crash: dict[str, Any] = {"on": False, "offset": 0.0}
    durable = Durable(
        app, url, clock=lambda: datetime.now(timezone.utc) + timedelta(seconds=crash["offset"])
    )
    latencies: list[float] = []

    @durable.step
    def work(i: int) -> int:
        return i + 1

    @durable.task(name="bench.steps")
    def steps(n: int) -> int:
        pc = time.perf_counter
        lat = latencies
        acc = 0
        wrap = None if around is None else around.get("span")
        between = None if around is None else around.get("between")
        for i in range(n):
            t = pc()
            if wrap is None:
                acc += work(i)
            else:
                with wrap(i):
                    acc += work(i)
            lat.append(pc() - t)
            if between is not None:
                between(i)
        if crash["on"]:
            raise Crash()
        return acc

    return durable, steps, crash, latencies


def count_sql(engine: sa.Engine) -> dict[str, int]:
    """Count statements and commits on connections of ``engine`` (the journal's own engine,
    whose listeners the engine it lends out, ``journal.engine``, shares); not the class
    ``Engine``'s, which would also count the floor's and, on SQLite, change the journal's path
    (:func:`trace_sqlite`)."""
    counts = {"statements": 0, "commits": 0}

    def on_exec(*_a: Any) -> None:
        counts["statements"] += 1

    def on_commit(*_a: Any) -> None:
        counts["commits"] += 1

    event.listen(engine, "before_cursor_execute", on_exec)
    event.listen(engine, "commit", on_commit)
    return counts


def trace_sqlite(engine: sa.Engine) -> dict[str, int]:
    """Count statements and commits as SQLite runs them, on every connection ``engine``'s pool
    makes from now on (call it before the first one). Not with SQLAlchemy's statement events:
    a listener of those makes the journal send its hot statements through SQLAlchemy
    (celery_durable/store/journal/direct.py), which is not what a worker runs.

    SQLite's trace reports a statement once more for each trigger it fires (the events table's
    gap guard), with the same text: consecutive repeats count once. A commit is a ``COMMIT``
    or a write outside a transaction (autocommit: its own transaction)."""
    counts = {"statements": 0, "commits": 0}

    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        last: list[str | None] = [None]

        def traced(sql: str) -> None:
            if sql == last[0]:
                return
            last[0] = sql
            counts["statements"] += 1
            head = sql.lstrip()[:6].upper()
            if head == "COMMIT" or (
                head in ("INSERT", "UPDATE", "DELETE", "REPLAC") and not dbapi_conn.in_transaction
            ):
                counts["commits"] += 1

        dbapi_conn.set_trace_callback(traced)

    event.listen(engine.pool, "connect", on_connect)
    return counts


def floor_engine(kind: str, url: str, directory: str) -> sa.Engine:
    if kind in ("postgres", "mysql"):
        return sa.create_engine(normalize_url(url), pool_size=1)
    path = os.path.join(directory, f"floor_{kind}.sqlite")
    engine = sa.create_engine(f"sqlite:///{path}")
    synchronous = "FULL" if kind == "sqlite_full" else "NORMAL"

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _rec: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.close()

    return engine


_META = sa.MetaData()
_FLOOR = sa.Table(
    "bench_floor",
    _META,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("workflow_id", sa.String(64), nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("output", sa.Text),
    sa.Column("created_at", sa.Float, nullable=False),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)


def time_floor(engine: sa.Engine, n: int, tag: str) -> list[float]:
    ins = _FLOOR.insert()
    pc = time.perf_counter
    lat = []
    for i in range(n):
        t = pc()
        with engine.begin() as c:
            c.execute(
                ins, {"workflow_id": tag, "step": i, "output": "2", "created_at": time.time()}
            )
        lat.append(pc() - t)
    return lat


def median_us(values: list[float]) -> float:
    return statistics.median(values) * 1e6


def fresh_pg_schema(url: str) -> tuple[str, str]:
    name = f"bench_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(normalize_url(url))
    with engine.begin() as c:
        c.exec_driver_sql(f"CREATE SCHEMA {name}")
    engine.dispose()
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{name}", name


def fresh_mysql_database(url: str) -> tuple[str, str]:
    base = normalize_url(url)
    name = f"{base.database}_bench_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        c.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    engine.dispose()
    return base.set(database=name).render_as_string(hide_password=False), name


def drop_mysql_database(url: str, name: str) -> None:
    engine = sa.create_engine(normalize_url(url), isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        c.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
    engine.dispose()


def drop_pg_schema(url: str, name: str) -> None:
    engine = sa.create_engine(normalize_url(url))
    with engine.begin() as c:
        c.exec_driver_sql(f"DROP SCHEMA IF EXISTS {name} CASCADE")
    engine.dispose()


def bench_backend(
    kind: str, url: str, directory: str, steps_n: int, reps: int, interleave: bool = False
) -> dict[str, Any]:
    synchronous = {"sqlite_full": "FULL", "sqlite_normal": "NORMAL"}.get(kind, "FULL")
    floor = floor_engine(kind, url, directory)
    _META.create_all(floor)
    interleaved: list[float] = []
    around: dict[str, Any] | None = None
    if interleave:
        ins = _FLOOR.insert()

        def between(i: int) -> None:
            t = time.perf_counter()
            with floor.begin() as c:
                c.execute(ins, {"workflow_id": "between", "step": i, "output": "2",
                                "created_at": time.time()})  # fmt: skip
            interleaved.append(time.perf_counter() - t)

        around = {"between": between}
    durable, task, crash, latencies = build_app(url, synchronous, around)
    traced = trace_sqlite(durable.journal.engine) if kind.startswith("sqlite") else None
    # warm-up: connections, tables, caches
    task.apply((50,), task_id=f"warm-{uuid.uuid4()}").get()
    time_floor(floor, 50, "warm")
    counts = traced if traced is not None else count_sql(durable.journal._core)
    rows = []
    for rep in range(reps):
        latencies.clear()
        interleaved.clear()
        counts.update(statements=0, commits=0)
        t0 = time.perf_counter()
        task.apply((steps_n,), task_id=f"run-{uuid.uuid4()}").get()
        total = time.perf_counter() - t0
        statements, commits = counts["statements"], counts["commits"]
        fl = list(interleaved) if interleave else time_floor(floor, steps_n, f"rep-{rep}")
        row = {
            "backend": kind,
            "rep": rep,
            "step_median_us": median_us(latencies),
            "step_mean_us": statistics.fmean(latencies) * 1e6,
            "run_total_per_step_us": total / steps_n * 1e6,
            "floor_median_us": median_us(fl),
            "commits_per_step": commits / steps_n,
            "statements_per_step": statements / steps_n,
            "commits_per_run": commits,
        }
        row["step_over_floor"] = row["step_median_us"] / row["floor_median_us"]
        rows.append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
    result: dict[str, Any] = {"backend": kind, "rows": rows}
    if kind.startswith("sqlite"):
        if around is not None:
            around.pop("between")  # a replay's own time only
        result["replay_cpu_ms"] = []
        result["replay_ms"] = bench_replay(task, crash, steps_n, reps, result["replay_cpu_ms"])
    durable.close()
    floor.dispose()
    return result


def bench_replay(
    task: Any, crash: dict[str, Any], steps_n: int, reps: int, cpu: list[float]
) -> list[float]:
    """A delivery of a run whose ``steps_n`` results are all stored: replay cost (ms, wall
    clock); its CPU time (ms, the process's: what the load does not add) goes to ``cpu``."""
    times = []
    for _ in range(reps):
        run_id = f"replay-{uuid.uuid4()}"
        crash["on"] = True
        with contextlib.suppress(Crash):
            task.apply((steps_n,), task_id=run_id)
        crash["on"] = False
        crash["offset"] += task.runtime.config.run_lease + 1  # the crashed claim has expired
        t0, c0 = time.perf_counter(), time.process_time()
        task.apply((steps_n,), task_id=run_id).get()
        times.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return times


def ensure_database(url: str, name: str) -> None:
    """Create PostgreSQL database ``name`` (for DBOS's system tables) if it does not exist."""
    engine = sa.create_engine(normalize_url(url), isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        found = c.exec_driver_sql("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).first()
        if found is None:
            c.exec_driver_sql(f'CREATE DATABASE "{name}"')
    engine.dispose()


def run_peer(command: list[str], env: dict[str, str], cwd: str, out: Path) -> list[dict[str, Any]]:
    print("$", " ".join(command), flush=True)
    proc = subprocess.run(
        command, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True
    )
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
        return []
    tail = [line for line in proc.stdout.splitlines() if "summary" in line or line.startswith("  ")]
    print("\n".join(tail[-12:]))
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pg-url", default=os.environ.get("CELERY_DURABLE_TEST_PG_URL", DEFAULT_PG))
    ap.add_argument(
        "--mysql-url", default=os.environ.get("CELERY_DURABLE_TEST_MYSQL_URL", DEFAULT_MYSQL)
    )
    ap.add_argument("--peers", default="/work/shared/peers")
    ap.add_argument("--peers-venv", default=os.environ.get("PEERS_VENV", "/tmp/dbosvenv"))
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--interleave", action="store_true", help="floor transactions between steps")
    ap.add_argument("--backends", nargs="+", default=["sqlite_full", "sqlite_normal", "postgres"])
    a = ap.parse_args()
    directory = tempfile.mkdtemp(prefix="bench_steps_")
    results: dict[str, Any] = {}
    for kind in a.backends:
        if kind == "postgres":
            url, schema = fresh_pg_schema(a.pg_url)
            try:
                results[kind] = bench_backend(kind, url, directory, a.steps, a.reps, a.interleave)
            finally:
                drop_pg_schema(a.pg_url, schema)
        elif kind == "mysql":
            url, database = fresh_mysql_database(a.mysql_url)
            try:
                results[kind] = bench_backend(kind, url, directory, a.steps, a.reps, a.interleave)
            finally:
                drop_mysql_database(a.mysql_url, database)
        else:
            url = f"sqlite:///{os.path.join(directory, kind + '.db')}"
            results[kind] = bench_backend(kind, url, directory, a.steps, a.reps, a.interleave)

    peers: dict[str, Any] = {}
    python = Path(a.peers_venv) / "bin" / "python"
    if a.no_peers:
        print("\nnote: --no-peers: peer scripts not run")
    elif not python.exists():
        print(f"\nnote: no venv at {a.peers_venv}: DBOS column skipped "
              "(python -m venv /tmp/dbosvenv && /tmp/dbosvenv/bin/pip install dbos==3.4.0 "
              "'psycopg[binary]')")  # fmt: skip
    else:
        pg_plain = a.pg_url.replace("postgresql+psycopg://", "postgresql://")
        base = pg_plain.rsplit("/", 1)[0]
        peer_dir = tempfile.mkdtemp(prefix="bench_peers_")
        floor_out = Path(peer_dir) / "floor.jsonl"
        floor_url, floor_schema = fresh_pg_schema(a.pg_url)
        try:
            peers["floor"] = run_peer(
                [str(python), "bench_floor.py", "--n", str(a.steps), "--reps", str(a.reps),
                 "--backends", "pg", "sqlite_normal", "sqlite_full", "--out", str(floor_out)],
                {"BENCH_PG_URL": floor_url, "BENCH_SQLITE_DIR": peer_dir}, a.peers, floor_out,
            )  # fmt: skip
        finally:
            drop_pg_schema(a.pg_url, floor_schema)
        ensure_database(a.pg_url, "celery_durable_bench_dbos")
        for db in ("postgres", "sqlite"):
            out = Path(peer_dir) / f"dbos_{db}.jsonl"
            peers[f"dbos_{db}"] = run_peer(
                [str(python), "bench_dbos.py", "--db", db, "--steps", str(a.steps),
                 "--reps", str(a.reps), "--out", str(out)],
                {"BENCH_PG_URL": f"{base}/celery_durable_bench_dbos", "BENCH_SQLITE_DIR": peer_dir},
                a.peers, out,
            )  # fmt: skip
    summarize(results, peers)


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(results: dict[str, Any], peers: dict[str, Any]) -> None:
    print("\n== summary: medians over repetitions (per-step, microseconds) ==")
    head = ("backend", "durable step", "floor", "ratio", "commits/step", "stmts/step",
            "peer floor", "DBOS step", "DBOS/durable")  # fmt: skip
    widths = (14, 12, 8, 6, 12, 10, 10, 10, 12)
    print(
        " ".join(
            f"{h:<{w}s}" if i == 0 else f"{h:>{w}s}"
            for i, (h, w) in enumerate(zip(head, widths, strict=True))
        )
    )
    peer_floor = {
        "postgres": "pg",
        "sqlite_full": "sqlite_full",
        "sqlite_normal": "sqlite_normal",
        "mysql": "mysql",
    }
    for kind, res in results.items():
        rows = res["rows"]
        step = _med([r["step_median_us"] for r in rows])
        fl = _med([r["floor_median_us"] for r in rows])
        commits = _med([r["commits_per_step"] for r in rows])
        stmts = _med([r["statements_per_step"] for r in rows])
        pf = _med(
            [r["median_us"] for r in peers.get("floor", []) if r["backend"] == peer_floor[kind]]
        )
        dbos_rows = peers.get(
            {"postgres": "dbos_postgres", "mysql": ""}.get(kind, "dbos_sqlite"), []
        )
        dbos = (
            _med([r["step_median_us"] for r in dbos_rows])
            if kind != "sqlite_normal"
            else float("nan")
        )
        print(f"{kind:14s} {step:12.1f} {fl:8.1f} {step / fl:6.2f} {commits:12.3f} {stmts:10.3f} "
              f"{pf:10.1f} {dbos:10.1f} {dbos / step:12.1f}")  # fmt: skip
        if "replay_ms" in res:
            print(f"{'':14s} replay of a stored {len(rows) and 1000}-step body: "
                  f"median {_med(res['replay_ms']):.1f} ms (all: "
                  f"{', '.join(f'{v:.1f}' for v in res['replay_ms'])}); CPU time median "
                  f"{_med(res['replay_cpu_ms']):.1f} ms (all: "
                  f"{', '.join(f'{v:.1f}' for v in res['replay_cpu_ms'])})")  # fmt: skip
    print("(DBOS on SQLite uses its own settings: rollback journal, synchronous=FULL; "
          "compare with the sqlite_full row.)")  # fmt: skip


if __name__ == "__main__":
    main()
