"""Child runs on real ``celery worker`` processes (W10, W11): a fan-out survives kill -9.

The app is ``tests/support/children_app.py``. Two workers: a solo one that takes parents and
children, a prefork one that takes children. Each is killed with SIGKILL while the fan-out is
going and started again. A dispatcher ticks in the test process, as beat would (D8). Every
child's step counts its executions in Redis, outside the journal. A Celery ``chord`` of the
same fan-out on the same workers is the oracle for the results.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from celery import Celery, chord

from celery_durable import Durable
from celery_durable.core.ids import run_stream
from tests.support.processes import ManagedProcess, python_command, running_process, wait_for

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

N = 200
AT_MOST = 20


class World:
    def __init__(self, tmp_path: Path, broker: str, journal: str) -> None:
        self.tmp = tmp_path
        self.env = {
            "E2E_BROKER": broker,
            "E2E_JOURNAL": journal,
            "E2E_LEASE": "10",
            "E2E_VISIBILITY": "4",
        }
        self.app = Celery(f"client-{uuid.uuid4().hex[:6]}", broker=broker, backend=broker)
        self.app.conf.task_routes = {
            "kids.fan_out": {"queue": "parents"},
            "kids.*": {"queue": "kids"},
        }
        self.app.conf.durable_run_lease = 10.0
        # The dispatcher re-sends only runs of tasks its app knows (D4), as beat with the
        # project's app would: names for the durable tasks the workers run.
        for name in ("kids.square", "kids.fan_out"):
            self.app.task(name=name, shared=False)(_never_here)
        self.durable = Durable(self.app, journal)
        self.redis = redis.Redis.from_url(broker)
        self.started = 0

    @contextmanager
    def worker(self, pool: str, queues: str) -> Iterator[ManagedProcess]:
        self.started += 1
        name = f"w{self.started}"
        concurrency = "2" if pool == "prefork" else "1"
        cmd = python_command(
            "-m", "celery", "-A", "tests.support.children_app", "worker", f"--pool={pool}",
            f"--concurrency={concurrency}", "-Q", queues, "-n", f"{name}@%h",
            "--without-heartbeat", "--without-mingle", "--without-gossip", "--loglevel=INFO",
        )  # fmt: skip
        with running_process(cmd, log_path=self.tmp / f"{name}.log", env=self.env) as proc:
            wait_for(lambda: "ready" in proc.read_log(), timeout=60, processes=[proc])
            yield proc

    def executions(self) -> Counter[int]:
        found: Counter[int] = Counter()
        for key in self.redis.scan_iter("kids:*"):
            found[int(key.decode().split(":")[1])] = int(self.redis.get(key) or 0)
        return found

    @contextmanager
    def dispatching(self) -> Iterator[None]:
        """A dispatcher ticking in this process, as beat would: it re-sends stalled runs."""
        stop = threading.Event()
        dispatcher = self.durable.dispatcher()

        def loop() -> None:
            while not stop.is_set():
                dispatcher.resender.check_soon()
                dispatcher.tick()
                stop.wait(0.5)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(10)
            dispatcher.close()


def _never_here(*args: object, **kwargs: object) -> None:  # pragma: no cover - only sent
    raise AssertionError("run by the workers, never in the test process")


def events(durable: Durable, run_id: str) -> list[tuple[str, dict]]:
    return [(e.type, e.data) for e in durable.journal.read_stream(run_stream(run_id))]


def test_map_children_of_200_survives_kill_9_of_the_parents_and_a_childs_worker(
    tmp_path: Path, redis_url: str, pg_url: str
) -> None:
    world = World(tmp_path, redis_url, pg_url)
    rid = f"fan-{uuid.uuid4().hex[:8]}"
    with world.dispatching(), world.worker("prefork", "kids") as kids:
        with world.worker("solo", "parents,kids") as parents:
            world.app.send_task("kids.fan_out", args=[N, AT_MOST], task_id=rid)
            wait_for(
                lambda: sum(world.executions().values()) >= 40, timeout=60,
                processes=[parents, kids],
            )  # fmt: skip
            parents.kill()  # the parent's worker, in the middle of the fan-out
        with world.worker("solo", "parents,kids") as parents:
            wait_for(
                lambda: sum(world.executions().values()) >= 120, timeout=60,
                processes=[parents, kids],
            )  # fmt: skip
            kids.kill()  # a child's worker (the prefork pool with it)
            with world.worker("prefork", "kids"):
                try:
                    result = world.durable.result(rid, 60)
                except TimeoutError:
                    tail = events(world.durable, rid)[-12:]
                    rows = world.durable.runs.rows([rid])
                    states = Counter(s for _, s in world.durable.children(rid))
                    raise AssertionError(f"{tail}\n{rows}\n{states}") from None
                oracle = chord(world.app.signature("kids.plain_square", (x,)) for x in range(N))(
                    world.app.signature("kids.collect")
                ).get(timeout=60)
    assert result == [x * x for x in range(N)]
    assert result == oracle
    ran = world.executions()
    assert sorted(ran) == list(range(N))
    # W2: a step runs again only when its worker died before its result was stored: at most
    # one per slot of the killed workers (1 solo + 2 prefork).
    assert all(1 <= count <= 2 for count in ran.values()), ran
    assert sum(count - 1 for count in ran.values()) <= 3, ran
    # No run ID twice: one start per child in the parent's journal, one RunStarted per child.
    parent = events(world.durable, rid)
    starts = Counter(d["index"] for t, d in parent if t == "ChildStarted")
    assert sorted(starts) == list(range(N)) and set(starts.values()) == {1}
    for i in range(N):
        child = events(world.durable, f"{rid}:0.{i}")
        assert [t for t, _ in child].count("RunStarted") == 1
        assert child[0][1]["parent"] == rid
    # O(1) parent events per child.
    assert len(parent) <= 8 * N, Counter(t for t, _ in parent)
    world.durable.close()
