"""A project-style app (module-level ``Durable``) for the replay check's tests.

``BODY["order"]`` picks the deployed body of ``replay.order``: ``"ab"`` calls step ``a`` then
``b``; ``"ba"`` swaps them, as a careless change would. ``CALLS`` counts step executions.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery import Celery

from celery_durable import Durable, ScheduledRun, sleep

app = Celery("replay_app", broker="memory://")
app.conf.update(task_ignore_result=True)
durable = Durable(app)
BODY = {"order": "ab"}
CALLS: list[str] = []


@durable.step(name="a")
def a() -> str:
    CALLS.append("a")
    return "A"


@durable.step(name="b")
def b() -> str:
    CALLS.append("b")
    return "B"


@durable.task(name="replay.order")
def order(run: ScheduledRun | None = None) -> list[str]:
    first = a() if BODY["order"] == "ab" else b()
    sleep(timedelta(hours=2))
    second = b() if BODY["order"] == "ab" else a()
    return [first, second]


@durable.step(name="refuse")
def refuse() -> None:
    CALLS.append("refuse")
    raise PermissionError("no")


@durable.task(name="replay.faults")
def faults() -> str:
    a()
    refuse()  # fails (not retried): the run faults with StepFailed
    return "never"


def reset() -> Any:
    BODY["order"] = "ab"
    CALLS.clear()
