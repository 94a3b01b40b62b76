"""Worker-side durable tasks: the task class and ``ScheduledRun``.

This module holds what a schedule needs to start a durable task; journaled steps, retries,
timers and signals build on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery_durable.codec import time_from_json, time_to_json

if TYPE_CHECKING:
    from celery_durable.durable import Durable


@dataclass(frozen=True, slots=True)
class ScheduledRun:
    """What a schedule hands to a durable task: its ID, the due time (aware UTC), the input."""

    schedule: str
    due: datetime
    input: Any = None

    def to_json(self) -> dict[str, Any]:
        return {"schedule": self.schedule, "due": time_to_json(self.due), "input": self.input}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScheduledRun:
        return cls(schedule=data["schedule"], due=time_from_json(data["due"]), input=data.get("input"))


def durable_task_base(durable: Durable) -> type:
    """The task class of durable tasks for ``durable``'s app, derived from ``app.Task``.

    Deriving from ``app.Task`` keeps what a framework put there (Django's ``DjangoTask``, a
    Flask app-context task). ``acks_late`` with ``reject_on_worker_lost`` makes the broker
    deliver the message again when a worker dies mid-run: the journal makes that replay safe.
    """
    base: type = durable.app.Task
    return type(
        "DurableTask",
        (base,),
        {
            "__durable__": True,
            "acks_late": True,
            "reject_on_worker_lost": True,
            "__module__": __name__,
        },
    )


def make_durable_task(durable: Durable, fun: Callable[..., Any], options: dict[str, Any]) -> Any:
    """Register ``fun`` as a durable Celery task."""
    options = dict(options)
    options.setdefault("base", durable.task_base)
    return durable.app.task(**options)(fun)
