"""Parallel branches (W9) on real ``celery worker`` processes, on Redis and on RabbitMQ, with a
PostgreSQL journal.

The worker is killed with SIGKILL inside one branch; the redelivered run replays the other
branches' stored steps and runs again only the step that was in flight (W2), counted in an
external store the test owns.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_durable.core.ids import run_stream
from celery_durable.core.outcomes import Finished
from celery_durable.core.run_aggregate import fold
from tests.e2e.test_durable_worker_e2e import World
from tests.support.durable_apps import calls
from tests.support.processes import wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


@pytest.fixture(params=["redis", "rabbitmq"])
def world(
    request: pytest.FixtureRequest, tmp_path: Path, redis_url: str, pg_url: str
) -> Iterator[World]:
    broker = redis_url if request.param == "redis" else request.getfixturevalue("amqp_url")
    queue = f"branches-{uuid.uuid4().hex[:8]}"  # the test's own (the vhost is shared)
    made = World(tmp_path, broker, pg_url, E2E_VISIBILITY="3", E2E_QUEUE=queue)
    made.app.conf.task_default_queue = queue
    made.include = ("tests.support.branch_apps",)
    yield made
    if request.param == "rabbitmq":
        with made.app.connection_for_write() as conn, contextlib.suppress(Exception):
            conn.default_channel.queue_delete(queue)
    made.close()


def test_kill_inside_a_branch_reruns_only_its_step(world: World) -> None:
    def stored() -> set[Any]:
        state = fold(world.durable.journal.read_stream(run_stream(rid)))
        return {p for p, r in state.positions.items() if r.status == "completed"}

    with world.worker() as first:
        rid = world.send("e2e.branches")
        done = {"0.0.0", "0.0.1", "0.1.0", "0.2.0", "0.2.1"}
        wait_for(lambda: done <= stored() and world.count("leg1.1") == 1, timeout=30,
                 processes=[first])  # fmt: skip
        first.kill()
    world.gate.touch()
    with world.worker():
        outcome = world.durable.outcome(rid, 40)
    assert outcome == Finished([[f"0.{b}.0", f"0.{b}.1"] for b in range(3)])
    counts = {f"leg{b}.{s}": world.count(f"leg{b}.{s}") for b in range(3) for s in range(2)}
    assert counts == {**dict.fromkeys(counts, 1), "leg1.1": 2}
    assert {row[1] for row in calls(world.calls, "leg1.1")} == {f"e2e.branches/{rid}/0.1.1"}
    state = fold(world.durable.journal.read_stream(run_stream(rid)))
    assert (state.positions[0].kind, state.positions[0].branches) == ("parallel", 3)
