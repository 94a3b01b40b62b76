"""The chaos harness (A6, A8, D6, D8, W8): real processes, real kills, then the invariants.

    python -m tests.chaos.run --minutes 2            # the CI length
    python -m tests.chaos.run --minutes 15 --seed 7  # the published run (docs/guarantees.md)
    python -m tests.chaos.run --minutes 1 --journal mysql  # the journal on MariaDB/MySQL
    python -m tests.chaos.run --minutes 1 --partitions 8  # every beat works a share (D10)

It creates a fresh PostgreSQL database (with ``--journal mysql``: a MariaDB/MySQL database
beside the one of ``CELERY_DURABLE_TEST_MYSQL_URL``) for the journal and another for the
external ledger (always PostgreSQL),
starts its own ``redis-server`` (so it can restart it), 3 ``celery beat`` processes with the
durable scheduler and 3 prefork ``celery worker`` processes (concurrency 2; durable tasks are
``acks_late``), and 50 schedules (``CatchUp.ALL``, so no due time may be missing) targeting the
4-step durable task of :mod:`tests.chaos.app`. While the faults run it ``kill -9``s a random
beat or worker every 2–5 s and starts a replacement; once it restarts Redis (without
persistence: every queued message is lost), once it terminates every journal connection, once
it locks the events table for 10 s. Then it stops the faults, waits for every run due before
that moment to finish, and checks the invariants listed in docs/guarantees.md. It prints a
table and exits 1 when an invariant fails (2 when the set-up itself fails).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from celery import Celery
from sqlalchemy.pool import NullPool

from tests.support.processes import REPO_ROOT, child_env
from tests.support.services import (
    create_mysql_database,
    drop_mysql_database,
    find_redis_server,
    free_port,
    kill_mysql_sessions,
    mysql_connect,
)

UTC = timezone.utc
ADMIN_URL = os.environ.get("CHAOS_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
MYSQL_URL = os.environ.get(
    "CELERY_DURABLE_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"
)
TASK = "chaos.job"
STEPS = 4


def log(message: str) -> None:
    print(f"[chaos {datetime.now(UTC):%H:%M:%S}] {message}", flush=True)


# -- services ------------------------------------------------------------------------------


def libpq(dbname: str) -> str:
    base = ADMIN_URL.rsplit("/", 1)[0]
    return f"{base}/{dbname}"


def sqlalchemy_url(dbname: str) -> str:
    return libpq(dbname).replace("postgresql://", "postgresql+psycopg://", 1)


@dataclass
class JournalDb:
    """The journal's database on PostgreSQL or MariaDB/MySQL, and the faults done to it."""

    kind: str
    name: str

    @property
    def url(self) -> str:
        if self.kind == "mysql":
            return sa.make_url(MYSQL_URL).set(database=self.name).render_as_string(False)
        return sqlalchemy_url(self.name)

    def connect(self) -> sa.Connection:
        """A connection of its own (the harness's reads; no pool to outlive a termination)."""
        return sa.create_engine(self.url, poolclass=NullPool).connect()

    def terminate_connections(self) -> int:
        """Kill every session in the journal's database (beat's, workers', the harness's)."""
        if self.kind != "mysql":
            return terminate_journal_connections(self.name)
        return kill_mysql_sessions(MYSQL_URL, self.name)

    def lock_events(self, seconds: float) -> None:
        """Block every reader and writer of the events table for ``seconds``."""
        if self.kind != "mysql":
            lock_events(self.name, seconds)
            return
        conn = mysql_connect(MYSQL_URL, database=self.name)
        try:
            with conn.cursor() as cursor:
                cursor.execute("LOCK TABLES celery_durable_events WRITE")
                time.sleep(seconds)
                cursor.execute("UNLOCK TABLES")
        finally:
            conn.close()


@contextlib.contextmanager
def fresh_databases(keep: bool, journal_kind: str = "postgres") -> Iterator[tuple[JournalDb, str]]:
    """A journal database and a ledger database, dropped afterwards unless ``keep``."""
    suffix = f"{datetime.now(UTC):%Y%m%d%H%M%S}_{uuid.uuid4().hex[:6]}"
    names = [f"chaos_ledger_{suffix}"]
    if journal_kind == "mysql":
        journal = JournalDb("mysql", f"{sa.make_url(MYSQL_URL).database}_chaos_{suffix}")
        create_mysql_database(MYSQL_URL, journal.name)
    else:
        journal = JournalDb("postgres", f"chaos_journal_{suffix}")
        names.append(journal.name)
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        for name in names:
            admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield journal, names[0]
    finally:
        if keep:
            log(f"kept databases {journal.name} ({journal.kind}) and {names[0]}")
        else:
            with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
                for name in names:
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            if journal.kind == "mysql":
                drop_mysql_database(MYSQL_URL, journal.name)


class Redis:
    """A private ``redis-server`` without persistence, on a fixed port so it can restart."""

    def __init__(self, workdir: Path) -> None:
        self.binary, _ = find_redis_server()
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        with (self.workdir / "redis.log").open("ab") as out:
            self.proc = subprocess.Popen(
                [str(self.binary), "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(self.workdir)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        import redis

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if redis.Redis(port=self.port, socket_connect_timeout=1).ping():
                    return
            time.sleep(0.1)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


# -- processes ------------------------------------------------------------------------------


@dataclass
class Proc:
    kind: str
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    started: float = field(default_factory=time.monotonic)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill9(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)

    def stop(self, timeout: float = 20) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)


class Fleet:
    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = child_env(env)
        self.procs: list[Proc] = []
        self.counter = Counter[str]()
        self.killed: list[tuple[float, str, int]] = []

    def spawn(self, kind: str) -> Proc:
        self.counter[kind] += 1
        name = f"{kind}{self.counter[kind]}"
        cwd = self.workdir / name
        cwd.mkdir(parents=True, exist_ok=True)
        if kind == "worker":
            args = ["worker", "--pool=prefork", "--concurrency=2", "-n", f"{name}@%h",
                    "--without-heartbeat", "--without-mingle", "--without-gossip"]  # fmt: skip
        else:
            args = ["beat", "-S", "celery_durable.beat:DurableScheduler", "--pidfile",
                    str(cwd / "beat.pid"), "-s", str(cwd / "beat-schedule")]  # fmt: skip
        log_path = self.workdir / f"{name}.log"
        with log_path.open("ab") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "tests.chaos.app", *args, "-l", "INFO"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, cwd=str(REPO_ROOT), start_new_session=True,
            )  # fmt: skip
        proc = Proc(kind, name, popen, log_path)
        self.procs.append(proc)
        return proc

    def live(self, kind: str | None = None) -> list[Proc]:
        return [p for p in self.procs if p.alive() and (kind is None or p.kind == kind)]

    def kill_random(self, rng: random.Random) -> Proc:
        victim = rng.choice(self.live())
        self.killed.append((time.time(), victim.kind, victim.popen.pid))
        victim.kill9()
        log(f"kill -9 {victim.name} (pid {victim.popen.pid})")
        return victim

    def stop(self, kind: str) -> None:
        """SIGTERM to all of ``kind`` at once (warm shutdown), then wait; SIGKILL stragglers."""
        procs = self.live(kind)
        for proc in procs:
            proc.popen.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.stop()


# -- the workload ---------------------------------------------------------------------------


def workload() -> list[tuple[str, Any]]:
    """50 schedules of mixed rules, all ``CatchUp.ALL``."""
    from celery_durable import Cron, Every

    rules: list[tuple[str, Any]] = []
    mix = [
        (4, "every1s", lambda: Every(timedelta(seconds=1))),
        (12, "every3s", lambda: Every(timedelta(seconds=3))),
        (12, "every5s", lambda: Every(timedelta(seconds=5))),
        (10, "every10s", lambda: Every(timedelta(seconds=10))),
        (8, "cron-minute", lambda: Cron("* * * * *")),
        (4, "cron-minute-oslo", lambda: Cron("* * * * *", zone="Europe/Oslo")),
    ]
    for count, label, make in mix:
        rules.extend((f"{label}-{i:02d}", make()) for i in range(count))
    return rules


def client(broker: str, journal: str) -> Any:
    from celery_durable import Durable

    app = Celery("chaos-harness", broker=broker)
    app.conf.task_ignore_result = True
    durable = Durable(app, journal)
    # Register the task name so create() accepts it (A7) without importing the worker app.

    @app.task(name=TASK, shared=False)
    def job(run: Any) -> None:  # pragma: no cover - never runs here
        return None

    return durable


# -- faults ---------------------------------------------------------------------------------


def terminate_journal_connections(dbname: str) -> int:
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (dbname,),
        ).fetchall()
    return len(rows)


def lock_events(dbname: str, seconds: float) -> None:
    with psycopg.connect(libpq(dbname)) as conn:
        conn.execute("LOCK TABLE celery_durable_events IN ACCESS EXCLUSIVE MODE")
        time.sleep(seconds)
        conn.rollback()


# -- checks ---------------------------------------------------------------------------------


@dataclass
class Report:
    rows: list[tuple[str, str, bool]] = field(default_factory=list)
    faulted_errors: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, value: Any, ok: bool = True) -> None:
        self.rows.append((name, str(value), ok))

    @property
    def failed(self) -> list[str]:
        return [name for name, _, ok in self.rows if not ok]

    def table(self) -> str:
        width = max(len("figure"), *(len(name) for name, _, _ in self.rows))
        vwidth = max(len("value"), *(len(value) for _, value, _ in self.rows))
        lines = [f"| {'figure':<{width}} | {'value':>{vwidth}} | ok |",
                 f"|{'-' * (width + 2)}|{'-' * (vwidth + 2)}|----|"]  # fmt: skip
        for name, value, ok in self.rows:
            lines.append(f"| {name:<{width}} | {value:>{vwidth}} | {'✓' if ok else '✗'}  |")
        return "\n".join(lines)


# The checks read the events table with plain SQL and parse the JSON here, so that they run the
# same on PostgreSQL and MariaDB/MySQL.


def _events(conn: sa.Connection, where: str) -> list[tuple[str, str, dict[str, Any]]]:
    rows = conn.execute(sa.text(f"SELECT stream, type, data FROM celery_durable_events {where}"))
    return [(stream, type_, json.loads(data)) for stream, type_, data in rows]


def decided_runs(conn: sa.Connection) -> list[tuple[str, str, str]]:
    return [
        (stream[len("schedule/") :], data["due"], data["run_id"])
        for stream, _, data in _events(conn, "WHERE type = 'RunDecided' AND category = 'schedule'")
    ]


def run_endings(conn: sa.Connection) -> dict[str, list[str]]:
    endings: dict[str, list[str]] = defaultdict(list)
    for stream, type_ in conn.execute(
        sa.text(
            "SELECT stream, type FROM celery_durable_events WHERE category = 'run' "
            "AND type IN ('RunFinished', 'RunFaulted', 'RunCancelled', 'RunParked')"
        )
    ):
        endings[stream[4:]].append(type_)
    return endings


def parse_due(text: str) -> datetime:
    return datetime.fromisoformat(text.rstrip("Z")).replace(tzinfo=UTC)


def gaps(
    durable: Any, decided: list[tuple[str, str, str]], cutoff: datetime
) -> tuple[int, int, int]:
    """Due times of the rules up to ``cutoff`` that no decision covers, decisions off the
    rules' grid, and how many due times there were up to ``cutoff``."""
    dues_of: dict[str, set[datetime]] = defaultdict(set)
    for sid, due, _ in decided:
        dues_of[sid].add(parse_due(due))
    lost = off_grid = expected_total = 0
    for view in durable.schedules.list():
        got = dues_of.get(view.id, set())
        expected: set[datetime] = set()
        moment = view.anchor
        horizon = max([cutoff, *got])
        while True:
            moment = view.rule.next_after(moment, anchor=view.anchor)
            if moment is None or moment > horizon:
                break
            expected.add(moment)
        before_cut = {d for d in expected if d <= cutoff}
        expected_total += len(before_cut)
        lost += len(before_cut - got)
        off_grid += len(got - expected)
    return lost, off_grid, expected_total


def unfinished(durable: Any, journal_db: JournalDb, cutoff: datetime) -> int:
    """Due times up to ``cutoff`` not yet decided (a beat killed just before the cut-off
    leaves them to the next one, after the lease), plus runs due by ``cutoff`` that have not
    ended (a Faulted one counts as ended here: it will never finish, and the checks report
    it)."""
    with journal_db.connect() as conn:
        ends = run_endings(conn)
        decided = decided_runs(conn)
    undecided = gaps(durable, decided, cutoff)[0]
    return undecided + sum(
        1 for _, due, rid in decided
        if parse_due(due) <= cutoff and not ends.get(rid)
    )  # fmt: skip


def check(
    report: Report,
    durable: Any,
    journal_db: JournalDb,
    ledger_db: str,
    cutoff: datetime,
    killed_workers: set[int],
    terminated_runs: set[str],
    journal_lost_runs: set[str],
) -> None:
    with journal_db.connect() as conn:
        decided = decided_runs(conn)
        ends = run_endings(conn)
        step_counts = Counter(
            (stream[4:], str(data.get("position")))
            for stream, _, data in _events(
                conn, "WHERE category = 'run' AND type = 'StepCompleted'"
            )
        )
        steps = [(rid, position, n) for (rid, position), n in step_counts.items()]
        faulted = Counter(
            str(data.get("error_type"))
            for _, _, data in _events(conn, "WHERE category = 'run' AND type = 'RunFaulted'")
        )
        other = dict(
            conn.execute(
                sa.text(
                    "SELECT type, count(*) FROM celery_durable_events "
                    "WHERE category = 'schedule' "
                    "AND type IN ('RunSkipped', 'RunFailedToStart', 'RunsMissed') GROUP BY type"
                )
            ).all()
        )
    by_run = Counter(rid for _, _, rid in decided)
    by_due = Counter((sid, due) for sid, due, _ in decided)
    report.add("decided runs (all)", len(decided))
    dup_ids = sum(1 for n in by_run.values() if n > 1)
    dup_dues = sum(1 for n in by_due.values() if n > 1)
    report.add("duplicate run IDs", dup_ids, dup_ids == 0)
    report.add("due times decided twice", dup_dues, dup_dues == 0)
    for kind in ("RunSkipped", "RunFailedToStart", "RunsMissed"):
        report.add(f"{kind} events", other.get(kind, 0), other.get(kind, 0) == 0)

    # Gaps: every due time of the rule from the anchor to the cut-off must be decided.
    lost, off_grid, expected_total = gaps(durable, decided, cutoff)
    report.add("due times up to the cut-off", expected_total)
    report.add("lost due times (gaps)", lost, lost == 0)
    report.add("decided off the rule's grid", off_grid, off_grid == 0)

    checked = [rid for sid, due, rid in decided if parse_due(due) <= cutoff]
    finished = sum(1 for rid in checked if ends.get(rid) == ["RunFinished"])
    not_finished = [rid for rid in checked if "RunFinished" not in ends.get(rid, [])]
    twice_ended = sum(1 for rid in by_run if len(ends.get(rid, [])) > 1)
    report.add("runs due up to the cut-off", len(checked))
    report.add("  of which Finished", finished, finished == len(checked))
    report.add("  not Finished (lost/stuck/faulted)", len(not_finished), not not_finished)
    report.add("runs with two endings", twice_ended, twice_ended == 0)
    report.add("runs Faulted", sum(faulted.values()), not faulted)
    report.faulted_errors = dict(faulted)
    for error, count in sorted(faulted.items()):
        report.add(f"  Faulted with {error.rsplit('.', 1)[-1]}", count, False)
    if not_finished:
        log(f"not finished (first 10): {not_finished[:10]}")
        for rid in not_finished[:10]:
            log(f"  {rid}: {ends.get(rid)}")

    double_steps = sum(1 for _, _, n in steps if n > 1)
    positions = Counter(rid for rid, _, _ in steps)
    incomplete = sum(
        1 for rid in checked if ends.get(rid) == ["RunFinished"] and positions.get(rid) != STEPS
    )
    report.add("step positions with two results", double_steps, double_steps == 0)
    report.add("finished runs without 4 step results", incomplete, incomplete == 0)

    with psycopg.connect(libpq(ledger_db)) as conn:
        ledger = {
            key: (calls, effects, refused)
            for key, calls, effects, refused in conn.execute(
                "SELECT key, calls, effects, refused FROM chaos_ledger"
            )
        }
        effects = {key for (key,) in conn.execute("SELECT key FROM chaos_effects")}
        call_rows: dict[str, list[tuple[int, int, int, bool]]] = defaultdict(list)
        for key, attempt, ppid, done, id_ in conn.execute(
            "SELECT key, attempt, ppid, done, id FROM chaos_calls ORDER BY id"
        ):
            call_rows[key].append((id_, attempt, ppid, done))
    # Keys of runs that finished must have exactly one effect. (A run that did not finish --
    # faulted, reported above, or due after the cut-off and stopped with the fleet -- may have
    # a call without its effect; no key may ever have two.)
    done = [rid for rid in checked if ends.get(rid) == ["RunFinished"]]
    expected_keys = {f"{TASK}/{rid}/{pos}" for rid in done for pos in range(STEPS)}
    missing = len(expected_keys - effects)
    not_one = sum(1 for key in expected_keys if ledger.get(key, (0, 0, 0))[1] != 1)
    twice = sum(1 for _, e, _ in ledger.values() if e > 1)
    report.add("ledger keys (step effects applied)", len(effects))
    report.add("ledger: effects missing for finished runs", missing, missing == 0)
    report.add("ledger: finished runs' keys with effects != 1", not_one, not_one == 0)
    report.add("ledger: keys with two effects", twice, twice == 0)
    repeated = {key: rows for key, rows in call_rows.items() if len(rows) > 1}
    explained = unexplained = retried = cancelled = lost_store = 0
    for key, rows in repeated.items():
        earlier = rows[:-1]
        if all(ppid in killed_workers for _, _, ppid, _ in earlier):
            explained += 1
        elif key.split("/")[1] in terminated_runs:
            cancelled += 1
        elif key.split("/")[1] in journal_lost_runs:
            lost_store += 1  # the step ran; storing its result met a terminated connection
        elif all(rows[i + 1][1] > rows[i][1] for i in range(len(rows) - 1)):
            retried += 1  # a ledger hiccup retried by the step's policy
        else:
            unexplained += 1
            log(f"unexplained repeated call {key}: {rows}")
    refused = sum(r for _, _, r in ledger.values())
    report.add("ledger: keys called more than once", len(repeated))
    report.add("  explained by a kill inside the step", explained)
    report.add("  explained by Celery terminating it (broker lost)", cancelled)
    report.add("  explained by a step retry", retried)
    report.add("  explained by a journal connection lost while storing it", lost_store)
    report.add("  unexplained", unexplained, unexplained == 0)
    report.add("ledger: repeated effects refused by key", refused)


def terminated(fleet: Fleet) -> set[str]:
    """Runs whose pool process Celery terminated itself: with ``acks_late`` a worker that loses
    the broker connection kills the running task rather than lose its acknowledgement."""
    found: set[str] = set()
    pattern = re.compile(r"Task chaos\.job\[(.+?)\] cannot be acknowledged after a connection")
    for proc in fleet.procs:
        if proc.kind == "worker":
            found.update(pattern.findall(proc.log_path.read_text(errors="replace")))
    return found


def journal_lost(fleet: Fleet) -> set[str]:
    """Runs whose delivery met a terminated journal connection while storing its progress: the
    step that had run is run again on the next delivery (at least once, S4's key refuses it)."""
    found: set[str] = set()
    # The worker logs the run ID as repr() (quoted, so a stored ID cannot forge a log line).
    pattern = re.compile(r"run '([^'\s]+)': journal unavailable")
    for proc in fleet.procs:
        if proc.kind == "worker":
            found.update(pattern.findall(proc.log_path.read_text(errors="replace")))
    return found


# -- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=2.0, help="length of the fault phase")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--drain-timeout", type=float, default=180.0)
    parser.add_argument("--beats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument(
        "--partitions",
        type=int,
        default=1,
        help="durable_partitions of the journal (D10): with more than 1 every beat works a share",
    )
    parser.add_argument("--keep", action="store_true", help="keep databases and logs")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--journal",
        choices=("postgres", "mysql"),
        default="postgres",
        help="the journal's database (mysql: beside CELERY_DURABLE_TEST_MYSQL_URL)",
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log(
        f"seed {seed}, {args.minutes} min of faults, journal on {args.journal}, "
        f"{args.partitions} partition(s), logs in {workdir}"
    )
    report = Report()
    with fresh_databases(args.keep, args.journal) as (journal_db, ledger_db):
        with psycopg.connect(libpq(ledger_db), autocommit=True) as conn:
            from tests.chaos.app import LEDGER_DDL

            conn.execute(LEDGER_DDL)
        redis = Redis(workdir)
        redis.start()
        env = {
            "CHAOS_BROKER": redis.url,
            "CHAOS_JOURNAL": journal_db.url,
            "CHAOS_LEDGER": libpq(ledger_db),
            "CHAOS_PARTITIONS": str(args.partitions),
        }
        durable = client(redis.url, journal_db.url)
        from celery_durable import CatchUp

        for sid, rule in workload():
            durable.schedules.create(sid, TASK, {"sid": sid}, rule, CatchUp.ALL)
        log(f"{len(workload())} schedules created")
        fleet = Fleet(workdir, env)
        try:
            status = run_phases(args, rng, fleet, redis, durable, journal_db, ledger_db, report)
        finally:
            fleet.stop("beat")
            fleet.stop("worker")
            durable.close()
            redis.stop()
    print()
    print(f"chaos run: seed {seed}, {args.minutes:g} min of faults, journal on {args.journal}")
    print(report.table())
    if status:
        return status
    if report.failed:
        print(f"FAILED: {', '.join(report.failed)}")
        return 1
    print("all invariants hold")
    return 0


def run_phases(
    args: argparse.Namespace,
    rng: random.Random,
    fleet: Fleet,
    redis: Redis,
    durable: Any,
    journal_db: JournalDb,
    ledger_db: str,
    report: Report,
) -> int:
    for _ in range(args.workers):
        fleet.spawn("worker")
    for _ in range(args.beats):
        fleet.spawn("beat")
    started = time.monotonic()
    length = args.minutes * 60
    once = {"redis": 0.3 * length, "terminate": 0.5 * length, "lock": 0.7 * length}
    counts = Counter[str]()
    lockers: list[threading.Thread] = []
    next_kill = started + rng.uniform(2, 5)
    while (elapsed := time.monotonic() - started) < length:
        for fault, at in list(once.items()):
            if elapsed < at:
                continue
            del once[fault]
            counts[fault] += 1
            if fault == "redis":
                log("restarting Redis (no persistence: queued messages are lost)")
                redis.stop()
                time.sleep(1)
                redis.start()
            elif fault == "terminate":
                killed = journal_db.terminate_connections()
                log(f"terminated {killed} journal connections ({journal_db.kind})")
            else:
                log("locking celery_durable_events for 10 s")
                locker = threading.Thread(target=journal_db.lock_events, args=(10.0,))
                locker.start()
                lockers.append(locker)
        if time.monotonic() >= next_kill:
            victim = fleet.kill_random(rng)
            counts[f"kill -9 {victim.kind}"] += 1
            fleet.spawn(victim.kind)
            next_kill = time.monotonic() + rng.uniform(2, 5)
        # A process that died on its own is a finding, but keep the fleet at strength.
        for kind, want in (("worker", args.workers), ("beat", args.beats)):
            for proc in [p for p in fleet.procs if p.kind == kind and not p.alive()]:
                if proc.popen.pid not in {pid for _, _, pid in fleet.killed}:
                    counts[f"{kind} exited on its own"] += 1
                    fleet.killed.append((time.time(), kind, proc.popen.pid))
                    log(
                        f"{proc.name} exited on its own ({proc.popen.returncode}); "
                        f"see {proc.log_path}"
                    )
            missing = want - len(fleet.live(kind))
            for _ in range(missing):
                fleet.spawn(kind)
        time.sleep(0.2)
    for locker in lockers:
        locker.join()
    cutoff = datetime.now(UTC)
    log(
        f"faults stopped at {cutoff:%H:%M:%S}; draining "
        "(every due time until now must be decided and its run finish)"
    )
    drain_started = time.monotonic()
    remaining = -1
    while time.monotonic() - drain_started < args.drain_timeout:
        try:
            remaining = unfinished(durable, journal_db, cutoff)
        except (psycopg.Error, sa.exc.SQLAlchemyError) as exc:
            log(f"journal read failed: {exc}")
        if remaining == 0:
            break
        time.sleep(2)
    drain = time.monotonic() - drain_started
    log(f"drain: {drain:.1f} s, {remaining} unfinished")
    fleet.stop("beat")
    fleet.stop("worker")
    for fault in ("kill -9 beat", "kill -9 worker", "redis", "terminate", "lock"):
        report.add(f"faults: {fault}", counts.get(fault, 0))
    for kind in ("beat", "worker"):
        report.add(f"{kind} exited on its own", counts.get(f"{kind} exited on its own", 0))
    report.add(
        "drain time to all Finished (s)",
        f"{drain:.1f}" if remaining == 0 else f">{args.drain_timeout:.0f}",
        remaining == 0,
    )
    killed_workers = {pid for _, kind, pid in fleet.killed if kind == "worker"}
    # The harness's own pooled connections were terminated too: read with a fresh client.
    reader = client(redis.url, journal_db.url)
    try:
        check(
            report, reader, journal_db, ledger_db, cutoff, killed_workers, terminated(fleet),
            journal_lost(fleet),
        )  # fmt: skip
    finally:
        reader.close()
    summary = {
        "faults": dict(counts),
        "failed": report.failed,
        "faulted_errors": report.faulted_errors,
        "figures": {name: value for name, value, _ in report.rows},
    }
    (fleet.workdir / "report.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
