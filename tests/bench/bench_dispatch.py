# ruff: noqa: E501
"""Benchmark driver for the dispatcher and ``DurableScheduler`` (issue 3, "Benchmarks").

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
* ``steady``    10,000 ``Every(10 s)`` schedules spread evenly (1,000 runs/s) for ``--duration``
                seconds under a beat subprocess: lag from due time to the message being on Redis
                (a consumer thread pops the list and reads the ``durable_due`` header), to the
                decision (``RunDecided.at``) and to the recorded start (``RunStarted``'s
                ``recorded_at``); CPU share of the beat process (psutil).
* ``memory``    peak RSS (VmHWM) of a beat process with 100,000 schedules all due at once (every
                state in memory: the worst case); the start-up runs report VmHWM too.
* ``visibility`` with a beat running over 1,000 idle schedules, the driver creates a schedule
                (``Once`` due now) through ``durable.schedules.create``: time from ``create()``
                returning to its message on Redis; 50 samples, random gaps.

Raw rows go to ``tests/bench/results/dispatch_<stamp>.jsonl`` (git-ignored); markdown tables
with median (min–max) are printed at the end. PostgreSQL: a fresh schema per repetition
(``bdisp_<hex>``), dropped afterwards. Redis: ``--redis-url`` (default db 9 of the test server;
only that db is flushed, never db 0). Every subprocess has a timeout and is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from celery import Celery  # noqa: E402
from sqlalchemy import func, select, text  # noqa: E402

from celery_durable import CatchUp, Durable, Every, Once  # noqa: E402
from celery_durable.core.codec import time_from_json  # noqa: E402
from celery_durable.core.ids import parse_due, run_id, schedule_stream  # noqa: E402
from celery_durable.core.journal import Append  # noqa: E402
from celery_durable.core.schedule_aggregate import ScheduleState, fold_all  # noqa: E402
from celery_durable.core.schedule_events import (  # noqa: E402
    Content,
    RunDecided,
    RunStarted,
    ScheduleCreated,
    to_new_event,
)
from celery_durable.store.journal.schema import events as events_table  # noqa: E402

DEFAULT_PG = os.environ.get(
    "CELERY_DURABLE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
DEFAULT_REDIS = "redis://127.0.0.1:6379/9"
DEFAULT_PEERS_DIR = ROOT.parent / "shared" / "peers"
RESULTS = HERE / "results"
TASK = "bench.noop"
SCHEDULER = "celery_durable.beat:DurableScheduler"
ALL = ("peers", "burst", "startup", "steady", "memory", "visibility")

_children: list[subprocess.Popen[bytes]] = []


# --------------------------------------------------------------------------------- helpers


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def summ(values: Sequence[float | None]) -> dict[str, Any]:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def fmt(values: Sequence[float | None], digits: int = 2, unit: str = "") -> str:
    s = summ(values)
    if s["median"] is None:
        return "n/a"
    f = f"{{:,.{digits}f}}"
    if s["n"] == 1:
        return f.format(s["median"]) + unit
    return f"{f.format(s['median'])}{unit} ({f.format(s['min'])}–{f.format(s['max'])})"


def med(values: Sequence[float | None]) -> float | None:
    return summ(values)["median"]


def percentile(values: Sequence[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "n/a"
    return f"{a / b:.2f}×"


def proc_status(pid: int, key: str) -> float | None:
    """A ``/proc/<pid>/status`` memory field in MiB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Recorder:
    """Appends raw rows to ``results/dispatch_<stamp>.jsonl`` and keeps them for the tables."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.rows: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any]) -> dict[str, Any]:
        row = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S"), "loadavg_1m": os.getloadavg()[0], **row}
        self.rows.append(row)
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        short = {
            k: (round(v, 4) if isinstance(v, float) else v)
            for k, v in row.items()
            if not isinstance(v, (list, dict))
        }
        print(json.dumps(short, default=str), flush=True)
        return row

    def of(self, bench: str, **match: Any) -> list[dict[str, Any]]:
        return [
            r
            for r in self.rows
            if r.get("bench") == bench and all(r.get(k) == v for k, v in match.items())
        ]


def stop_process(p: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
    if p in _children:
        _children.remove(p)


def spawn(cmd: Sequence[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        p = subprocess.Popen(
            list(cmd), env=env, cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT
        )
    _children.append(p)
    return p


def tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


# ---------------------------------------------------------------------------- backends


@contextlib.contextmanager
def pg_journal(base_url: str) -> Iterator[str]:
    """A fresh PostgreSQL schema (``bdisp_<hex>``), dropped at the end."""
    from tests.support.services import isolated_schema

    with isolated_schema(base_url, prefix="bdisp_") as url:
        yield url


@contextlib.contextmanager
def sqlite_journal() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="bdisp_") as td:
        yield f"sqlite:///{td}/journal.db"


@contextlib.contextmanager
def journal(backend: str, pg_base: str) -> Iterator[str]:
    if backend == "postgres":
        with pg_journal(pg_base) as url:
            yield url
    else:
        with sqlite_journal() as url:
            yield url


_APPS: dict[str, Celery] = {}


def driver_app(broker: str) -> Celery:
    """One Celery app per broker URL in the driver, with the benchmark's task registered."""
    if broker in _APPS:
        return _APPS[broker]
    app = _APPS[broker] = Celery("bench_driver", broker=broker)
    app.conf.update(timezone="UTC", enable_utc=True, broker_connection_retry_on_startup=True)

    @app.task(name=TASK)
    def noop(*args: object, **kwargs: object) -> None:
        return None

    return app


def redis_client(url: str) -> redis.Redis:
    client = redis.Redis.from_url(url)
    db = client.connection_pool.connection_kwargs.get("db", 0)
    if int(db) == 0:
        raise SystemExit("refusing to use Redis db 0 (the test suite's); pass e.g. .../9")
    return client


# ------------------------------------------------------------------------------ seeding


def seed(
    durable: Durable,
    schedules: Iterator[tuple[str, list[Any]]],
    *,
    batch_rows: int = 5000,
) -> dict[str, Any]:
    """Write each schedule's events with ``append_many`` in big batches, then the index rows
    (folded here) and the projection position in one ``index.save``: a consistent index, as a
    dispatcher that had run before would leave it."""
    journal_ = durable.journal
    journal_.ensure_ready()
    t0 = time.perf_counter()
    states: list[ScheduleState] = []
    pending: list[Append] = []
    rows = events_n = 0
    for sid, evs in schedules:
        pending.append(
            Append(
                stream=schedule_stream(sid),
                expected_version=0,
                events=[to_new_event(e) for e in evs],
            )
        )
        states.append(fold_all(ScheduleState(schedule_id=sid), evs))
        rows += len(evs)
        events_n += len(evs)
        if rows >= batch_rows:
            journal_.append_many(pending)
            pending, rows = [], 0
    if pending:
        journal_.append_many(pending)
    t_events = time.perf_counter() - t0
    head = journal_.head("schedule")
    durable.index.save(states, head, utcnow())
    return {
        "schedules": len(states),
        "events": events_n,
        "head": head,
        "seed_events_s": t_events,
        "seed_total_s": time.perf_counter() - t0,
    }


def content(i: int, rule: Any) -> Content:
    return Content(task=TASK, input=i, rule=rule, catch_up=CatchUp.LATEST)


def burst_schedules(
    n: int, created: datetime, prefix: str = "b"
) -> Iterator[tuple[str, list[Any]]]:
    rule = Every(timedelta(seconds=60))
    for i in range(n):
        yield f"{prefix}-{i:06d}", [ScheduleCreated(at=created, content=content(i, rule))]


def startup_schedules(
    n: int, due_now: int, now: datetime, history_runs: int
) -> Iterator[tuple[str, list[Any]]]:
    """``n`` hourly schedules; the first ``due_now`` have their next due time 60 s before
    ``now``, the others are spread over [now + 30 min, now + 90 min). With history, each
    schedule has ``history_runs`` past runs (RunDecided + RunStarted each) before that due
    time; without, it was created one interval before it. The next due times are identical."""
    hour = timedelta(hours=1)
    rule = Every(hour)
    spread = (n - due_now) or 1
    for i in range(n):
        if i < due_now:
            next_due = now - timedelta(seconds=60)
        else:
            next_due = now + timedelta(minutes=30) + hour * ((i - due_now) / spread)
        created = next_due - hour * (history_runs + 1)
        evs: list[Any] = [ScheduleCreated(at=created, content=content(i, rule))]
        sid = f"s-{i:06d}"
        for k in range(1, history_runs + 1):
            due = created + hour * k
            evs.append(
                RunDecided(
                    at=due + timedelta(milliseconds=40),
                    due=due,
                    run_id=run_id(sid, due),
                    task=TASK,
                    input=i,
                )
            )
            evs.append(RunStarted(at=due + timedelta(milliseconds=45), due=due))
        yield sid, evs


def steady_schedules(n: int, base: datetime, period: float) -> Iterator[tuple[str, list[Any]]]:
    """``n`` schedules of ``Every(period)`` whose anchors are spread evenly over one period."""
    rule = Every(timedelta(seconds=period))
    step = timedelta(seconds=period / n)
    for i in range(n):
        yield f"e-{i:06d}", [ScheduleCreated(at=base + step * i, content=content(i, rule))]


# ------------------------------------------------------------------------------ watching


def type_counts(durable: Durable, after: int) -> dict[str, int]:
    query = (
        select(events_table.c.type, func.count())
        .where(events_table.c.category == "schedule", events_table.c.position > after)
        .group_by(events_table.c.type)
    )
    with durable.journal.engine.connect() as conn:
        return {t: int(c) for t, c in conn.execute(query).all()}


def last_recorded(durable: Durable, after: int, type_: str, t0: float) -> float | None:
    """``recorded_at`` of the last event of a type (set by the writer just before its INSERT),
    relative to ``t0``."""
    query = select(func.max(events_table.c.recorded_at)).where(
        events_table.c.category == "schedule",
        events_table.c.position > after,
        events_table.c.type == type_,
    )
    with durable.journal.engine.connect() as conn:
        found = conn.execute(query).scalar()
    return None if found is None else found.timestamp() - t0


def first_decided(durable: Durable, after: int) -> bool:
    query = (
        select(events_table.c.position)
        .where(
            events_table.c.category == "schedule",
            events_table.c.position > after,
            events_table.c.type == "RunDecided",
        )
        .limit(1)
    )
    with durable.journal.engine.connect() as conn:
        return conn.execute(query).first() is not None


def beat_env(
    journal_url: str, broker: str, mark: Path, extra: dict[str, str] | None = None
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CELERY_DURABLE_URL=journal_url,
        BENCH_BROKER=broker,
        BENCH_MARK_FILE=str(mark),
        PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")]),
    )
    env.update(extra or {})
    return env


def beat_cmd(td: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "dispatch_app",
        "beat",
        "-S",
        SCHEDULER,
        "-s",
        str(td / "celerybeat-schedule"),
        "--pidfile=",
        "-l",
        "warning",
    ]


def child_cmd(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--child", *args]


def read_mark(mark: Path, t0: float) -> float | None:
    try:
        return float(mark.read_text()) - t0
    except (OSError, ValueError):
        return None


def library_fingerprint() -> dict[str, Any]:
    """HEAD and a hash of the working tree's ``celery_durable/`` (others may be editing it)."""
    import hashlib

    digest = hashlib.sha1()
    for path in sorted((ROOT / "celery_durable").rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {"head": head, "tree_sha1": digest.hexdigest()[:12]}


def start_private_redis() -> tuple[subprocess.Popen[bytes], str]:
    """A private ``redis-server`` (same flags as ``../shared/peers/servers.sh``: no persistence)
    on a free port: other sessions on this machine use the shared server's databases, and a
    FLUSHDB there (theirs or ours) would corrupt both measurements."""
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="bdisp_redis_"))
    cmd = [
        shutil.which("redis-server") or "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(work),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.bench_workdir = str(work)  # type: ignore[attr-defined]
    url = f"redis://127.0.0.1:{port}/9"
    client = redis.Redis.from_url(url)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.1)
    else:
        proc.kill()
        raise SystemExit("the private redis-server did not start")
    print(f"private Redis for the durable benchmarks: {url}", flush=True)
    return proc, url


# --------------------------------------------------------------------------------- py-spy


def start_py_spy(
    a: argparse.Namespace, pid: int, name: str, duration: float
) -> tuple[subprocess.Popen[bytes], Path] | None:
    """With ``--py-spy``: sample the beat process (raw collapsed stacks, 50 Hz, non-blocking)."""
    if not a.py_spy:
        return None
    if not Path(a.py_spy).exists():
        print(f"NOTE: no py-spy at {a.py_spy}; not profiling {name}", flush=True)
        return None
    out = RESULTS / f"pyspy_{name}.txt"
    cmd = [
        a.py_spy,
        "record",
        "--pid",
        str(pid),
        "--rate",
        "50",
        "--nonblocking",
        "--format",
        "raw",
        "--output",
        str(out),
        "--duration",
        str(int(duration)),
    ]
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _children.append(spy)
    return spy, out


def finish_py_spy(spy: tuple[subprocess.Popen[bytes], Path] | None) -> None:
    if spy is None:
        return
    proc, out = spy
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    if proc in _children:
        _children.remove(proc)
    if out.exists():
        summary = summarize_py_spy(out)
        out.with_suffix(".summary.txt").write_text(summary)
        print(summary, flush=True)


def _frame_name(frame: str) -> str:
    """``func (path/to/file.py:12)`` -> ``func (file.py)``."""
    if " (" not in frame:
        return frame
    func_, _, where = frame.partition(" (")
    return f"{func_} ({where.split(':')[0].rsplit('/', 1)[-1]})"


def summarize_py_spy(path: Path, top: int = 40) -> str:
    """Inclusive and self sample shares per function from py-spy's raw (collapsed) output."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame_name(f) for f in stack.split(";")]
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + n
        own[frames[-1]] = own.get(frames[-1], 0) + n
    lines = [f"{path.name}: {total} samples", "", "inclusive %  function (file)"]
    for f, n in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{100 * n / max(total, 1):6.1f}  {f}")
    lines += ["", "self %  function (file)"]
    for f, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{100 * n / max(total, 1):6.1f}  {f}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- peers


def run_peers(a: argparse.Namespace, rec: Recorder, stamp: str) -> None:
    py = Path(a.peers_python)
    peers = Path(a.peers_dir)
    if not py.exists():
        print(
            f"NOTE: peers skipped: {py} does not exist. Create it with\n"
            f"  python3 -m venv /tmp/peersvenv && /tmp/peersvenv/bin/pip install -r "
            f"{peers}/requirements-lock.txt",
            flush=True,
        )
        return
    work = Path(tempfile.mkdtemp(prefix="bdisp_peers_"))
    rport, pport = free_port(), free_port()
    env = dict(
        os.environ,
        PEERS_WORK=str(work),
        PEERS_REDIS_PORT=str(rport),
        PEERS_PG_PORT=str(pport),
        BENCH_REDIS_URL=f"redis://127.0.0.1:{rport}",
    )
    try:
        subprocess.run(
            ["bash", str(peers / "servers.sh"), "start"],
            env=env,
            check=True,
            timeout=120,
            stdout=sys.stdout,
            stderr=sys.stderr,
        )
        beat_out = RESULTS / f"peers_beat_{stamp}.jsonl"
        pub_out = RESULTS / f"peers_publish_{stamp}.jsonl"
        cmd = [
            str(py),
            str(peers / "bench_beat.py"),
            "--n",
            str(a.n_burst),
            "--reps",
            str(a.peer_reps),
            "--schedulers",
            *a.peer_schedulers.split(","),
            "--timeout",
            str(a.peer_timeout),
            "--out",
            str(beat_out),
        ]
        print("+", " ".join(cmd), flush=True)
        budget = a.peer_reps * len(a.peer_schedulers.split(",")) * (a.peer_timeout + 30) + 60
        subprocess.run(cmd, env=env, cwd=str(work), timeout=budget, check=False)
        cmd = [
            str(py),
            str(peers / "bench_publish.py"),
            "--n",
            str(a.n_burst),
            "--reps",
            str(max(a.peer_reps, 3)),
            "--variants",
            "apply_async",
            "apply_async_producer",
            "apply_async_batch",
            "--out",
            str(pub_out),
        ]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, env=env, cwd=str(work), timeout=600, check=False)
        for path, kind in ((beat_out, "peer_beat"), (pub_out, "peer_publish")):
            if path.exists():
                for line in path.read_text().splitlines():
                    row = json.loads(line)
                    row.pop("log_tail", None)
                    rec.add({"bench": kind, **row})
    finally:
        subprocess.run(
            ["bash", str(peers / "servers.sh"), "stop"], env=env, timeout=60, check=False
        )
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------------- burst


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
                        t_all_started = time.time() - t0
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
                "t_all_decided_s": t_all_decided,
                "t_all_started_s": t_all_started,
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


def run_burst(a: argparse.Namespace, rec: Recorder) -> None:
    for rep in range(a.reps):
        for backend in a.backends:
            burst_beat_once(a, backend, a.n_burst, rep, rec)
            burst_tick_once(a, backend, a.n_burst, rep, rec)
    if a.profile:
        for backend in a.backends:
            burst_tick_once(
                a, backend, a.n_burst, 0, rec, profile=RESULTS / f"profile_burst_tick_{backend}.txt"
            )


# --------------------------------------------------------------------------------- start-up


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
        hwm = 0.0
        try:
            while time.time() - t0 < a.timeout:
                now = time.time() - t0
                if t_decided is None and first_decided(durable, head):
                    t_decided = now
                if t_first_msg is None and r.llen("celery"):
                    t_first_msg = time.time() - t0
                hwm = max(hwm, proc_status(p.pid, "VmHWM") or 0.0)
                if (
                    t_decided is not None
                    and t_all_started is None
                    and type_counts(durable, head).get("RunStarted", 0) >= due_now
                ):
                    t_all_started = time.time() - t0
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


def run_startup(a: argparse.Namespace, rec: Recorder) -> None:
    app = driver_app(a.redis_url)
    n, hist = a.n_startup, a.history_runs
    due_now = min(1000, n)
    with pg_journal(a.pg_url) as url_hist, pg_journal(a.pg_url) as url_none:
        now = utcnow()
        urls = {}
        for dataset, url, runs in (("no_history", url_none, 0), ("history", url_hist, hist)):
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
            for dataset in ("no_history", "history"):
                url, head = urls[dataset]
                for mode in ("beat", "inproc"):
                    startup_once(a, dataset, url, head, due_now, mode, rep, rec)


# ------------------------------------------------------------------------------- consumer


class Consumer(threading.Thread):
    """Pops the ``celery`` list (oldest first, as a worker's BRPOP would) and records, for each
    message, the wall time it was seen and its ``durable_due`` / ``durable_schedule`` headers."""

    def __init__(self, url: str, keep: bool = True) -> None:
        super().__init__(daemon=True)
        self.r = redis_client(url)
        self.stop_flag = threading.Event()
        self.seen: list[tuple[float, str, str]] = []  # (seen_at, schedule, due text)
        self.by_schedule: dict[str, float] = {}
        self.keep = keep
        self.count = 0

    def run(self) -> None:
        while not self.stop_flag.is_set():
            batch = self.r.rpop("celery", 1000)
            if not batch:
                time.sleep(0.002)
                continue
            seen = time.time()
            for raw in batch:
                headers = json.loads(raw).get("headers") or {}
                sid = headers.get("durable_schedule", "")
                due = headers.get("durable_due", "")
                self.count += 1
                if self.keep:
                    self.seen.append((seen, sid, due))
                if sid not in self.by_schedule:
                    self.by_schedule[sid] = seen

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(10)


# --------------------------------------------------------------------------------- steady


def run_steady(a: argparse.Namespace, rec: Recorder) -> None:
    n, period = a.n_steady, 10.0
    warmup, duration = a.warmup, a.duration
    r = redis_client(a.redis_url)
    app = driver_app(a.redis_url)
    with pg_journal(a.pg_url) as url, tempfile.TemporaryDirectory(prefix="bdisp_") as tds:
        td = Path(tds)
        durable = Durable(app, url)
        base = utcnow() - timedelta(seconds=5)
        seeded = seed(durable, steady_schedules(n, base, period))
        head = seeded["head"]
        r.flushdb()
        consumer = Consumer(a.redis_url)
        consumer.start()
        mark = td / "ready"
        t0 = time.time()
        p = spawn(beat_cmd(td), beat_env(url, a.redis_url, mark), td / "beat.log")
        import psutil

        proc = psutil.Process(p.pid)
        w0, w1 = t0 + warmup, t0 + warmup + duration
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


# --------------------------------------------------------------------------------- memory


def run_memory(a: argparse.Namespace, rec: Recorder) -> None:
    burst_beat_once(a, "postgres", a.n_memory, 0, rec, bench="memory_burst")


# ----------------------------------------------------------------------------- visibility


def run_visibility(a: argparse.Namespace, rec: Recorder) -> None:
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


# --------------------------------------------------------------------------------- tables


def peer_bounds(x: dict[str, Any], n: int, timeout: float) -> None:
    """Times and rates of a peer row; for a run stopped at the timeout, the bounds it proves
    (all N would take at least the timeout; the rates are at most what it reached)."""
    if x.get("t_all_s"):
        x["t_all_bound_s"] = x["t_all_s"]
        x["e2e_rate_bound"] = n / x["t_all_s"]
        x["rate_bound"] = x.get("rate_per_s")
        return
    queued = x.get("queued_at_end") or 0
    x["t_all_bound_s"] = timeout
    x["e2e_rate_bound"] = queued / timeout
    first = x.get("t_first_s")
    x["rate_bound"] = (queued - 1) / (timeout - first) if first is not None else None


def tables(rec: Recorder, a: argparse.Namespace) -> str:
    out: list[str] = []
    w = out.append
    peers = rec.of("peer_beat")
    pub = rec.of("peer_publish")
    bb = {b: rec.of("burst_beat", backend=b) for b in ("postgres", "sqlite")}
    if peers or bb["postgres"] or bb["sqlite"]:
        n = a.n_burst
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
            for v in ("apply_async_producer", "apply_async_batch"):
                rows = [x for x in pub if x.get("variant") == v]
                if rows:
                    t = med([x["wall_s"] for x in rows])
                    f = med([x["msgs_per_s"] for x in rows])
                    w(
                        f"| `{v}` publishing only (no process start, no journal) | {ratio(t, d_all)} "
                        f"| {ratio(d_rate, f)} | {ratio(d_disp, f)} |"
                    )
    tk = rec.of("burst_tick")
    if tk:
        w(
            f"\n### Burst, in-process `dispatcher().tick()` loop (fresh process, {a.n_burst:,} due)\n"
        )
        w(
            "Time spent in each part, summed over both threads: the starts of one round are "
            "stored by the writer thread while the next round is decided and sent, so the parts "
            "add up to more than the tick loop. CPU = the process's CPU time in the loop.\n"
        )
        w(
            "| journal | reps | Durable+dispatcher()+load (s) | ticks | tick loop (s) | CPU (s) | "
            "decide (s) | store: events+commit (s) | publish (s) | index reads (s) | runs/s |"
        )
        w("|---|---|---|---|---|---|---|---|---|---|---|")
        for b in ("postgres", "sqlite"):
            rows = [x for x in tk if x["backend"] == b and "ticks_s" in x]
            if rows:
                w(
                    f"| {b} | {len(rows)} | {fmt([x['load_s'] for x in rows], 3)} "
                    f"| {fmt([x['ticks'] for x in rows], 0)} | {fmt([x['ticks_s'] for x in rows])} "
                    f"| {fmt([x.get('ticks_cpu_s') for x in rows])} "
                    f"| {fmt([x['decide_s'] for x in rows])} | {fmt([x['store_s'] for x in rows])} "
                    f"| {fmt([x['send_s'] for x in rows])} | {fmt([x['states_s'] for x in rows])} "
                    f"| {fmt([x['runs_per_s_inproc'] for x in rows], 0)} |"
                )
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
            "launch→first msg (s) | launch→1,000 due started (s) | child: Durable+dispatcher()+load (s) "
            "| child: to end of first tick (s) | peak RSS (MiB) |"
        )
        w("|---|---|---|---|---|---|---|---|---|---|")
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
                    f"| {fmt([x['t_first_msg_s'] for x in rows])} "
                    f"| {fmt([x['t_due_started_s'] for x in rows])} "
                    f"| {fmt([x.get('child_load_s') for x in rows], 3)} "
                    f"| {fmt([x.get('child_first_tick_done_s') for x in rows], 3)} "
                    f"| {fmt([x['peak_rss_mib'] for x in rows], 1)} |"
                )
        for mode in ("beat", "inproc"):
            h, z = meds.get(("history", mode)), meds.get(("no_history", mode))
            if h and z:
                w(f"\n{mode}: with history ÷ without = **{h / z:.2f}×** (target ≤ 1.2×)")
    sd = rec.of("steady")
    if sd:
        x = sd[-1]
        w(
            f"\n### Steady state: {x['n']:,} × Every(10 s) = {x['n'] / 10:,.0f} runs/s, "
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
    mem = rec.of("memory_burst")
    if mem or st:
        w("\n### Memory: peak RSS (VmHWM) of the beat process\n")
        w("| case | reps | peak RSS (MiB) | time (s) |")
        w("|---|---|---|---|")
        for ds in ("no_history", "history"):
            rows = [x for x in st if x["dataset"] == ds and x["mode"] == "beat"]
            if rows:
                w(
                    f"| {a.n_startup:,} schedules ({ds}), start-up + 1,000 due | {len(rows)} "
                    f"| {fmt([x['peak_rss_mib'] for x in rows], 1)} "
                    f"| {fmt([x['t_due_started_s'] for x in rows])} |"
                )
        if mem:
            w(
                f"| {a.n_memory:,} schedules all due at once (every state in memory), launch→all "
                f"started | {len(mem)} | {fmt([x['peak_rss_mib'] for x in mem], 1)} "
                f"| {fmt([x['t_all_started_s'] for x in mem])} |"
            )
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
    return "\n".join(out)


# ----------------------------------------------------------------------------------- main


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
    ap.add_argument("--n-startup", type=int, default=100_000)
    ap.add_argument(
        "--history-runs",
        type=int,
        default=5,
        help="past runs per schedule in the start-up dataset (2 events each)",
    )
    ap.add_argument("--n-steady", type=int, default=10_000)
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
    a = ap.parse_args(argv)
    a.reps = a.reps or (1 if a.quick else 3)
    a.peer_reps = a.peer_reps or (1 if a.quick else 3)
    a.peer_schedulers = a.peer_schedulers or ("redbeat" if a.quick else "persistent,redbeat")
    a.duration = a.duration or (15.0 if a.quick else 120.0)
    a.backends = [b for b in a.backends.split(",") if b]
    a.only = [b for b in a.only.split(",") if b]
    unknown = set(a.only) - set(ALL)
    if unknown:
        ap.error(f"unknown benchmark(s) {sorted(unknown)}; choose from {ALL}")
    return a


def child_main(argv: Sequence[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["tick", "startup"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--broker", required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--head", type=int, required=True)
    ap.add_argument("--profile-out", default=None)
    c = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    (child_tick if c.kind == "tick" else child_startup)(c)


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
    rec.add(
        {
            "bench": "meta",
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
        "peers": lambda: run_peers(a, rec, stamp),
        "burst": lambda: run_burst(a, rec),
        "startup": lambda: run_startup(a, rec),
        "steady": lambda: run_steady(a, rec),
        "memory": lambda: run_memory(a, rec),
        "visibility": lambda: run_visibility(a, rec),
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
