"""Child runs on real ``celery worker`` processes (W10, W11): a fan-out survives kill -9.

The app is ``tests/support/children_app.py``. Two workers: a solo one that takes the parents,
a prefork one (two processes) that takes the children. The matrix is {Redis, RabbitMQ} ×
{PostgreSQL, SQLite}; two of its cases run a dispatcher in the test process (as beat would:
D8), the two others none at all, so that the fan-out recovers by the brokers' redelivery alone.

In each case ``map_children`` over 200 inputs with ``at_most=20``:

* the parent's worker dies at the fault point between committing a batch of children's starts
  and sending them (``CELERY_DURABLE_TEST_CRASH=after-child-start@3``: the third batch); the
  test checks that it died there (the batch is stored, its children never claimed);
* the children's worker is killed with SIGKILL while it runs the step of input 120 (gated);
* every child's step counts its executions in a file outside the journal and the broker.

Then: each child's step ran once, or twice if it was in flight in the killed worker (W2); no
run ID started twice; the results are in input order and equal a Celery ``chord``'s; the
parent finished with O(1) journal events per child.

Without beat, only what the broker redelivers comes back. kombu's Redis transport takes a
message off the list (``BRPOP``) before it records it as unacknowledged: a worker killed in
between loses it, and only the dispatcher sends it again (D8). So the Redis case without a
dispatcher stops the children's worker taking messages before it kills it.

A second test kills a child's worker between storing the child's end and waking its parent
(``after-child-end``), with no dispatcher: the broker's redelivery of the child wakes it.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, chord

from celery_durable import Durable
from celery_durable.core.ids import run_stream
from celery_durable.runtime import CRASH_VARIABLE
from tests.support.children_app import counted, pids_of
from tests.support.processes import ManagedProcess, python_command, running_process, wait_for

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

N = 200
AT_MOST = 20
GATED = 120
CRASH = "after-child-start@3"
BRPOP_TIMEOUT = 1.0
"""How long kombu's Redis transport blocks in one ``BRPOP`` (its default ``polling_interval``)."""


class World:
    def __init__(self, tmp_path: Path, broker: str, backend: str, journal: str) -> None:
        self.tmp = tmp_path
        self.counts = tmp_path / "counts.txt"
        self.gate = tmp_path / "gate"
        prefix = f"e2e-{uuid.uuid4().hex[:8]}-"
        self.queues = (f"{prefix}parents", f"{prefix}kids")
        self.env = {
            "E2E_BROKER": broker,
            "E2E_BACKEND": backend,
            "E2E_JOURNAL": journal,
            "E2E_COUNTS": str(self.counts),
            "E2E_GATE": str(self.gate),
            "E2E_GATED": str(GATED),
            "E2E_QUEUE": prefix,
            "E2E_LEASE": "10",
            "E2E_VISIBILITY": "4",
        }
        self.app = Celery(f"client-{uuid.uuid4().hex[:6]}", broker=broker, backend=backend)
        parents, kids = self.queues
        self.app.conf.task_routes = {
            "kids.fan_out": {"queue": parents},
            "kids.one_child": {"queue": parents},
            "kids.*": {"queue": kids},
        }
        self.app.conf.durable_run_lease = 10.0
        # The dispatcher re-sends only runs of tasks its app knows (D4), as beat with the
        # project's app would: names for the durable tasks the workers run.
        for name in ("kids.square", "kids.fan_out"):
            self.app.task(name=name, shared=False)(_never_here)
        self.durable = Durable(self.app, journal)
        self.started = 0
        self.nodes: dict[int, str] = {}

    @contextmanager
    def worker(self, pool: str, queue: str, **env: str) -> Iterator[ManagedProcess]:
        self.started += 1
        name = f"w{self.started}"
        concurrency = "2" if pool == "prefork" else "1"
        cmd = python_command(
            "-m", "celery", "-A", "tests.support.children_app", "worker", f"--pool={pool}",
            f"--concurrency={concurrency}", "-Q", queue, "-n", f"{name}@%h",
            "--without-heartbeat", "--without-mingle", "--without-gossip", "--loglevel=INFO",
        )  # fmt: skip
        log = self.tmp / f"{name}.log"
        with running_process(cmd, log_path=log, env={**self.env, **env}) as proc:
            wait_for(lambda: "ready" in proc.read_log(), timeout=60, processes=[proc])
            self.nodes[proc.pid] = f"{name}@{socket.gethostname()}"
            yield proc

    def stop_consuming(self, worker: ManagedProcess, queue: str) -> None:
        """Make ``worker`` take no more messages from ``queue`` (Celery's ``cancel_consumer``),
        and wait until the last ``BRPOP`` it had sent to Redis has returned.

        kombu's Redis transport takes a message off its list with ``BRPOP`` and only then
        records it as unacknowledged: a worker killed between the two loses that message
        (the broker has no copy), which only the dispatcher sends again (D8). A fan-out
        without beat survives what the broker redelivers; this is how such a test kills a
        worker without a message on that way."""
        node = self.nodes[worker.pid]

        def cancelled() -> bool:  # (asked again if the reply is slow: cancelling is idempotent)
            replies = self.app.control.cancel_consumer(
                queue, destination=[node], reply=True, timeout=5
            )
            return any(node in reply for reply in replies or [])

        wait_for(cancelled, timeout=30, interval=0, processes=[worker])
        time.sleep(BRPOP_TIMEOUT + 1)  # a BRPOP sent before the cancel has returned by then

    def executions(self, what: str = "start") -> Counter[int]:
        return counted(self.counts, what)

    @contextmanager
    def dispatching(self, on: bool) -> Iterator[None]:
        """A dispatcher ticking in this process, as beat would (D8), or none at all."""
        if not on:
            yield
            return
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

    def row(self, run_id: str) -> dict[str, Any]:
        """The run's row in the run table (empty when it has none)."""
        return self.durable.runs.rows([run_id]).get(run_id, {})

    def events(self, run_id: str) -> list[tuple[str, dict[str, Any]]]:
        return [(e.type, e.data) for e in self.durable.journal.read_stream(run_stream(run_id))]

    def diagnosis(self, rid: str) -> str:
        """What a fan-out that did not finish left: the parent's last events and row, each
        unfinished child's row, events and log lines, and what the broker still holds."""
        children = self.durable.children(rid)
        lines = [
            f"parent's last events: {self.events(rid)[-12:]}",
            f"parent's row: {self.durable.runs.rows([rid]).get(rid)}",
            f"children: {Counter(s for _, s in children)}",
        ]
        stuck = [r for r, s in children if s != "finished"]
        rows = self.durable.runs.rows(stuck)
        logs = {p.name: p.read_text(errors="replace") for p in sorted(self.tmp.glob("w*.log"))}
        for child in stuck[:5]:
            lines += [f"child {child}: row {rows.get(child)}", f"  events {self.events(child)}"]
            for name, text in logs.items():
                lines += [f"  {name}: {line}" for line in text.splitlines() if child in line]
        lines.append(f"broker: {self.broker_holds(stuck)}")
        return "\n".join(lines)

    def broker_holds(self, run_ids: list[str]) -> str:
        """The length of each queue and, on Redis, which of ``run_ids`` the queues and the
        unacknowledged messages hold."""
        found: dict[str, Any] = {}
        try:
            with self.app.connection_for_write() as conn:
                channel = conn.default_channel
                client = getattr(channel, "client", None)
                for q in self.queues:
                    if client is None:
                        found[q] = channel.queue_declare(q, passive=True).message_count
                    else:  # (Redis: an empty queue has no key, passive declare fails)
                        ids = [json.loads(m)["headers"].get("id") for m in client.lrange(q, 0, -1)]
                        found[q] = (len(ids), [i for i in ids if i in run_ids])
                if client is not None:
                    unacked = [
                        json.loads(raw)[0]["headers"].get("id")
                        for raw in client.hvals(channel.unacked_key)
                    ]
                    found["unacked"] = (len(unacked), [i for i in unacked if i in run_ids])
        except Exception as exc:  # (a diagnosis must not hide the failure)
            found["error"] = f"{type(exc).__name__}: {exc}"
        return str(found)

    def close(self) -> None:
        try:
            with self.app.connection_for_write() as conn:
                channel = conn.default_channel
                for queue in self.queues:
                    channel.queue_delete(queue)
        except Exception:
            pass
        self.durable.close()


def _never_here(*args: object, **kwargs: object) -> None:  # pragma: no cover - only sent
    raise AssertionError("run by the workers, never in the test process")


def last_batch(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The children started by the parent's last write (its last run of ChildStarted)."""
    batch: list[str] = []
    for kind, data in events:
        if kind == "ChildStarted":
            batch.append(data["child"])
        elif kind not in ("RunClaimed", "SignalReceived", "RunCancelRequested"):
            batch = []
    return batch


CASES = [
    pytest.param("redis", "postgres", True, id="redis-postgres-dispatcher"),
    pytest.param("redis", "sqlite", False, id="redis-sqlite-no-beat"),
    pytest.param("amqp", "postgres", False, id="rabbitmq-postgres-no-beat"),
    pytest.param("amqp", "sqlite", True, id="rabbitmq-sqlite-dispatcher"),
]


@pytest.mark.parametrize(("broker", "journal", "dispatcher"), CASES)
def test_map_children_of_200_survives_kill_9_of_the_parents_and_a_childs_worker(
    tmp_path: Path,
    redis_url: str,
    broker: str,
    journal: str,
    dispatcher: bool,
    request: pytest.FixtureRequest,
) -> None:
    broker_url = redis_url if broker == "redis" else request.getfixturevalue("amqp_url")
    journal_url = request.getfixturevalue({"postgres": "pg_url", "sqlite": "sqlite_url"}[journal])
    world = World(tmp_path, broker_url, redis_url, journal_url)
    parents, kids = world.queues
    rid = f"fan-{uuid.uuid4().hex[:8]}"
    try:
        with world.dispatching(dispatcher), world.worker("prefork", kids) as children:
            with world.worker("solo", parents, **{CRASH_VARIABLE: CRASH}) as doomed:
                world.app.send_task("kids.fan_out", args=[N, AT_MOST], task_id=rid)
                # The parent's worker dies by itself at the fault point, on its third batch.
                code = wait_for(
                    lambda: doomed.returncode, timeout=90, processes=[children],
                    message="the parent's worker to die at the fault point",
                )  # fmt: skip
                assert code == -signal.SIGKILL, doomed.log_tail()
                lost = last_batch(world.events(rid))
                started = sum(1 for kind, _ in world.events(rid) if kind == "ChildStarted")
                assert lost and started > AT_MOST, "it died after a later batch's commit"
                rows = world.durable.runs.rows(lost)
                assert {rows[r]["status"] for r in lost} == {"queued"}, "and before its send"
            with world.worker("solo", parents) as parent_worker:
                wait_for(
                    lambda: world.executions()[GATED] >= 1, timeout=120,
                    processes=[parent_worker, children],
                )  # fmt: skip
                owner = pids_of(world.counts, GATED)[0]
                assert owner != children.pid, "a prefork pool process runs the step"
                if broker == "redis" and not dispatcher:
                    # Without beat, nothing sends again a message that a killed Redis worker
                    # had taken off the list and not yet recorded (D8 does, with beat): the
                    # cases with a dispatcher kill it while it takes messages.
                    world.stop_consuming(children, kids)
                children.kill()  # the children's worker, in the middle of the gated step
                world.gate.touch()
                with world.worker("prefork", kids):
                    try:
                        result = world.durable.result(rid, 120)
                    except TimeoutError:
                        raise AssertionError(world.diagnosis(rid)) from None
                    oracle = chord(
                        world.app.signature("kids.plain_square", (x,)) for x in range(N)
                    )(world.app.signature("kids.collect")).get(timeout=60)
        assert result == [x * x for x in range(N)]
        assert result == oracle
        ran = world.executions()
        assert sorted(ran) == list(range(N))
        assert sorted(world.executions("end")) == list(range(N))
        # W2: a step runs again only when its worker died before its result was stored: the
        # gated one, and at most one more (the killed prefork worker has two processes).
        assert ran[GATED] == 2, ran[GATED]
        assert all(1 <= count <= 2 for count in ran.values()), ran
        assert sum(count - 1 for count in ran.values()) <= 2, ran
        # No run ID twice: one start per child in the parent's journal, one RunStarted each.
        parent = world.events(rid)
        starts = Counter(d["index"] for t, d in parent if t == "ChildStarted")
        assert sorted(starts) == list(range(N)) and set(starts.values()) == {1}
        for i in range(N):
            child = world.events(f"{rid}:0.{i}")
            assert [t for t, _ in child].count("RunStarted") == 1
            assert child[0][1]["parent"] == rid
        # O(1) parent events per child.
        assert len(parent) <= 8 * N, Counter(t for t, _ in parent)
        # A child's result is its journal's: the result backend holds none (the chord's
        # members' results are there, the parent's too).
        backend = world.app.backend
        assert all(backend.get(backend.get_key_for_task(f"{rid}:0.{i}")) is None
                   for i in range(N))  # fmt: skip
        assert backend.get(backend.get_key_for_task(rid)) is not None
    finally:
        world.close()


WOKEN_CASES = [
    pytest.param("redis", "sqlite", id="redis-sqlite"),
    pytest.param("amqp", "postgres", id="rabbitmq-postgres"),
]


@pytest.mark.parametrize(("broker", "journal"), WOKEN_CASES)
def test_a_childs_worker_killed_between_its_end_and_the_wake_up_leaves_no_parent_waiting(
    tmp_path: Path, redis_url: str, broker: str, journal: str, request: pytest.FixtureRequest
) -> None:
    """W10 without beat: the child's worker dies after storing the child's end, which marked
    the suspended parent woken, and before sending the parent's message. Other children's ends
    would not send it for 30 s (the mark); the broker redelivers the child's message (it was
    never acknowledged), and that delivery, finding the child ended, wakes the parent."""
    broker_url = redis_url if broker == "redis" else request.getfixturevalue("amqp_url")
    journal_url = request.getfixturevalue({"postgres": "pg_url", "sqlite": "sqlite_url"}[journal])
    world = World(tmp_path, broker_url, redis_url, journal_url)
    parents, kids = world.queues
    rid = f"one-{uuid.uuid4().hex[:8]}"
    child = f"{rid}:0"
    try:
        with world.worker("solo", parents):
            world.app.send_task("kids.one_child", args=[7], task_id=rid)
            # The parent has started its child and waits for it: no worker takes children yet.
            wait_for(lambda: world.row(rid).get("status") == "suspended", timeout=30)
            with world.worker("solo", kids, **{CRASH_VARIABLE: "after-child-end@1"}) as doomed:
                code = wait_for(lambda: doomed.returncode, timeout=30)
                assert code == -signal.SIGKILL, doomed.log_tail()
            assert world.row(child)["status"] == "finished", "it died after the child's end"
            parent = world.row(rid)
            assert parent["status"] == "suspended", parent
            assert parent["lease_until"] is not None, "the end marked the parent woken"
            with world.worker("solo", kids):
                try:
                    result = world.durable.result(rid, 30)
                except TimeoutError:
                    raise AssertionError(world.diagnosis(rid)) from None
        assert result == 49
        assert world.executions() == Counter({7: 1})  # the child's step ran once (W2)
        assert [t for t, _ in world.events(child)].count("RunFinished") == 1
    finally:
        world.close()
