"""A parent's children's messages from a template (W11, D12's machinery): Celery's own message.

The oracle is Celery itself, as for the dispatcher's fast path (tests/dispatch/
test_fast_publish.py): inside a running task (so that Celery sets ``root_id`` and
``parent_id`` from it), children's first messages go through ``send_resends`` (the first of a
shape through ``app.send_task``, the others from its template) and each template-built one
through ``Resend.send`` again (Celery's full path); both are read back from the real broker
(Redis and RabbitMQ) and compared field by field, Redis' per-message ``delivery_tag`` aside.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery import Celery

from celery_durable.fast_publish import send_resends, usable
from celery_durable.message import FIRST_SEND_HEADER, PARENT_HEADER, Resend
from tests.dispatch.test_fast_publish import fetch

#: (case, the resends' options): a first send (routed by the app's task_routes), and the
#: queue and priority a re-send of a queued child keeps (``RunStore.queued``).
CASES = [("first send", False), ("queue and priority", True)]


def make_app(broker: str, queue: str) -> Celery:
    app = Celery(f"kids-{queue}", broker=broker, set_as_current=False)
    app.conf.update(
        task_routes={"kids.*": {"queue": queue}}, broker_connection_retry_on_startup=False
    )

    @app.task(name="kids.child", shared=False)
    def child(x: Any) -> None:
        return None

    return app


def resends(parent: str, queue: str, keep: bool, n: int) -> list[Resend]:
    return [
        Resend(
            run_id=f"{parent}:0.{i}",
            task="kids.child",
            args=[{"i": i, "name": "ada" * i}] if i % 2 else [i],
            options={"queue": queue, "priority": 3} if keep else {},
            headers={PARENT_HEADER: parent, FIRST_SEND_HEADER: True},
        )
        for i in range(n)
    ]


@pytest.fixture(params=["redis", "amqp"])
def broker(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.mark.parametrize(("case", "keep"), CASES, ids=[c[0] for c in CASES])
def test_a_childs_template_message_equals_send_task(
    broker: str, case: str, keep: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = f"kidsq-{uuid.uuid4().hex[:10]}"
    app = make_app(broker, queue)
    full: list[str] = []
    real = Resend.send

    def counting(self: Resend, app: Any, **overrides: Any) -> Any:
        full.append(self.run_id)
        return real(self, app, **overrides)

    monkeypatch.setattr(Resend, "send", counting)
    parent_id = f"parent-{uuid.uuid4().hex[:6]}"
    sends = resends(parent_id, queue, keep, 4)
    trail: list[str] = []

    @app.task(name="other.parent", shared=False, bind=True)
    def parent(self: Any) -> None:
        assert usable(app)
        with app.producer_or_acquire() as producer:
            send_resends(app, producer, sends, ignore_result=True)
        trail.extend(r.id for r in self.request.children)
        for resend in sends[1:]:  # the oracle: Celery's full path for the same runs
            with app.producer_or_acquire() as producer:
                resend.send(app, producer=producer, ignore_result=True)

    try:
        parent.apply(task_id=parent_id).get()
        assert full == [s.run_id for s in sends[:1]] + [s.run_id for s in sends[1:]], (
            "one send_task per shape, then the template (the oracle's sends after them)"
        )
        assert trail == [s.run_id for s in sends], "each child joins the parent's trail"
        built = [fetch(app, queue) for _ in sends]
        oracle = [fetch(app, queue) for _ in sends[1:]]
        assert built[0]["headers"]["parent_id"] == parent_id
        assert built[0]["headers"]["root_id"] == parent_id
        for fast, want in zip(built[1:], oracle, strict=True):
            assert fast == want
        assert [m["headers"]["id"] for m in built] == [s.run_id for s in sends]
        assert [m["body"][0] for m in built] == [s.args for s in sends]
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
        app.close()


def test_a_counting_seam_sees_every_child(redis_url: str) -> None:
    """An ``amqp.send_task_message`` that is not Celery's (a harness counting sends) turns the
    template off: every child goes through it."""
    app = make_app(redis_url, "kids-seam")
    seen: list[str] = []
    real = app.amqp.send_task_message

    def seam(producer: Any, name: str, message: Any, **options: Any) -> Any:
        seen.append(message.headers["id"])
        return real(producer, name, message, **options)

    app.amqp.send_task_message = seam
    sends = resends("p", "kids-seam", False, 3)
    with app.producer_or_acquire() as producer:
        send_resends(app, producer, sends, ignore_result=True)
    assert seen == [s.run_id for s in sends]
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete("kids-seam")
    app.close()
