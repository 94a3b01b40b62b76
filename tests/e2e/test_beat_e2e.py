"""``celery beat -S celery_durable.beat:DurableScheduler`` with real worker and beat processes.

Redis broker, PostgreSQL journal, the worker records every message it runs in a Redis list.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from celery import Celery
from celery.schedules import crontab

from celery_durable import Durable, Every, parse_run_id
from celery_durable.core.rules import Crontab
from celery_durable.store.journal.postgres import advisory_key
from celery_durable.store.journal.urls import normalize_url
from tests.support.processes import python_command, running_process, wait_for

APP = "tests.e2e.beat_app"


def received(client: redis.Redis) -> list[dict]:
    return [json.loads(raw) for raw in client.lrange("e2e:received", 0, -1)]


@pytest.fixture(params=["postgres", "mysql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Every test here runs with beat and the worker on PostgreSQL, then on MariaDB."""
    return str(request.getfixturevalue({"postgres": "pg_url", "mysql": "mysql_url"}[request.param]))


@pytest.fixture
def env(redis_url: str, db_url: str) -> dict[str, str]:
    return {"E2E_BROKER": redis_url, "E2E_SINK": redis_url, "CELERY_DURABLE_URL": db_url}


@pytest.fixture
def sink(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def worker_cmd() -> list[str]:
    return python_command(
        "-m", "celery", "-A", APP, "worker", "--pool=solo", "-l", "INFO", "-n", "w@%h"
    )


def beat_cmd(tmp_path: Path, scheduler: str = "celery_durable.beat:DurableScheduler") -> list[str]:
    return python_command(
        "-m", "celery", "-A", APP, "beat", "-S", scheduler, "-l", "INFO",
        "--schedule", str(tmp_path / "unused-beat-schedule"),
    )  # fmt: skip


def journal(url: str) -> Durable:
    return Durable(Celery("reader", set_as_current=False), url)


def test_beat_sends_consecutive_run_ids(tmp_path: Path, env: dict, sink: redis.Redis) -> None:
    env = env | {"E2E_BEAT": "every"}
    with (
        running_process(worker_cmd(), log_path=tmp_path / "worker.log", env=env) as worker,
        running_process(beat_cmd(tmp_path), log_path=tmp_path / "beat.log", env=env) as beat,
    ):
        wait_for(lambda: len(received(sink)) >= 5, timeout=40, processes=[worker, beat])
    got = received(sink)
    ids = [m["id"] for m in got]
    dues = [parse_run_id(i) for i in ids]
    assert all(sid == "every-second" for sid, _ in dues)
    assert all(re.fullmatch(r"every-second@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{7}Z", i) for i in ids)
    steps = {b[1] - a[1] for a, b in pairwise(sorted(dues))}
    assert steps == {timedelta(seconds=1)}
    assert len(ids) == len(set(ids))
    first = got[0]
    assert first["args"] == ["s"]
    assert first["headers"]["durable_schedule"] == "every-second"
    assert first["id"].endswith(first["headers"]["durable_due"])


def test_kill_after_decision_before_enqueue_loses_nothing(
    tmp_path: Path, env: dict, sink: redis.Redis, db_url: str
) -> None:
    env = env | {"E2E_BEAT": "every"}
    with running_process(worker_cmd(), log_path=tmp_path / "worker.log", env=env) as worker:
        crash_env = env | {"CELERY_DURABLE_TEST_CRASH": "after-decide"}
        with running_process(
            beat_cmd(tmp_path), log_path=tmp_path / "beat1.log", env=crash_env
        ) as beat:
            wait_for(lambda: beat.returncode is not None, timeout=40)
            assert beat.returncode == -signal.SIGKILL
        reader = journal(db_url)
        runs = reader.schedules.runs("every-second")
        assert runs and {r.state for r in runs} == {"decided"}
        lost = {r.run_id for r in runs}
        assert received(sink) == []
        with running_process(beat_cmd(tmp_path), log_path=tmp_path / "beat2.log", env=env) as beat:
            wait_for(
                lambda: (
                    lost <= {m["id"] for m in received(sink)}
                    and len(received(sink)) >= len(lost) + 2
                ),
                timeout=40,
                processes=[worker, beat],
            )
        ids = [m["id"] for m in received(sink)]
        assert len(ids) == len(set(ids)), "a run was enqueued twice"
        started = {r.run_id: r.state for r in reader.schedules.runs("every-second")}
        assert all(started[i] == "started" for i in lost)
        reader.close()


def test_existing_beat_schedule_runs_unchanged_with_the_alias(
    tmp_path: Path, env: dict, sink: redis.Redis, db_url: str
) -> None:
    env = env | {"E2E_BEAT": "stock"}
    with (
        running_process(worker_cmd(), log_path=tmp_path / "worker.log", env=env) as worker,
        running_process(
            beat_cmd(tmp_path, "durable"), log_path=tmp_path / "beat.log", env=env
        ) as beat,
    ):
        wait_for(
            lambda: len([m for m in received(sink) if m["args"][:1] == ["interval"]]) >= 2,
            timeout=40,
            processes=[worker, beat],
        )
        assert "celery_durable.beat.DurableScheduler" in beat.read_log()
    interval = [m for m in received(sink) if m["args"][:1] == ["interval"]]
    assert interval[0]["args"] == ["interval"] and interval[0]["kwargs"] == {"n": 2}
    assert interval[0]["id"].startswith("interval-2s@")
    reader = journal(db_url)
    cron = reader.schedules.state("each-minute-cron")
    assert cron is not None and cron.rule == Crontab.from_celery(crontab(), "Europe/Oslo")
    assert cron.options == {"args": ["cron", 1], "beat_entry": "each-minute-cron"}
    every = reader.schedules.state("interval-2s")
    assert every is not None and every.rule == Every(timedelta(seconds=2))
    assert every.options == {
        "args": ["interval"],
        "kwargs": {"n": 2},
        "expires": 60,
        "beat_entry": "interval-2s",
    }
    reader.close()


@pytest.mark.slow
def test_two_beats_one_killed_each_due_time_decided_once(
    tmp_path: Path, env: dict, sink: redis.Redis, db_url: str
) -> None:
    env = env | {"E2E_BEAT": "every", "E2E_LEASE": "3"}
    with (
        running_process(worker_cmd(), log_path=tmp_path / "worker.log", env=env) as worker,
        running_process(beat_cmd(tmp_path), log_path=tmp_path / "beat1.log", env=env) as one,
        running_process(beat_cmd(tmp_path), log_path=tmp_path / "beat2.log", env=env) as two,
    ):
        wait_for(lambda: len(received(sink)) >= 30, timeout=60, processes=[worker, one, two])
        leader = one if "taken by" in one.read_log() else two
        leader.kill()
        # Distinct runs: a run re-sent around the takeover must not count twice.
        wait_for(
            lambda: len({m["id"] for m in received(sink)}) >= 60, timeout=60, processes=[worker]
        )
    reader = journal(db_url)
    runs = reader.schedules.runs("every-second")
    reader.close()
    dues = sorted(r.due for r in runs)
    assert len(dues) == len(set(dues)), "a due time was decided twice"
    # CatchUp.ALL: no gap either, even across the takeover.
    assert all(b - a == timedelta(seconds=1) for a, b in pairwise(dues))
    ids = [m["id"] for m in received(sink)]
    assert len(set(ids)) >= 60
    duplicates = len(ids) - len(set(ids))
    assert duplicates <= 3, f"{duplicates} runs enqueued twice around the takeover"
    assert isinstance(dues[0], datetime)


def _hold_the_schedule_lock(url: str) -> tuple[sa.engine.Engine, sa.engine.Connection]:
    """Open a transaction holding the lock a beat's decision append waits for."""
    engine = sa.create_engine(url)
    conn = engine.connect()
    if engine.dialect.name == "postgresql":
        key = advisory_key("category:schedule")
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
    else:
        conn.execute(
            sa.text("SELECT name FROM celery_durable_locks WHERE name = 'schedule' FOR UPDATE")
        )
    return engine, conn


def test_sigterm_while_a_decision_waits_for_its_lock_still_gives_the_lease_up(
    tmp_path: Path, env: dict, sink: redis.Redis, db_url: str
) -> None:
    """``celery beat``'s SIGTERM handler closes the scheduler in the middle of what the beat
    was doing. Here that is a decision's transaction, blocked on the category lock another
    session holds: the close must still write what it writes and give the lease up (so a
    standby takes over at once, D6), after the interrupted transaction unwinds."""
    env = env | {"E2E_BEAT": "every"}
    with running_process(beat_cmd(tmp_path), log_path=tmp_path / "beat.log", env=env) as beat:
        wait_for(lambda: sink.llen("celery") >= 2, timeout=40, processes=[beat])
        engine, conn = _hold_the_schedule_lock(normalize_url(db_url).render_as_string(False))
        try:
            time.sleep(2.0)  # the next due time's decision now waits for the lock
            beat.popen.send_signal(signal.SIGTERM)
            time.sleep(1.0)
        finally:
            conn.rollback()
            conn.close()
            engine.dispose()
        assert beat.popen.wait(20) is not None
    log = (tmp_path / "beat.log").read_text()
    assert "could not release" not in log and "could not write" not in log, log[-3000:]
    reader = journal(db_url)
    try:
        with reader.journal.engine.connect() as c:
            held = c.execute(sa.text("SELECT name, owner FROM celery_durable_leases")).all()
    finally:
        reader.close()
    assert held == [], f"the stopped beat kept its lease: {held}"
