"""What every dispatch benchmark uses: paths, statistics, the row recorder, child processes,
fresh journals, the driver's Celery app, the beat command line and a private Redis."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

#: The repository root; ``HERE`` is tests/bench (results, ``dispatch_app``, the driver).
ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parents[1]
DRIVER = HERE / "bench_dispatch.py"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from celery import Celery  # noqa: E402

DEFAULT_PG = os.environ.get(
    "CELERY_DURABLE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
DEFAULT_REDIS = "redis://127.0.0.1:6379/9"
DEFAULT_PEERS_DIR = ROOT.parent / "shared" / "peers"
RESULTS = HERE / "results"
TASK = "bench.noop"
SCHEDULER = "celery_durable.beat:DurableScheduler"
ALL = ("peers", "burst", "startup", "steady", "memory", "visibility", "create_many")

_children: list[subprocess.Popen[bytes]] = []


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


def proc_cpu(pid: int) -> float | None:
    """A process's CPU time so far (user + system, s), from ``/proc/<pid>/stat``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
def mysql_journal() -> Iterator[str]:
    """A fresh MariaDB/MySQL database beside ``CELERY_DURABLE_TEST_MYSQL_URL``, dropped after."""
    from tests.support.services import isolated_database

    base = os.environ.get(
        "CELERY_DURABLE_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"
    )
    with isolated_database(base) as url:
        yield url


@contextlib.contextmanager
def journal(backend: str, pg_base: str) -> Iterator[str]:
    if backend == "postgres":
        with pg_journal(pg_base) as url:
            yield url
    elif backend == "mysql":
        with mysql_journal() as url:
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
    return [sys.executable, str(DRIVER), "--child", *args]


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


def byte_compile() -> dict[str, Any]:
    """Byte-compile the library and the benchmark's app into ``__pycache__``, as pip does when
    it installs a package: a measured launch then imports them as an installed beat would.
    (Python reads cached bytecode also under ``PYTHONDONTWRITEBYTECODE``, which only stops it
    from writing any; with that variable set and no cache, every launch compiles about a
    hundred modules first.)"""
    import compileall

    t0 = time.process_time()
    ok = compileall.compile_dir(str(ROOT / "celery_durable"), quiet=1)
    ok = compileall.compile_file(str(HERE / "dispatch_app.py"), quiet=1) and ok
    return {"byte_compiled": bool(ok), "byte_compile_cpu_s": time.process_time() - t0}


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
