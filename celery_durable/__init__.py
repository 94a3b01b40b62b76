"""celery_durable: durable periodic work for Celery.

Schedules are event streams in a SQL journal; every due time is decided and stored before its
task is enqueued with a deterministic run ID; durable tasks journal their steps. Importing this
package does nothing else: no connection, no app, no thread.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_durable.core.ids import MAX_ID_LENGTH, parse_run_id, run_id
    from celery_durable.core.outcomes import Cancelled, Faulted, Finished
    from celery_durable.core.policies import CatchUp, Overlap
    from celery_durable.core.read_models import RunView, ScheduleView
    from celery_durable.core.retry import Retry
    from celery_durable.core.rules import (
        FRIDAY,
        MONDAY,
        SATURDAY,
        SUNDAY,
        THURSDAY,
        TUESDAY,
        WEDNESDAY,
        Cron,
        Crontab,
        Daily,
        Every,
        Once,
        Solar,
        Weekday,
        Weekly,
        rule_from_json,
    )
    from celery_durable.durable import Durable
    from celery_durable.errors import (
        AttemptTimeout,
        DurableError,
        InvalidSchedule,
        RunCancelled,
        RunEnded,
        RunFaulted,
        RunParked,
        ScheduleConflict,
        ScheduleNotFound,
        StepFailed,
        UnknownTask,
    )
    from celery_durable.message import ScheduledRun
    from celery_durable.worker.context import step_context
    from celery_durable.worker.primitives import now, random, sleep, uuid4, wait_signal

__all__ = [
    "FRIDAY",
    "MAX_ID_LENGTH",
    "MONDAY",
    "SATURDAY",
    "SUNDAY",
    "THURSDAY",
    "TUESDAY",
    "WEDNESDAY",
    "AttemptTimeout",
    "Cancelled",
    "CatchUp",
    "Cron",
    "Crontab",
    "Daily",
    "Durable",
    "DurableError",
    "Every",
    "Faulted",
    "Finished",
    "InvalidSchedule",
    "Once",
    "Overlap",
    "Retry",
    "RunCancelled",
    "RunEnded",
    "RunFaulted",
    "RunParked",
    "RunView",
    "ScheduleConflict",
    "ScheduleNotFound",
    "ScheduleView",
    "ScheduledRun",
    "Solar",
    "StepFailed",
    "UnknownTask",
    "Weekday",
    "Weekly",
    "now",
    "parse_run_id",
    "random",
    "rule_from_json",
    "run_id",
    "sleep",
    "step_context",
    "uuid4",
    "wait_signal",
]

_MODULE_OF = {
    "MAX_ID_LENGTH": "celery_durable.core.ids",
    "parse_run_id": "celery_durable.core.ids",
    "run_id": "celery_durable.core.ids",
    "Cancelled": "celery_durable.core.outcomes",
    "Faulted": "celery_durable.core.outcomes",
    "Finished": "celery_durable.core.outcomes",
    "CatchUp": "celery_durable.core.policies",
    "Overlap": "celery_durable.core.policies",
    "RunView": "celery_durable.core.read_models",
    "ScheduleView": "celery_durable.core.read_models",
    "Retry": "celery_durable.core.retry",
    "Cron": "celery_durable.core.rules",
    "Crontab": "celery_durable.core.rules",
    "Solar": "celery_durable.core.rules",
    "Daily": "celery_durable.core.rules",
    "Every": "celery_durable.core.rules",
    "FRIDAY": "celery_durable.core.rules",
    "MONDAY": "celery_durable.core.rules",
    "Once": "celery_durable.core.rules",
    "SATURDAY": "celery_durable.core.rules",
    "SUNDAY": "celery_durable.core.rules",
    "THURSDAY": "celery_durable.core.rules",
    "TUESDAY": "celery_durable.core.rules",
    "WEDNESDAY": "celery_durable.core.rules",
    "Weekday": "celery_durable.core.rules",
    "Weekly": "celery_durable.core.rules",
    "rule_from_json": "celery_durable.core.rules",
    "Durable": "celery_durable.durable",
    "AttemptTimeout": "celery_durable.errors",
    "DurableError": "celery_durable.errors",
    "InvalidSchedule": "celery_durable.errors",
    "RunCancelled": "celery_durable.errors",
    "RunEnded": "celery_durable.errors",
    "RunFaulted": "celery_durable.errors",
    "RunParked": "celery_durable.errors",
    "ScheduleConflict": "celery_durable.errors",
    "ScheduleNotFound": "celery_durable.errors",
    "StepFailed": "celery_durable.errors",
    "UnknownTask": "celery_durable.errors",
    "ScheduledRun": "celery_durable.message",
    "step_context": "celery_durable.worker.context",
    "now": "celery_durable.worker.primitives",
    "random": "celery_durable.worker.primitives",
    "sleep": "celery_durable.worker.primitives",
    "uuid4": "celery_durable.worker.primitives",
    "wait_signal": "celery_durable.worker.primitives",
}
"""Where each public name lives; loaded on first use (PEP 562)."""


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use, so that importing this package (or a
    pure module inside it) loads neither Celery nor SQLAlchemy."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
