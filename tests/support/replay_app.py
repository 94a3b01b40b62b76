"""A project-style app (module-level ``Durable``) for the replay check's tests.

``BODY["order"]`` picks the deployed body of ``replay.order``: ``"ab"`` calls step ``a`` then
``b``; ``"ba"`` swaps them, as a careless change would. ``CALLS`` counts step executions.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery import Celery

from celery_durable import Durable, ScheduledRun, parallel, patched, sleep

app = Celery("replay_app", broker="memory://")
app.conf.update(task_ignore_result=True)
durable = Durable(app)
BODY = {"order": "ab", "patch": "old", "branches": "ab", "parent": "a"}
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


@durable.task(name="replay.patching")
def patching() -> list[str]:
    """``BODY["patch"]``: ``"old"`` calls ``a`` then ``b``; ``"new"`` guards ``b`` first
    with ``patched`` (W14), so runs of the old code keep their path."""
    if BODY["patch"] == "new" and patched("b-first"):
        return [b(), a()]
    return [a(), b()]


@durable.task(name="replay.branched")
def branched() -> list[str]:
    """``BODY["branches"]``: the two branches of a parallel call, ``"ab"`` or swapped."""
    first, second = (a, b) if BODY["branches"] == "ab" else (b, a)
    return parallel(first, second)


@durable.task(name="replay.patch_wait")
def patch_wait() -> list[str]:
    """As ``replay.patching``, with a durable sleep in the middle: runs of the old code are
    still suspended when the new code is deployed (W14)."""
    first = b() if BODY["patch"] == "new" and patched("b-first") else a()
    sleep(timedelta(hours=2))
    return [first, b()]


@durable.task(name="replay.kid")
def kid() -> str:
    """A child that sleeps a day: its parent waits for it, suspended."""
    sleep(timedelta(days=1))
    return b()


@durable.task(name="replay.parent")
def parent() -> list[str]:
    """``BODY["parent"]``: ``"a"`` calls step ``a`` before waiting for its child; ``"b"``
    calls ``b`` there (a change that would park the waiting runs of the old code)."""
    first = a() if BODY["parent"] == "a" else b()
    return [first, durable.child(kid)]


@durable.step(name="measure")
def measure(size: int) -> int:
    CALLS.append("measure")
    return size


@durable.task(name="replay.secret")
def secretive(run: ScheduledRun) -> int:
    """Reads a secret input (P5): ``setting:REPLAY_TOKEN`` from the app's settings."""
    return measure(len(run.input["token"]))


def reset() -> Any:
    BODY.update(order="ab", patch="old", branches="ab", parent="a")
    CALLS.clear()
