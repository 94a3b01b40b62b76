"""Start deadlines and jitter with real ``celery beat`` and worker processes (SPEC §5d: P1, P2).

On Redis and on RabbitMQ, with a PostgreSQL journal. The task records its run ID and the
moment it began in a Redis list (the sink), whatever the broker.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_durable import Durable, Once, parse_run_id
from celery_durable.core.policies import jitter_offset
from celery_durable.core.schedule_events import RunDecided, RunSent
from tests.support.processes import python_command, running_process, wait_for

APP = "tests.e2e.policy_app"
UTC = timezone.utc


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest, redis_url: str) -> str:
    if request.param == "redis":
        return redis_url
    return str(request.getfixturevalue("amqp_url"))


@pytest.fixture
def queue(broker_url: str) -> Iterator[str]:
    """A queue of this test's own (the RabbitMQ vhost is shared), deleted afterwards."""
    name = f"policies-{uuid.uuid4().hex[:8]}"
    yield name
    if broker_url.startswith("amqp"):
        import kombu

        with kombu.Connection(broker_url) as conn, contextlib.suppress(Exception):
            conn.default_channel.queue_delete(name)


@pytest.fixture
def sink(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def ran(sink: redis.Redis) -> list[dict]:
    return [json.loads(raw) for raw in sink.lrange("e2e:ran", 0, -1)]


def env_of(broker_url: str, redis_url: str, pg_url: str, queue: str, **extra: str) -> dict:
    return {
        "E2E_BROKER": broker_url,
        "E2E_SINK": redis_url,
        "CELERY_DURABLE_URL": pg_url,
        "E2E_QUEUE": queue,
        **extra,
    }


def worker_cmd(queue: str) -> list[str]:
    return python_command(
        "-m", "celery", "-A", APP, "worker", "--pool=solo", "-l", "INFO", "-Q", queue,
        "-n", f"{queue}@%h",
    )  # fmt: skip


def beat_cmd(tmp_path: Path) -> list[str]:
    return python_command(
        "-m", "celery", "-A", APP, "beat", "-S", "durable", "-l", "INFO",
        "--schedule", str(tmp_path / "unused-beat-schedule"),
    )  # fmt: skip


def reader(pg_url: str) -> Durable:
    """The test's own view of the journal (it knows the task's name, to create schedules)."""
    app = Celery("reader", set_as_current=False)

    @app.task(name="e2e.policy_tick", shared=False)
    def policy_tick() -> None:  # pragma: no cover - runs in the worker's app
        """The name only."""

    return Durable(app, pg_url)


# P1 -------------------------------------------------------------------------------------------


def test_workers_down_20s_under_every_second_with_a_5s_start_deadline(
    tmp_path: Path, broker_url: str, redis_url: str, pg_url: str, queue: str, sink: redis.Redis
) -> None:
    """The flood after a worker outage is gone: nothing older than its deadline runs."""
    deadline = timedelta(seconds=5)
    env = env_of(broker_url, redis_url, pg_url, queue, E2E_POLICY="deadline")
    journal = reader(pg_url)
    try:
        with running_process(beat_cmd(tmp_path), log_path=tmp_path / "beat.log", env=env) as beat:
            with running_process(
                worker_cmd(queue), log_path=tmp_path / "worker1.log", env=env
            ) as worker:
                wait_for(lambda: len(ran(sink)) >= 3, timeout=60, processes=[worker, beat])
            stopped = time.time()  # warm shutdown done: no worker consumes the queue
            time.sleep(20)
            beat.assert_alive()
            with running_process(
                worker_cmd(queue), log_path=tmp_path / "worker2.log", env=env
            ) as worker:
                back = datetime.now(UTC)

                def accounted() -> bool:
                    done = {r["id"] for r in ran(sink)}
                    runs = journal.schedules.runs("every-second")
                    upto = [r for r in runs if r.due <= back + timedelta(seconds=3)]
                    return bool(upto) and all(
                        r.run_id in done or r.state == "missed" for r in upto
                    ) and max(r.due for r in runs) > back + timedelta(seconds=3)  # fmt: skip

                wait_for(accounted, timeout=60, interval=0.5, processes=[worker, beat])
        runs = journal.schedules.runs("every-second")
        assert journal.schedules.state("every-second").start_deadline == deadline
    finally:
        journal.close()
    executed = ran(sink)
    ids = [r["id"] for r in executed]
    assert len(ids) == len(set(ids)), "a run executed twice"
    started_at = {r["id"]: datetime.fromtimestamp(r["at"], UTC) for r in executed}
    # No run older than its deadline executed (Celery checks the expiry just before running).
    for rid, at in started_at.items():
        _, due = parse_run_id(rid)
        assert at - due <= deadline + timedelta(milliseconds=500), (rid, at)
    # Every due time is accounted for: started, or missed with the reason; none both.
    dues = sorted(r.due for r in runs)
    assert all(b - a == timedelta(seconds=1) for a, b in pairwise(dues))
    cutoff = back + timedelta(seconds=3)
    missed = [r for r in runs if r.state == "missed"]
    for run in runs:
        if run.due > cutoff:
            continue
        assert (run.run_id in started_at) != (run.state == "missed"), run
    assert {r.error for r in missed} == {
        "start deadline passed while the message waited for a worker"
    }
    # About 20 s of runs waited: the ~5 s before the worker came back ran (late), the rest
    # were missed instead of flooding the worker.
    outage = [
        r for r in runs if stopped + 1 < r.due.timestamp() < back.timestamp() - deadline.seconds
    ]
    assert len(outage) >= 10 and all(r.state == "missed" for r in outage)
    late = [
        rid for rid, at in started_at.items() if at - parse_run_id(rid)[1] > timedelta(seconds=1)
    ]
    assert late, "the runs still within their deadline when the worker returned should run"


# P2 -------------------------------------------------------------------------------------------


def test_jitter_offsets_survive_a_beat_kill_and_restart(
    tmp_path: Path, broker_url: str, redis_url: str, pg_url: str, queue: str, sink: redis.Redis
) -> None:
    """Decided by a beat that is killed (-9) at once; sent by the next at the same offsets."""
    jitter = timedelta(seconds=10)
    env = env_of(broker_url, redis_url, pg_url, queue, E2E_LEASE="2")
    journal = reader(pg_url)
    sids = [f"j{n:02d}" for n in range(40)]
    try:
        with running_process(
            worker_cmd(queue), log_path=tmp_path / "worker.log", env=env
        ) as worker:
            due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=8)
            for sid in sids:
                journal.schedules.create(sid, "e2e.policy_tick", None, Once(due), jitter=jitter)
            crash = env | {"CELERY_DURABLE_TEST_CRASH": "after-decide"}
            with running_process(
                beat_cmd(tmp_path), log_path=tmp_path / "beat1.log", env=crash
            ) as beat:
                wait_for(lambda: beat.returncode is not None, timeout=40)
                assert beat.returncode == -9
            killed = datetime.now(UTC)
            assert ran(sink) == []
            with running_process(
                beat_cmd(tmp_path), log_path=tmp_path / "beat2.log", env=env
            ) as beat:

                def all_sent_and_ran() -> bool:
                    # The beat records a start just after the send: wait for the records too.
                    recorded = sum(s.state == "started" for s in map(last_run, sids))
                    return len(ran(sink)) >= len(sids) and recorded == len(sids)

                def last_run(sid: str) -> object:
                    return journal.schedules.runs(sid)[0]

                wait_for(all_sent_and_ran, timeout=60, interval=0.5, processes=[worker, beat])
        decided = {}
        started = {}
        for sid in sids:
            events = journal._store.events(sid)
            [decision] = [e for e in events if isinstance(e, RunDecided)]
            decided[decision.run_id] = decision
            started[decision.run_id] = [e.at for e in events if isinstance(e, RunSent)]
    finally:
        journal.close()
    executed = {r["id"]: datetime.fromtimestamp(r["at"], UTC) for r in ran(sink)}
    assert set(executed) == set(decided) and len(ran(sink)) == len(sids)
    # The second beat started about 2 s (the lease) + its start-up after the kill.
    # The second beat took over (after the 2 s lease and its start-up) when it sent the first
    # run; every run whose offset falls later must be sent at its moment, not before or late.
    took_over = min(at for ats in started.values() for at in ats)
    assert took_over > killed
    on_time = [rid for rid, d in decided.items() if d.send_at > took_over + timedelta(seconds=1)]
    assert len(on_time) >= 5
    for rid, decision in decided.items():
        assert decision.due == due and decision.send_at == due + jitter_offset(rid, jitter)
        [sent] = started[rid]
        assert sent >= decision.send_at  # never before its offset
        assert executed[rid] >= decision.send_at - timedelta(milliseconds=50)
        if rid in on_time:  # slept until the jittered moment, sent then
            assert sent - decision.send_at < timedelta(seconds=1), rid


def test_durable_runs_delivered_after_their_deadline_never_start(
    tmp_path: Path, broker_url: str, redis_url: str, pg_url: str, queue: str, sink: redis.Redis
) -> None:
    """A durable task's message has no expiry (a started run must go on): the worker checks
    the deadline and ends a run that had not started as missed, with its run row."""
    deadline = timedelta(seconds=3)
    env = env_of(broker_url, redis_url, pg_url, queue, E2E_POLICY="durable-deadline")
    journal = reader(pg_url)
    sid = "durable-every-second"
    try:
        with running_process(beat_cmd(tmp_path), log_path=tmp_path / "beat.log", env=env) as beat:
            wait_for(lambda: len(journal.schedules.runs(sid)) >= 10, timeout=60, processes=[beat])
            with running_process(
                worker_cmd(queue), log_path=tmp_path / "worker.log", env=env
            ) as worker:
                back = datetime.now(UTC)

                def accounted() -> bool:
                    done = {r["id"] for r in ran(sink)}
                    upto = [r for r in journal.schedules.runs(sid) if r.due <= back]
                    return all(r.run_id in done or r.state == "missed" for r in upto)

                wait_for(accounted, timeout=60, interval=0.5, processes=[worker, beat])
        runs = [r for r in journal.schedules.runs(sid) if r.due <= back]
        rows = {r.run_id: journal.runs.row(r.run_id) for r in runs}
    finally:
        journal.close()
    started_at = {r["id"]: datetime.fromtimestamp(r["at"], UTC) for r in ran(sink)}
    missed = [r for r in runs if r.state == "missed"]
    assert len(missed) >= 5  # the worker came back about 10 s after the first due time
    for run in missed:
        assert run.error == "start deadline passed before a worker began the durable run"
        assert run.run_id not in started_at
        assert rows[run.run_id]["status"] == "missed"
    for rid, at in started_at.items():
        assert at - parse_run_id(rid)[1] <= deadline + timedelta(milliseconds=500), rid
    assert all(r.run_id in started_at for r in runs if r.state != "missed")
