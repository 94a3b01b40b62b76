"""Durable tasks on real ``celery worker`` processes with a Redis broker (W1-W8).

The app the workers run is ``tests/support/durable_apps.py``. Steps record every execution in
a SQLite file the test owns (``calls``), so "ran once" is counted outside the journal.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import create_engine, text

from celery_durable import Durable
from celery_durable.core.outcomes import Faulted, Finished
from celery_durable.errors import RunEnded
from tests.support.durable_apps import calls
from tests.support.processes import ManagedProcess, python_command, running_process, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


class World:
    include: tuple[str, ...] = ()
    """More task modules the workers import (``celery worker --include``)."""

    def __init__(self, tmp_path: Path, broker: str, journal: str, **env: str) -> None:
        self.tmp = tmp_path
        self.calls = tmp_path / "calls.db"
        self.gate = tmp_path / "gate"
        self.env = {
            "E2E_BROKER": broker,
            "E2E_JOURNAL": journal,
            "E2E_CALLS": str(self.calls),
            "E2E_GATE": str(self.gate),
            **env,
        }
        self.app = Celery(f"client-{uuid.uuid4().hex[:6]}", broker=broker)
        self.app.conf.task_ignore_result = True
        self.durable = Durable(self.app, journal)
        self.workers = 0

    @contextmanager
    def worker(self, **env: str) -> Iterator[ManagedProcess]:
        self.workers += 1
        name = f"w{self.workers}"
        cmd = python_command(
            "-m", "celery", "-A", "tests.support.durable_apps", "worker", "--pool=solo",
            "--concurrency=1", "-n", f"{name}@%h", "--without-heartbeat", "--without-mingle",
            "--without-gossip", "--loglevel=INFO",
            *(("--include", ",".join(self.include)) if self.include else ()),
        )  # fmt: skip
        with running_process(
            cmd, log_path=self.tmp / f"{name}.log", env={**self.env, **env}
        ) as proc:
            wait_for(lambda: "ready" in proc.read_log(), timeout=30, processes=[proc])
            yield proc

    def send(self, task: str, *args: Any, run_id: str | None = None) -> str:
        rid = run_id or f"{task}-{uuid.uuid4().hex[:8]}"
        self.app.send_task(task, args=list(args), task_id=rid)
        return rid

    def count(self, what: str) -> int:
        return len(calls(self.calls, what))

    def close(self) -> None:
        self.durable.close()


@pytest.fixture
def world_factory(tmp_path: Path, redis_url: str) -> Iterator[Any]:
    made: list[World] = []

    def make(journal: str, **env: str) -> World:
        w = World(tmp_path, redis_url, journal, **env)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


@pytest.mark.parametrize("journal", ["postgres", "mysql"])
def test_crash_in_step_three_reruns_only_step_three(
    world_factory: Any, journal: str, request: pytest.FixtureRequest
) -> None:
    """kill -9 inside step 3; a new worker gets the redelivered message and finishes the run."""
    url = request.getfixturevalue({"postgres": "pg_url", "mysql": "mysql_url"}[journal])
    world = world_factory(url, E2E_VISIBILITY="3")
    with world.worker() as first:
        rid = world.send("e2e.five_steps")
        wait_for(lambda: world.count("step3") == 1, timeout=30, processes=[first])
        first.kill()
    world.gate.touch()
    with world.worker():
        assert world.durable.outcome(rid, 40) == Finished([1, 2, 3, 4, 5])
    assert [world.count(f"step{i}") for i in range(1, 6)] == [1, 1, 2, 1, 1]
    keys = {row[1] for row in calls(world.calls, "step3")}
    assert keys == {f"e2e.five_steps/{rid}/2"}


@pytest.mark.parametrize("journal", ["sqlite", "postgres"])
def test_durable_sleep_gives_the_worker_back_and_survives_a_restart(
    world_factory: Any, journal: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("sqlite_url" if journal == "sqlite" else "pg_url")
    world = world_factory(url)
    with world.worker() as worker:
        rid = world.send("e2e.sleeper", 3.0)
        wait_for(lambda: world.count("before_sleep") == 1, timeout=30, processes=[worker])
        world.send("e2e.quick", "during")
        wait_for(lambda: world.count("during") == 1, timeout=10, processes=[worker])
    # The worker was stopped (warm shutdown) during the sleep; a new one takes over.
    with world.worker():
        outcome = world.durable.outcome(rid, 30)
    assert isinstance(outcome, Finished)
    before, after = outcome.value
    during = calls(world.calls, "during")[0][3]
    assert before < during < after
    assert after >= before + 3.0
    assert after <= before + 3.0 + 5.0, "the restart postponed the wake-up"
    assert world.count("after_sleep") == 1


def test_signals_before_and_after_the_wait_timeout_and_refusal(
    world_factory: Any, sqlite_url: str
) -> None:
    world = world_factory(sqlite_url)
    early = f"early-{uuid.uuid4().hex[:6]}"
    world.durable.signal(early, "go", "sent before")
    with world.worker():
        world.send("e2e.waiter", "go", 20, run_id=early)
        late = world.send("e2e.waiter", "go", None)
        timed = world.send("e2e.waiter", "go", 1.5)
        assert world.durable.result(early, 20) == {"got": "sent before"}
        wait_for(
            lambda: (world.durable.runs.row(late) or {}).get("status") == "suspended", timeout=20
        )
        world.durable.signal(late, "go", {"n": 2})
        assert world.durable.result(late, 20) == {"got": {"n": 2}}
        started = time.monotonic()
        assert world.durable.result(timed, 20) == {"got": None}
    assert time.monotonic() - started < 20
    with pytest.raises(RunEnded):
        world.durable.signal(early, "go", "too late")


def test_retry_backoff_and_deadline_across_a_restart(world_factory: Any, pg_url: str) -> None:
    """flaky: 2 s between attempts, deadline 5 s from the stored first start -> 3 attempts."""
    world = world_factory(pg_url)
    with world.worker() as worker:
        rid = world.send("e2e.retrying")
        other = world.send("e2e.not_retryable")
        wait_for(lambda: world.count("flaky") == 1, timeout=30, processes=[worker])
        outcome = world.durable.outcome(other, 20)
        assert isinstance(outcome, Faulted) and outcome.kind == "not_retryable"
        assert world.count("refuses") == 1
    with world.worker():
        outcome = world.durable.outcome(rid, 30)
    assert isinstance(outcome, Faulted) and outcome.kind == "error"
    rows = calls(world.calls, "flaky")
    times = [row[3] for row in rows]
    attempts = [row[2] for row in rows]
    # Attempts count up across the restart; on an idle machine there are three (0 s, 2 s,
    # 4 s). A slow restart can push the third past the deadline, which the policy must then
    # refuse: so check the rule itself, measured from the stored first start.
    assert attempts == list(range(1, len(attempts) + 1)) and len(attempts) >= 2
    assert all(b - a >= 1.9 for a, b in pairwise(times))
    assert all(t - times[0] <= 5.5 for t in times), "an attempt ran after the deadline"


def test_changed_body_parks_the_run(world_factory: Any, pg_url: str) -> None:
    world = world_factory(pg_url, E2E_VISIBILITY="3")
    with world.worker(E2E_BODY="1") as first:
        rid = world.send("e2e.changing")
        wait_for(lambda: world.count("gated_then") == 1, timeout=30, processes=[first])
        first.kill()
    with world.worker(E2E_BODY="2"):
        outcome = world.durable.outcome(rid, 40)
    assert isinstance(outcome, Faulted) and outcome.kind == "parked"
    assert "position 1" in outcome.error
    assert "second_v1" in outcome.error and "second_v2" in outcome.error
    assert world.count("second_v2") == 0 and world.count("first") == 1


@pytest.mark.parametrize("journal", ["sqlite", "postgres", "mysql"])
def test_two_workers_receiving_one_run_execute_it_once(
    world_factory: Any, journal: str, request: pytest.FixtureRequest
) -> None:
    fixture = {"sqlite": "sqlite_url", "postgres": "pg_url", "mysql": "mysql_url"}[journal]
    url = request.getfixturevalue(fixture)
    world = world_factory(url)
    with world.worker() as one, world.worker() as two:
        rid = f"twice-{uuid.uuid4().hex[:8]}"
        world.send("e2e.twice", run_id=rid)
        world.send("e2e.twice", run_id=rid)
        assert world.durable.result(rid, 30) == [0, 1, 2]

        # Both deliveries ended: one ran the steps; the other found the run claimed (W8:
        # ignored, so that Celery's backend keeps the owner's result) or already finished
        # (W1: succeeded, with the stored result).
        def ended() -> int:
            logs = one.read_log() + two.read_log()
            return logs.count(f"[{rid}] succeeded") + logs.count(f"[{rid}] ignored")

        wait_for(lambda: ended() == 2, timeout=10)
    assert [world.count(f"slow{i}") for i in range(3)] == [1, 1, 1]


def test_long_sleep_is_left_to_the_dispatcher_and_early_deliveries_sleep_again(
    world_factory: Any, pg_url: str
) -> None:
    """With visibility_timeout=2 only waits up to 1 s use a countdown: a 4 s sleep is stored
    for the dispatcher (RunStore.wakeups); a copy delivered early goes back to sleep."""
    world = world_factory(pg_url, E2E_VISIBILITY="2")
    with world.worker() as worker:
        rid = world.send("e2e.sleeper", 4.0)
        wait_for(
            lambda: (world.durable.runs.row(rid) or {}).get("status") == "suspended",
            timeout=30,
            processes=[worker],
        )
        row = world.durable.runs.row(rid)
        version = len(world.durable.journal.read_stream(f"run/{rid}"))
        # An early copy (as Redis would redeliver): nothing is stored, nothing runs.
        world.app.send_task("e2e.sleeper", args=[4.0], task_id=rid)
        # Both deliveries gave the worker back: ignored (nothing in Celery's result backend).
        wait_for(lambda: worker.read_log().count(f"[{rid}] ignored") == 2, timeout=10)
        assert f"[{rid}] succeeded" not in worker.read_log()
        time.sleep(0.5)
        assert len(world.durable.journal.read_stream(f"run/{rid}")) == version
        assert world.count("before_sleep") == 1
        # The dispatcher's part: send the run again once it is due.
        due = wait_for(lambda: world.durable.runs.wakeups(world.durable.now()), timeout=10)
        assert [r.run_id for r in due] == [rid] and due[0].args == [4.0]
        due[0].send(world.app)
        outcome = world.durable.outcome(rid, 20)
    assert isinstance(outcome, Finished)
    before, after = outcome.value
    assert after >= before + 4.0
    assert row["wake_at"] is not None
    assert world.count("after_sleep") == 1


def _tagged(url: str, tag: str) -> str:
    """``url`` with ``application_name=<tag>``: the test can find its own server sessions."""
    return f"{url}{'&' if '?' in url else '?'}application_name={tag}"


def _drop_sessions(url: str, tag: str) -> int:
    """What a PostgreSQL restart or ``idle_session_timeout`` does to the tagged sessions."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            dropped = conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = :tag"
                ),
                {"tag": tag},
            )
            return int(dropped.scalar_one())
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "engine_options",
    [pytest.param("{}", id="defaults"), pytest.param('{"pool_pre_ping": false}', id="no-pre-ping")],
)
def test_the_server_dropping_idle_connections_between_steps_repeats_no_step(
    world_factory: Any, pg_url: str, engine_options: str
) -> None:
    """The server closes every pooled connection while the body works between two steps.
    With the defaults the dead connection is replaced at checkout (pre-ping); without
    pre-ping, the step's result store fails on it and is stored again on a fresh connection
    instead of giving the delivery up (which would run ``ship`` a second time, W2)."""
    tag = f"cdt-{uuid.uuid4().hex[:10]}"
    world = world_factory(_tagged(pg_url, tag), E2E_ENGINE_OPTIONS=engine_options)
    with world.worker() as worker:
        rid = world.send("e2e.charge_then_ship")
        wait_for(lambda: world.count("between") == 1, timeout=30, processes=[worker])
        assert _drop_sessions(pg_url, tag) >= 1
        world.gate.touch()
        assert world.durable.outcome(rid, 30) == Finished(["charged", "shipped"])
        log = worker.read_log()
    assert [world.count("charge"), world.count("ship")] == [1, 1], log
    assert "journal unavailable" not in log
    if engine_options != "{}":  # the dead connection reached the result store: stored again
        assert "storing it again on a fresh connection" in log
