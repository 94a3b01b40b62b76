"""The publish fast path (D12): the message Celery's own ``apply_async`` builds, and D3.

The oracle is Celery itself: each case publishes one run through the dispatcher's publisher
(its second run of the shape, so the template path is the one measured) and the same run
through ``Task.apply_async``, reads both back from the real broker (Redis and RabbitMQ) and
compares them field by field. The only field left out is Redis' ``delivery_tag``, a fresh
UUID kombu gives every message; on RabbitMQ nothing is left out but the broker's own
delivery counter. A broker cut (a TCP proxy) shows that a failed fast send leaves the runs
for the retry (D3) and that they go once it returns.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

import pytest
from celery import Celery, Task
from celery.utils.saferepr import saferepr
from hypothesis import given
from hypothesis import strategies as st
from kombu import Exchange, Queue

from celery_durable.core.codec import encode_celery_value
from celery_durable.core.ids import run_id
from celery_durable.core.schedule_aggregate import PendingRun
from celery_durable.dispatch.publisher import Publisher
from celery_durable.fast_publish import FastPath, send_full, shown
from celery_durable.message import BEAT_ENTRY, run_message
from tests.support.tcpproxy import TcpProxy

UTC = timezone.utc
DUE = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
NOW = DUE + timedelta(seconds=1)
#: An expiry still ahead of the real clock (RabbitMQ drops a message whose TTL is over).
LATER = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
TYPED = [
    datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    Decimal("1.50"),
    uuid.UUID(int=7),
    (1, [2, {"x": (3,)}]),
]

#: (case name, schedule options, PendingRun fields): every B5 option the fast path takes,
#: and the ones it hands to the full path (they must come out the same too).
CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("plain", {}, {}),
    ("input", {}, {"input": {"customer": "ada", "n": [1, 2]}}),
    ("queue", {"queue": "@q"}, {}),
    ("routing", {"exchange": "@x", "routing_key": "@k"}, {}),
    ("priority", {"priority": 7}, {}),
    ("time limits", {"time_limit": 30, "soft_time_limit": 20}, {}),
    ("expires seconds", {"expires": 90}, {}),
    ("deadline", {}, {"deadline": DUE + timedelta(minutes=5)}),
    ("deadline and expires", {"expires": 60}, {"deadline": DUE + timedelta(minutes=5)}),
    ("track end", {}, {"track_end": True}),
    ("jitter", {}, {"send_at": DUE + timedelta(seconds=3)}),
    ("headers", {"headers": {"tenant": "t1", "n": 2}}, {}),
    (
        "beat entry, typed args",
        {
            BEAT_ENTRY: "e",
            "args": encode_celery_value(TYPED, "args"),
            "kwargs": encode_celery_value({"when": TYPED[0], "amount": TYPED[1]}, "kwargs"),
        },
        {},
    ),
    (
        "beat entry, all options",
        {
            BEAT_ENTRY: "e",
            "args": [1],
            "queue": "@q",
            "priority": 3,
            "serializer": "json",
            "ignore_result": True,
            "time_limit": 10,
            "soft_time_limit": 5,
            "headers": {"h": 1},
        },
        {},
    ),
    (
        "beat entry, expires datetime",
        {BEAT_ENTRY: "e", "expires": encode_celery_value(LATER, "o")},
        {},
    ),
]


def make_app(broker: str, queue: str) -> Celery:
    app = Celery(f"fast-{queue}", broker=broker, set_as_current=False)
    app.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=False)

    @app.task(name="fast.plain", shared=False)
    def plain(*args: Any, **kwargs: Any) -> None:
        return None

    return app


def named(value: Any, suffix: str) -> Any:
    """Options naming a queue, exchange or key get this test's own names (RabbitMQ is shared)."""
    if isinstance(value, str) and value.startswith("@"):
        return value[1:] + suffix
    return value


def fetch(app: Celery, queue: str) -> dict[str, Any]:
    """The next message of ``queue``, every field the consumer sees."""
    with app.connection_for_read() as conn:
        channel = conn.default_channel
        for _attempt in range(100):  # RabbitMQ routes a publish asynchronously
            message = channel.basic_get(queue, no_ack=True)
            if message is not None:
                break
            time.sleep(0.02)
        assert message is not None, f"no message on {queue}"
        if not hasattr(message, "decode"):  # py-amqp hands its own message class
            message = channel.message_to_python(message)
        properties = dict(message.properties)
        properties.pop("delivery_tag", None)  # Redis: a fresh UUID per message
        info = dict(message.delivery_info)
        info.pop("delivery_tag", None)  # RabbitMQ: the broker's counter
        return {
            "headers": message.headers,
            "properties": properties,
            "delivery_info": {k: info.get(k) for k in ("exchange", "routing_key")},
            "content_type": message.content_type,
            "content_encoding": message.content_encoding,
            "body": message.decode(),
        }


@pytest.fixture(params=["redis", "amqp"])
def broker(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.mark.parametrize(("case", "options", "fields"), CASES, ids=[c[0] for c in CASES])
def test_fast_path_message_equals_apply_async(
    broker: str, case: str, options: dict[str, Any], fields: dict[str, Any]
) -> None:
    suffix = uuid.uuid4().hex[:10]
    default = f"fastq-{suffix}"
    app = make_app(broker, default)
    options = {k: named(v, suffix) for k, v in options.items()}
    queue_name = options.get("queue", default)
    if "exchange" in options:
        queue_name = f"bound-{suffix}"
        exchange = Exchange(options["exchange"], type="direct")
        bound = Queue(queue_name, exchange, routing_key=options["routing_key"])
    else:
        bound = Queue(queue_name)
    with app.connection_for_write() as conn:
        bound.bind(conn.default_channel).declare()
    task = app.tasks["fast.plain"]
    publisher = Publisher(app, timedelta(seconds=5))
    runs = [
        PendingRun(
            **{"input": None, **fields},
            due=due,
            run_id=run_id("s", due),
            task="fast.plain",
            options=options,
        )
        for due in (DUE - timedelta(minutes=1), DUE)
    ]
    try:
        out = list(publisher.send([("s", r) for r in runs], NOW, batch_size=100))
        assert [o for _s, _r, o in out] == [None, None]
        first, fast = fetch(app, queue_name), fetch(app, queue_name)
        assert first["headers"]["id"] == runs[0].run_id
        # The oracle: the same run through Celery's apply_async, at the same moment.
        message = run_message("s", runs[1], durable=False, now=NOW)
        with app.producer_or_acquire() as producer:
            send_full(task, runs[1].run_id, message, producer)
        oracle = fetch(app, queue_name)
        if "expires" in options and "deadline" not in fields:
            # ``expires`` in seconds counts from the moment of each call (Celery's own clock):
            # inherently per call. It takes the full path; the header is compared for form.
            for m in (fast, oracle):
                m["headers"]["expires"] = bool(m["headers"]["expires"])
                m["properties"].pop("expiration", None)
        assert fast == oracle
        assert fast["headers"]["id"] == runs[1].run_id
        assert fast["headers"]["celery_beat_task"] is True
    finally:
        with app.connection_for_write() as conn:
            bound.bind(conn.default_channel).delete()
        app.close()


def test_the_template_path_is_taken_for_plain_options(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison above measures the fast path: apply_async sends only each shape's first."""
    from celery_durable import fast_publish

    app = make_app(redis_url, "fast-taken")
    full: list[str] = []

    def counting(task: Any, run_id: str, message: Any, producer: Any) -> None:
        full.append(run_id)
        send_full(task, run_id, message, producer)

    monkeypatch.setattr(fast_publish, "send_full", counting)
    task = app.tasks["fast.plain"]
    fast = FastPath(app)
    assert fast.usable()
    with app.producer_or_acquire() as producer:
        for i, priority in enumerate((1, 1, 1, 2, 2)):
            pending = PendingRun(
                due=DUE, run_id=f"s@{i}", task="fast.plain", input=i, options={"priority": priority}
            )
            fast.send(task, pending.run_id, run_message("s", pending, durable=False), producer)
    ids = [fetch(app, "fast-taken")["headers"]["id"] for _ in range(5)]
    app.close()
    assert full == ["s@0", "s@3"], "one apply_async per shape (priority 1, priority 2)"
    assert sorted(ids) == [f"s@{i}" for i in range(5)]


def test_overriding_and_durable_tasks_keep_the_full_path(redis_url: str) -> None:
    app = make_app(redis_url, "fast-full")
    seen: list[str] = []

    class Custom(Task):  # type: ignore[misc]
        def apply_async(self, *args: Any, **kwargs: Any) -> Any:
            seen.append(kwargs["task_id"])
            return super().apply_async(*args, **kwargs)

    @app.task(name="fast.custom", base=Custom, shared=False)
    def custom(*args: Any) -> None:
        return None

    publisher = Publisher(app, timedelta(seconds=5))
    runs = [
        ("s", PendingRun(due=DUE, run_id=f"c@{i}", task="fast.custom", input=i)) for i in range(3)
    ]
    assert [o for *_x, o in publisher.send(runs, NOW, batch_size=10)] == [None] * 3
    assert seen == ["c@0", "c@1", "c@2"]
    app.close()


def test_fast_path_refuses_arguments_the_task_cannot_take(redis_url: str) -> None:
    """Celery's argument check runs on every run (D5: such a run can never be built)."""
    app = make_app(redis_url, "fast-typing")

    @app.task(name="fast.one", shared=False)
    def one(x: int) -> None:
        return None

    publisher = Publisher(app, timedelta(seconds=5))
    good = PendingRun(due=DUE, run_id="o@1", task="fast.one", input=1)
    bad = PendingRun(due=DUE, run_id="o@2", task="fast.one", input=None, options={})
    outcomes = [o for *_x, o in publisher.send([("s", good), ("s", bad)], NOW, batch_size=10)]
    assert outcomes[0] is None
    assert isinstance(outcomes[1], str) and outcomes[1].startswith("TypeError")
    app.close()


@pytest.fixture
def cut_redis(redis_url: str) -> Iterator[tuple[str, TcpProxy]]:
    parts = urlsplit(redis_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 6379)
    proxy.restore()
    try:
        yield redis_url.replace(f"{parts.hostname}:{parts.port}", f"127.0.0.1:{proxy.port}"), proxy
    finally:
        proxy.cut()


def test_fast_path_broker_cut_leaves_runs_for_the_retry(
    cut_redis: tuple[str, TcpProxy], redis_url: str
) -> None:
    import redis

    broker, proxy = cut_redis
    app = make_app(broker, "fast-cut")
    app.conf.update(broker_connection_timeout=1, broker_transport_options={"socket_timeout": 1})
    publisher = Publisher(app, timedelta(seconds=5))

    def runs(first: int, n: int) -> list[tuple[str, PendingRun]]:
        return [
            ("s", PendingRun(due=DUE, run_id=f"s@{i}", task="fast.plain", input=i))
            for i in range(first, first + n)
        ]

    sent = list(publisher.send(runs(0, 3), NOW, batch_size=100))  # templates recorded
    assert len(sent) == 3
    proxy.cut()
    during = list(publisher.send(runs(3, 5), NOW, batch_size=100))
    assert during == []
    assert set(publisher.retry_at) == {f"s@{i}" for i in range(3, 8)}
    assert all(at == NOW + timedelta(seconds=5) for at in publisher.retry_at.values())
    proxy.restore()
    later = NOW + timedelta(seconds=5)
    after = list(publisher.send(runs(3, 5), later, batch_size=100))
    assert [r.run_id for _s, r, o in after if o is None] == [f"s@{i}" for i in range(3, 8)]
    assert publisher.retry_at == {}
    client = redis.Redis.from_url(redis_url)
    try:
        import json

        ids = [json.loads(m)["headers"]["id"] for m in client.lrange("fast-cut", 0, -1)]
    finally:
        client.close()
    assert sorted(ids) == sorted(f"s@{i}" for i in range(8)), "each run on the broker once"
    app.close()


_SHOWN_VALUES = st.one_of(
    st.lists(st.one_of(st.integers(), st.floats(), st.booleans(), st.none()), max_size=6),
    st.lists(st.integers(), max_size=4).map(tuple),
    st.lists(st.one_of(st.text(max_size=5), st.lists(st.integers(), max_size=2)), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.integers(min_value=-(2**80), max_value=2**80).map(lambda i: [i]),
)


@given(_SHOWN_VALUES, st.one_of(st.none(), st.integers(0, 40)), st.integers(0, 3))
def test_argsrepr_without_the_token_stream_is_saferepr(value: Any, size: Any, levels: int) -> None:
    """D12: the fast path's ``argsrepr``/``kwargsrepr`` are Celery's ``saferepr``, also where
    it truncates (a small ``argsrepr_maxsize``) and for what it quotes its own way."""
    assert shown(value, size, levels) == saferepr(value, size, maxlevels=levels)
