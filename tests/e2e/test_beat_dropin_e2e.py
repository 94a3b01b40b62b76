"""Stock ``celery beat`` and ``celery beat -S durable`` side by side on one project (SPEC §5a).

A realistic ``beat_schedule`` (``tests/e2e/dropin_app.py``: crontabs with lists and names,
intervals, ``relative=True``, solar, a custom ``BaseSchedule``, a task only the worker knows,
headers, a queue, a datetime ``expires``, a name that breaks S1) runs under both schedulers at
once, on Redis and on RabbitMQ, with one real worker. Every entry's message must reach the
worker as stock beat's does: same task, args, kwargs, headers and options.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_durable import Durable, Every, parse_run_id
from celery_durable.core.ids import schedule_id_for_name
from celery_durable.core.schedule_events import SchedulePaused
from celery_durable.importers.beat_schedule import REMOVED
from tests.support.processes import ManagedProcess, python_command, running_process, wait_for

APP = "tests.e2e.dropin_app"
SENT = sorted(
    [
        *("cron-lists", "cron-names", "interval", "seconds", "relative", "custom"),
        *("worker-only", "headers", "queue", "expires-at", "limits", "weekly ~ report"),
    ]
)
"""The entries of ``dropin_app`` seen within a minute: all but "solar" (a sunset)."""


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest, redis_url: str) -> str:
    if request.param == "redis":
        return redis_url
    return str(request.getfixturevalue("amqp_url"))


@pytest.fixture
def sink(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def received(sink: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in sink.lrange("e2e:dropin", 0, -1)]


def by_scheduler(messages: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """The first message of each entry, for stock beat (random ids) and durable (run IDs)."""
    out: dict[str, dict[str, dict[str, Any]]] = {"stock": {}, "durable": {}}
    for message in messages:
        which = "durable" if "@" in message["id"] else "stock"
        out[which].setdefault(message["args"][0], message)
    return out


def worker_cmd() -> list[str]:
    return python_command(
        "-m", "celery", "-A", APP, "worker", "--pool=solo", "-Q", "celery,reports",
        "--purge", "-l", "INFO", "-n", "dropin@%h",
    )  # fmt: skip


@contextlib.contextmanager
def started_worker(tmp_path: Path, env: dict[str, str]) -> Iterator[ManagedProcess]:
    """A worker that has purged its queues and is consuming (so no beat message is purged)."""
    with running_process(
        worker_cmd(), log_path=tmp_path / "worker.log", env=env | {"E2E_ROLE": "worker"}
    ) as worker:
        wait_for(lambda: " ready." in worker.read_log(), timeout=60, processes=[worker])
        yield worker


def beat_cmd(scheduler: str, schedule_file: Path) -> list[str]:
    return python_command(
        "-m", "celery", "-A", APP, "beat", "-S", scheduler, "-l", "INFO",
        "--schedule", str(schedule_file),
    )  # fmt: skip


def comparable(message: dict[str, Any]) -> dict[str, Any]:
    """What stock beat and the durable scheduler must send alike.

    Left out: the task id (random vs. run ID), durable_* headers, and a relative ``expires``
    (a number of seconds from each send; whether it is set is kept).
    """
    out = dict(message)
    out.pop("id")
    out["headers"] = {
        k: v for k, v in (message["headers"] or {}).items() if not k.startswith("durable_")
    }
    if message["args"][0] != "expires-at":
        out["expires"] = message["expires"] is not None
    return out


def test_a_real_beat_schedule_runs_under_durable_as_under_stock_beat(
    tmp_path: Path, broker_url: str, redis_url: str, sink: redis.Redis
) -> None:
    journal = f"sqlite:///{tmp_path / 'journal.db'}"
    env = {"E2E_BROKER": broker_url, "E2E_SINK": redis_url, "CELERY_DURABLE_URL": journal}
    with (
        started_worker(tmp_path, env) as worker,
        running_process(
            beat_cmd("celery.beat:PersistentScheduler", tmp_path / "stock-schedule"),
            log_path=tmp_path / "stock.log",
            env=env,
        ) as stock,
        running_process(
            beat_cmd("durable", tmp_path / "unused"),
            log_path=tmp_path / "durable.log",
            env=env,
        ) as durable_beat,
    ):

        def all_seen() -> bool:
            seen = by_scheduler(received(sink))
            return all(sorted(seen[k]) == SENT for k in seen)

        processes = [worker, stock, durable_beat]
        with contextlib.suppress(TimeoutError):  # what is missing is asserted below
            wait_for(all_seen, timeout=100, interval=0.5, processes=processes)
        log = durable_beat.read_log()
    seen = by_scheduler(received(sink))
    assert sorted(seen["stock"]) == SENT
    assert sorted(seen["durable"]) == SENT, log
    for name in SENT:
        assert comparable(seen["durable"][name]) == comparable(seen["stock"][name]), name
        sid, _due = parse_run_id(seen["durable"][name]["id"])
        assert sid == schedule_id_for_name(name)
        assert seen["durable"][name]["headers"]["celery_beat_task"] is True
    assert "ERROR" not in log
    assert "'proj.worker_only' is not registered in the beat process" in log
    client = reader(journal)
    try:
        solar_view = client.schedules.state("solar")
        assert solar_view is not None and not solar_view.paused
    finally:
        client.close()


def test_a_removed_entry_is_paused_across_restarts_and_resumes_when_put_back(
    tmp_path: Path, redis_url: str, sink: redis.Redis
) -> None:
    journal = f"sqlite:///{tmp_path / 'journal.db'}"
    env = {"E2E_BROKER": redis_url, "E2E_SINK": redis_url, "CELERY_DURABLE_URL": journal}
    durable_cmd = beat_cmd("durable", tmp_path / "unused")

    def count(name: str) -> int:
        return sum(1 for m in received(sink) if m["args"][:1] == [name] and "@" in m["id"])

    with started_worker(tmp_path, env) as worker:
        with running_process(durable_cmd, log_path=tmp_path / "one.log", env=env) as beat:
            wait_for(lambda: count("headers") >= 1, timeout=30, processes=[worker, beat])
        with running_process(
            durable_cmd, log_path=tmp_path / "two.log", env=env | {"E2E_DROP": "headers"}
        ) as beat:
            wait_for(lambda: count("interval") >= 3, timeout=30, processes=[worker, beat])
            before = count("headers")
            wait_for(lambda: count("interval") >= 5, timeout=30, processes=[worker, beat])
            assert count("headers") == before
            assert f"paused: {REMOVED}" in beat.read_log()
        client = reader(journal)
        try:
            view = client.schedules.state("headers")
            assert view is not None and view.paused
            pauses = [
                e for e in client.schedules.store.events("headers") if isinstance(e, SchedulePaused)
            ]
            assert [p.reason for p in pauses] == [REMOVED]
            client.schedules.create("runtime", "proj.work", None, Every(timedelta(seconds=1)))
        finally:
            client.close()
        with running_process(durable_cmd, log_path=tmp_path / "three.log", env=env) as beat:
            wait_for(lambda: count("headers") >= before + 2, timeout=30, processes=[worker, beat])
            assert "resumed" in beat.read_log()
            runtime_runs = [m for m in received(sink) if m["id"].startswith("runtime@")]
            assert runtime_runs, "a schedule created at run time must keep running"
    client = reader(journal)
    try:
        runtime = client.schedules.state("runtime")
        assert runtime is not None and not runtime.paused  # created at run time: untouched
    finally:
        client.close()


def reader(journal: str) -> Durable:
    """The journal as another process of the project sees it (an API client)."""
    app = Celery("reader", set_as_current=False)

    @app.task(name="proj.work", shared=False)
    def work(*args: Any, **kwargs: Any) -> None:  # pragma: no cover - never called here
        return None

    return Durable(app, journal)
