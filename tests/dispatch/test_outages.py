"""Outages (D3, A6): the broker or the journal goes away for a while, the disk fills up.

The outages are real: a TCP proxy in front of Redis or PostgreSQL is cut (``tests/support/
tcpproxy.py``), or a process writes a SQLite file it may not write. Their length is
``CELERY_DURABLE_OUTAGE_SECONDS`` (30 s by default).

The tests at the end reproduce, deterministically, bugs the chaos harness (``tests/chaos/run.py``)
found (all fixed since).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from celery import Celery
from sqlalchemy.engine import make_url

from celery_durable import CatchUp, Durable, Every, Finished, ScheduledRun, step_context
from tests.support import services
from tests.support.processes import (
    ManagedProcess,
    child_env,
    python_command,
    running_process,
    wait_for,
)
from tests.support.tcpproxy import TcpProxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

UTC = timezone.utc
OUTAGE = float(os.environ.get("CELERY_DURABLE_OUTAGE_SECONDS", "30"))


@pytest.fixture
def own_redis() -> Iterator[str]:
    """A private ``redis-server``: the shared one is flushed by other tests at any moment,
    which would look exactly like a lost message."""
    handle = services.start_throwaway_redis()
    try:
        yield handle.url
    finally:
        handle.stop()


def client(broker: str, journal: str) -> Durable:
    """A Durable for the test process that knows the task names of ``tests.chaos.outage_app``."""
    app = Celery(f"outage-client-{uuid.uuid4().hex[:6]}", broker=broker)
    app.conf.task_ignore_result = True

    @app.task(name="outage.plain", shared=False)
    def plain(*args: Any) -> None:  # pragma: no cover - runs in the beat's app only
        return None

    @app.task(name="outage.job", shared=False)
    def job(*args: Any) -> None:  # pragma: no cover - a durable task in the worker only
        return None

    return Durable(app, journal)


@contextmanager
def beat(tmp_path: Path, env: dict[str, str], name: str = "beat") -> Iterator[ManagedProcess]:
    cmd = python_command(
        "-m", "celery", "-A", "tests.chaos.outage_app", "beat",
        "-S", "celery_durable.beat:DurableScheduler", "-l", "INFO",
        "--pidfile", str(tmp_path / f"{name}.pid"), "-s", str(tmp_path / f"{name}-schedule"),
    )  # fmt: skip
    with running_process(cmd, log_path=tmp_path / f"{name}.log", env=env) as proc:
        yield proc


@contextmanager
def worker(tmp_path: Path, env: dict[str, str]) -> Iterator[ManagedProcess]:
    cmd = python_command(
        "-m", "celery", "-A", "tests.chaos.outage_app", "worker", "--pool=solo",
        "-n", f"outage-{uuid.uuid4().hex[:6]}@%h", "--without-heartbeat", "--without-mingle",
        "--without-gossip", "-l", "INFO",
    )  # fmt: skip
    with running_process(cmd, log_path=tmp_path / "worker.log", env=env) as proc:
        wait_for(lambda: "ready" in proc.read_log(), timeout=60, processes=[proc])
        yield proc


def proxied(url: str, proxy: TcpProxy) -> str:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port
    return url.replace(f"{host}:{port}", f"127.0.0.1:{proxy.port}", 1)


def proxy_for(url: str, default_port: int) -> TcpProxy:
    parts = urlsplit(url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or default_port)
    proxy.restore()
    return proxy


def expected_dues(view: Any, until: datetime) -> list[datetime]:
    dues, moment = [], view.anchor
    while (moment := view.rule.next_after(moment, anchor=view.anchor)) <= until:
        dues.append(moment)
    return dues


# -- the broker ------------------------------------------------------------------------------


def test_broker_outage_runs_wait_and_are_enqueued_when_it_returns(
    tmp_path: Path, own_redis: str, sqlite_url: str
) -> None:
    redis_url = own_redis
    proxy = proxy_for(redis_url, 6379)
    broker = proxied(redis_url, proxy)
    durable = client(broker, sqlite_url)
    durable.schedules.create("tick", "outage.plain", None, Every(timedelta(seconds=1)), CatchUp.ALL)
    env = {"OUTAGE_BROKER": broker, "CELERY_DURABLE_URL": sqlite_url}
    try:
        with beat(tmp_path, env) as proc:

            def started() -> list[Any]:
                return [r for r in durable.schedules.runs("tick") if r.state == "started"]

            wait_for(lambda: len(started()) >= 2, timeout=60, processes=[proc])
            proxy.cut()
            cut_at = datetime.now(UTC)
            time.sleep(OUTAGE)
            proc.assert_alive()
            waiting = [r for r in durable.schedules.runs("tick") if r.state == "decided"]
            restored_at = datetime.now(UTC)
            proxy.restore()
            # Decided while the broker was away: they wait, decided, not lost, not dropped.
            assert len(waiting) >= OUTAGE * 0.5, [r.run_id for r in waiting]
            # Every due time up to the restore is decided and started: the ones decided while
            # the broker was away, and the last few (a tick blocked in kombu's connection
            # attempts may decide them only after the restore).
            wait_for(
                lambda: (
                    set(expected_dues(durable.schedules.state("tick"), restored_at))
                    <= {r.due for r in durable.schedules.runs("tick") if r.state == "started"}
                ),
                timeout=60,
                processes=[proc],
            )
            proc.assert_alive()
        log = proc.read_log()
    finally:
        proxy.cut()
    # Said once per outage, not once per tick.
    assert log.count("cannot enqueue") == 1, log[-3000:]
    assert log.count("broker reachable again") == 1, log[-3000:]
    assert "Traceback" not in log
    runs = durable.schedules.runs("tick")
    view = durable.schedules.state("tick")
    assert view is not None
    dues = {r.due for r in runs}
    assert set(expected_dues(view, restored_at)) <= dues, "a due time of the outage was lost"
    # Every run recorded as started is on the broker exactly once: JSON, run ID as task id.
    queue = redis.Redis.from_url(redis_url)
    try:
        bodies = [json.loads(m) for m in queue.lrange("celery", 0, -1)]
    finally:
        queue.close()
    ids = [m["headers"]["id"] for m in bodies]
    assert all(m["content-type"] == "application/json" for m in bodies)
    lost = sorted(r.run_id for r in runs if r.state == "started" and r.run_id not in set(ids))
    assert not lost, f"{len(lost)} run(s) recorded as started are not on the broker: {lost[:5]}"
    assert len(ids) == len(set(ids)), "a run was enqueued twice"
    # The runs due during the outage waited (decided, not sent: asserted above) and were sent
    # once it was over. (A start's time is that of the tick that sent it, which may have begun,
    # blocked on the broker, just before the restore.)
    late = [r for r in runs if cut_at + timedelta(seconds=6) < r.due <= restored_at]
    assert late and all(r.state == "started" and r.run_id in ids for r in late)
    durable.close()


# -- the journal -----------------------------------------------------------------------------


def test_journal_outage_beat_and_worker_retry_and_catch_up(
    tmp_path: Path, own_redis: str, pg_url: str
) -> None:
    redis_url = own_redis
    proxy = proxy_for(pg_url, 5432)
    journal = proxied(pg_url, proxy)
    durable = client(redis_url, pg_url)
    durable.schedules.create("job", "outage.job", None, Every(timedelta(seconds=1)), CatchUp.ALL)
    env = {"OUTAGE_BROKER": redis_url, "CELERY_DURABLE_URL": journal, "OUTAGE_RUN_LEASE": "8"}
    try:
        with worker(tmp_path, env) as work, beat(tmp_path, env) as sched:
            procs = [work, sched]

            def finished() -> int:
                return sum(1 for r in durable.schedules.runs("job") if r.outcome == "finished")

            wait_for(lambda: finished() >= 2, timeout=60, processes=procs)
            proxy.cut()
            cut_at = datetime.now(UTC)
            time.sleep(OUTAGE)
            for proc in procs:
                proc.assert_alive()
            restored_at = datetime.now(UTC)
            proxy.restore()
            view = durable.schedules.state("job")
            assert view is not None

            def caught_up() -> bool:
                runs = {r.due: r for r in durable.schedules.runs("job")}
                return all(
                    d in runs and runs[d].outcome == "finished"
                    for d in expected_dues(view, restored_at)
                )

            wait_for(caught_up, timeout=120, interval=1, processes=procs)
            for proc in procs:
                proc.assert_alive()
        beat_log = sched.read_log()
    finally:
        proxy.cut()
    runs = durable.schedules.runs("job")
    durable.close()
    # Nothing decided while the journal was away (the decision needs it) ...
    grace = timedelta(seconds=1)
    during = [r for r in runs if r.decided_at and cut_at + grace < r.decided_at < restored_at]
    assert not during, [r.run_id for r in during]
    # ... and everything due during the outage decided after it (CatchUp.ALL), once each.
    missed = [r for r in runs if cut_at < r.due <= restored_at]
    assert len(missed) >= OUTAGE * 0.8
    assert all(r.decided_at and r.decided_at >= restored_at - grace for r in missed)
    assert len({r.run_id for r in runs}) == len(runs)
    # Beat says it once per outage, not once per tick; it did not crash.
    assert beat_log.count("journal unavailable") == 1, beat_log[-3000:]
    assert beat_log.count("journal reachable again") == 1, beat_log[-3000:]
    assert "beat: Shutting down" not in beat_log.split("journal reachable again")[0]


# -- the disk --------------------------------------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import json, resource, signal, sys
    from celery import Celery
    from celery_durable import CatchUp, Durable, Every
    from datetime import timedelta
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death: a full disk
    mode, url = sys.argv[1], sys.argv[2]
    app = Celery("disk")
    def t(*args):
        return None
    app.task(name="disk.t")(t)
    durable = Durable(app, url)
    if mode == "full":
        durable.journal.ensure_ready()
        import os
        path = url.split("///", 1)[1]
        size = sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 64 * 1024, size + 64 * 1024))
    created = []
    try:
        for i in range(10_000):
            durable.schedules.create(
                f"s{i}", "disk.t", {"pad": "x" * 4000}, Every(timedelta(seconds=60)), CatchUp.NONE
            )
            created.append(f"s{i}")
    except Exception as exc:
        print(json.dumps({"created": created, "error": type(exc).__module__ + "." +
                          type(exc).__qualname__, "message": str(exc)[:500]}))
        sys.exit(0)
    print(json.dumps({"created": created, "error": None}))
    """
)


def _write(mode: str, url: str, user: tuple[int, int] | None = None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if user is not None:
        kwargs = {"user": user[0], "group": user[1], "extra_groups": []}
    done = subprocess.run(
        [sys.executable, "-c", _WRITER, mode, url],
        capture_output=True, text=True, timeout=180, env=child_env(), **kwargs,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _noop(*args: Any) -> None:
    return None


def _integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def _check_after(url: str, path: Path, created: list[str]) -> None:
    assert _integrity(path) == "ok"
    app = Celery("disk-check")
    app.task(name="disk.t")(_noop)
    durable = Durable(app, url)
    try:
        ids = {v.id for v in durable.schedules.list()}
        assert set(created) <= ids
        assert len(ids - set(created)) <= 1, "more than the refused schedule was stored"
        for sid in ids:
            assert durable.schedules.state(sid) is not None
    finally:
        durable.close()


def test_disk_full_gives_a_clear_error_and_no_corruption(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    url = f"sqlite:///{path}"
    outcome = _write("full", url)
    assert outcome["error"], "the file limit was never reached"
    text = (outcome["error"] + " " + outcome["message"]).lower()
    assert any(word in text for word in ("full", "disk", "i/o", "too large")), outcome
    _check_after(url, path, outcome["created"])


def test_read_only_journal_gives_a_clear_error_and_no_corruption(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    url = f"sqlite:///{path}"
    first = _write_some(url)
    before = path.read_bytes()
    # The file opened read-only (what a read-only mount or file mode gives SQLite).
    app = Celery("disk-ro")
    app.task(name="disk.t")(_noop)
    durable = Durable(app, f"sqlite:///file:{path}?mode=ro&uri=true")
    try:
        assert [v.id for v in durable.schedules.list()] == ["kept"]  # reading works
        with pytest.raises(Exception) as caught:
            durable.schedules.create("refused", "disk.t", 2, Every(timedelta(seconds=60)))
        text = f"{type(caught.value).__name__}: {caught.value}".lower()
        assert "readonly" in text or "read-only" in text or "read only" in text, text
        with pytest.raises(Exception) as again:
            durable.schedules.pause("kept")
        assert "readonly" in str(again.value).lower() or "read-only" in str(again.value).lower()
    finally:
        durable.close()
    assert path.read_bytes() == before
    _check_after(url, path, first)


def _write_some(url: str) -> list[str]:
    app = Celery("disk-setup")
    app.task(name="disk.t")(_noop)
    durable = Durable(app, url)
    try:
        durable.schedules.create("kept", "disk.t", 1, Every(timedelta(seconds=60)))
    finally:
        durable.close()
    return ["kept"]


# -- bugs the chaos harness found ---------------------------------------------------------------


@pytest.fixture(params=["postgres", "mysql"])
def losable(request: pytest.FixtureRequest) -> tuple[str, Callable[[], int]]:
    """A journal URL and a function that kills its server connections (returns how many)."""
    if request.param == "postgres":
        pg_url = str(request.getfixturevalue("pg_url"))
        url, name = services.with_application_name(pg_url)
        return url, lambda: services.terminate_backends(pg_url, name)
    mysql_url = str(request.getfixturevalue("mysql_url"))
    database = str(make_url(mysql_url).database)
    return mysql_url, lambda: services.kill_mysql_sessions(mysql_url, database)


def test_journal_connection_lost_during_a_step_does_not_fault_the_run(
    losable: tuple[str, Callable[[], int]],
) -> None:
    url, kill = losable
    app = Celery(f"lost-{uuid.uuid4().hex[:6]}")
    app.conf.update(task_ignore_result=True)
    durable = Durable(app, url)
    calls: list[int] = []

    @durable.step(name="cut")
    def cut() -> int:
        calls.append(step_context().attempt)
        if len(calls) == 1:
            assert kill() >= 1  # the pooled journal connection dies
        return 7

    @durable.task(name="lost.job")
    def job() -> int:
        return cut()

    rid = f"lost-{uuid.uuid4().hex[:8]}"
    try:
        job.apply(task_id=rid)  # the delivery may fail: the journal was away
        assert durable.run_ended(rid) in (None, "finished"), durable.outcome(rid, 0)
        job.apply(task_id=rid)  # the redelivery
        assert durable.outcome(rid, 10) == Finished(7)
    finally:
        durable.close()


def test_claim_racing_the_dispatchers_run_row_does_not_fail_the_delivery(
    losable: tuple[str, Callable[[], int]],
) -> None:
    """Found by the chaos harness (UniqueViolation on pk_celery_durable_runs in workers); fixed
    in the run row's write of a unit of work (insert-or-update)."""
    from celery_durable.message import Resend

    app = Celery(f"race-{uuid.uuid4().hex[:6]}")
    app.conf.update(task_ignore_result=True)
    durable = Durable(app, losable[0])

    @durable.task(name="race.job")
    def job(run: ScheduledRun | None = None) -> str:
        return "done"

    rid = f"race-{uuid.uuid4().hex[:8]}"
    inserted, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def dispatcher_side() -> None:
        # What Dispatcher._process does after publishing: the run's row, in its transaction.
        try:
            with durable.runtime.store.unit_of_work() as unit:
                unit.record_sent(
                    [Resend(run_id=rid, task="race.job")], now=datetime.now(UTC), lease=300
                )
                inserted.set()
                release.wait(10)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            inserted.set()

    durable.journal.ensure_ready()
    thread = threading.Thread(target=dispatcher_side)
    thread.start()
    inserted.wait(10)
    threading.Timer(1.0, release.set).start()  # commit while the worker's claim waits on it
    try:
        result = job.apply(task_id=rid)
        thread.join(10)
        assert not errors
        assert result.successful(), result.traceback
        assert durable.outcome(rid, 10) == Finished("done")
    finally:
        release.set()
        thread.join(10)
        durable.close()


def test_a_dropped_connection_surfaces_as_the_real_error(
    losable: tuple[str, Callable[[], int]],
) -> None:
    from sqlalchemy.exc import OperationalError

    from celery_durable.core.journal import Append, NewEvent

    url, kill = losable
    app = Celery(f"dropped-{uuid.uuid4().hex[:6]}")
    durable = Durable(app, url)
    journal = durable.journal
    try:
        journal.ensure_ready()
        append = Append(
            stream="test/dropped", expected_version=0, events=[NewEvent(type="T", data={})]
        )
        with pytest.raises(OperationalError), journal.transaction() as conn:
            assert kill() >= 1
            journal.append_in(conn, [append])
    finally:
        durable.close()
