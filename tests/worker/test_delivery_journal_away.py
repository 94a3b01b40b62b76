"""A durable task delivered while its worker cannot use the journal is never lost (W1).

Real workers (``start_worker``, in-process), real brokers (Redis and RabbitMQ), a real
PostgreSQL journal behind a TCP proxy that is closed when the message arrives: the worker
cannot even open the journal. The message must stay on the broker (sent again with a growing
countdown, docs/durable-tasks.md "When the journal is away") until the journal is back, and the
run must then complete exactly once.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
import sqlalchemy as sa
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.signals import task_failure, task_prerun

from celery_durable import Durable, Finished
from celery_durable.core.ids import run_stream
from celery_durable.core.run_aggregate import RUN_STARTED
from celery_durable.store.journal import SqlJournal, schema
from tests.support.processes import wait_for
from tests.support.tcpproxy import TcpProxy

pytestmark = [pytest.mark.timeout(120)]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def task_log() -> Iterator[_Records]:
    handler = _Records()
    logger = logging.getLogger("celery_durable.tasks")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # the worker sets the root logger to ERROR
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _behind(url: str, proxy: TcpProxy) -> str:
    parts = urlsplit(url)
    return url.replace(f"{parts.hostname}:{parts.port}", f"127.0.0.1:{proxy.port}", 1)


def _on_broker(app: Celery, broker: str, broker_url: str, queue: str) -> list[str]:
    """Task ids of the messages the broker holds for ``queue`` (ready or unacknowledged),
    without consuming them."""
    if broker == "redis":
        client = redis.Redis.from_url(broker_url)
        try:
            raw = client.lrange(queue, 0, -1) + [
                json.dumps(json.loads(v)[0]).encode() for v in client.hvals("unacked")
            ]
        finally:
            client.close()
        return [json.loads(item)["headers"]["id"] for item in raw]
    ids = []
    with app.connection_for_read() as conn:
        bound = app.amqp.queues[queue].bind(conn.default_channel)
        while (message := bound.get(no_ack=False)) is not None:
            ids.append(message.headers["id"])
        # Closing without acknowledging puts every message back.
    return ids


def _lost_or_kept(
    app: Celery,
    job: Any,
    durable: Durable,
    on_broker: Callable[[], list[str]],
    task_log: _Records,
    repair: Callable[[], None],
) -> str:
    """Deliver ``job("x")`` while the journal cannot be used, stop the worker, check the
    message is still on the broker, ``repair()`` the journal, start a worker again and check
    the run completes exactly once. Returns the first log line about the delivery."""
    rid = f"away-{uuid.uuid4().hex[:8]}"
    deliveries: list[str] = []
    failures: list[BaseException] = []

    def on_prerun(task_id: str, **_: Any) -> None:
        if task_id == rid:
            deliveries.append(task_id)

    def on_failure(task_id: str, exception: BaseException, **_: Any) -> None:
        if task_id == rid:
            failures.append(exception)

    task_prerun.connect(on_prerun, weak=False)
    task_failure.connect(on_failure, weak=False)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
            job.apply_async(("x",), task_id=rid)
            # Delivered, then (1 s later) delivered again -- or failed and acknowledged.
            wait_for(lambda: len(deliveries) >= 2 or failures, timeout=60)
        # The worker has gone; the journal is still unusable: the message waits on the broker.
        assert rid in on_broker(), f"message lost; the delivery failed with {failures!r}"
        assert failures == []
        repair()
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
            assert durable.outcome(rid, timeout=60) == Finished("did x")
        stream = durable.journal.read_stream(run_stream(rid))
        assert [e.type for e in stream].count(RUN_STARTED) == 1
        assert rid not in on_broker()
        assert failures == []
    finally:
        task_prerun.disconnect(on_prerun)
        task_failure.disconnect(on_failure)
    return next(m for m in task_log.messages if rid in m)


def _app(broker_url: str, queue: str) -> Celery:
    app = Celery(f"away-{queue}", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_ignore_result=True,
        task_default_queue=queue,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
    )
    return app


@pytest.mark.parametrize("broker", ["redis", "amqp"])
def test_w1_a_delivery_that_cannot_open_the_journal_is_sent_again_not_lost(
    broker: str, request: pytest.FixtureRequest, pg_url: str, task_log: _Records
) -> None:
    broker_url = str(request.getfixturevalue(f"{broker}_url"))
    parts = urlsplit(pg_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)  # closed for now
    queue = f"away-{uuid.uuid4().hex[:8]}"
    app = _app(broker_url, queue)
    durable = Durable(app, _behind(pg_url, proxy))
    calls: list[str] = []

    @durable.task(name="away.job", shared=False)
    def job(what: str) -> str:
        calls.append(what)
        return f"did {what}"

    try:
        line = _lost_or_kept(
            app, job, durable, lambda: _on_broker(app, broker, broker_url, queue), task_log,
            proxy.restore,
        )  # fmt: skip
        assert calls == ["x"]
        assert "cannot open the journal" in line and "sent again in 1 s (attempt 1)" in line
        assert "\n" not in line
    finally:
        proxy.cut()
        durable.close()


def test_w1_a_delivery_meeting_any_journal_error_before_its_claim_is_sent_again(
    redis_url: str, sqlite_url: str, task_log: _Records
) -> None:
    """Not only outages: a journal written by a newer release (a half-done deploy) too."""
    queue = f"away-{uuid.uuid4().hex[:8]}"
    app = _app(redis_url, queue)
    durable = Durable(app, sqlite_url)
    calls: list[str] = []

    @durable.task(name="away.job", shared=False)
    def job(what: str) -> str:
        calls.append(what)
        return f"did {what}"

    def set_version(version: int) -> None:
        engine = sa.create_engine(sqlite_url)
        with engine.begin() as conn:
            conn.execute(sa.update(schema.schema_versions).values(version=version))
        engine.dispose()

    SqlJournal(sqlite_url).ensure_ready()
    set_version(999)
    try:
        line = _lost_or_kept(
            app, job, durable, lambda: _on_broker(app, "redis", redis_url, queue), task_log,
            lambda: set_version(schema.SCHEMA_VERSIONS["journal"]),
        )  # fmt: skip
        assert calls == ["x"]
        assert "upgrade celery_durable" in line and "sent again" in line
    finally:
        durable.close()
