"""Celery's own result of a durable run (W1): what ``AsyncResult(run_id).get()`` returns.

A delivery that gives its worker back (a wait, a child) or finds the run owned by another
delivery (W8) stores nothing in Celery's result backend; the delivery that ends the run
stores the run's value. A backend keeps the first ``SUCCESS`` it is given, so a ``None``
stored on the way would hide the value for good (and would let a link go on before the run
ended).
"""

from __future__ import annotations

import uuid

import pytest

from celery_durable import wait_signal
from celery_durable.testing import DurableHarness

pytestmark = pytest.mark.timeout(60)


def test_a_run_that_waited_for_a_signal_gives_celery_its_value(durable: DurableHarness) -> None:
    @durable.task(name="results.approve")
    def approve(order: str) -> str:
        answer = wait_signal("approved")
        return f"{order}: {answer}"

    rid = f"r-signal-{uuid.uuid4().hex[:8]}"  # (the test app's result backend is per process)
    sent = approve.apply_async(("o-1",), task_id=rid)
    durable.run_until_idle()
    assert durable.runs.row(rid)["status"] == "suspended"
    assert sent.state == "PENDING"  # the suspended delivery stored nothing
    durable.signal(rid, "approved", "yes")
    durable.run_until_idle()
    assert durable.result(rid) == "o-1: yes"
    assert sent.get(timeout=10) == "o-1: yes"


def test_a_parent_that_waited_for_its_child_gives_celery_its_value(
    durable: DurableHarness,
) -> None:
    @durable.task(name="results.child")
    def child_task(x: int) -> int:
        return x + 1

    @durable.task(name="results.parent")
    def parent(x: int) -> list[int]:
        return [durable.child(child_task, x), durable.child(child_task, x + 10)]

    rid = f"r-parent-{uuid.uuid4().hex[:8]}"
    sent = parent.apply_async((1,), task_id=rid)
    durable.run_until_idle()
    assert durable.result(rid) == [2, 12]
    assert sent.get(timeout=10) == [2, 12]
