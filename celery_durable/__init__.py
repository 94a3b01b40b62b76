"""celery_durable: durable periodic work for Celery.

Schedules are event streams in a SQL journal; every due time is decided and stored before its
task is enqueued with a deterministic run ID; durable tasks journal their steps. Importing this
package does nothing else: no connection, no app, no thread.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_durable.core.blackouts import Blackout, OnBlackout
    from celery_durable.core.children import ChildHandle
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
    from celery_durable.core.secrets import Secret
    from celery_durable.core.specs import ScheduleSpec
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
        SecretUnavailable,
        StepFailed,
        UnknownTask,
    )
    from celery_durable.message import ScheduledRun
    from celery_durable.worker.branches import gather, parallel, patched, race
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
    "Blackout",
    "Cancelled",
    "CatchUp",
    "ChildHandle",
    "Cron",
    "Crontab",
    "Daily",
    "Durable",
    "DurableError",
    "Every",
    "Faulted",
    "Finished",
    "InvalidSchedule",
    "OnBlackout",
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
    "ScheduleSpec",
    "ScheduleView",
    "ScheduledRun",
    "Secret",
    "SecretUnavailable",
    "Solar",
    "StepFailed",
    "UnknownTask",
    "Weekday",
    "Weekly",
    "gather",
    "now",
    "parallel",
    "parse_run_id",
    "patched",
    "race",
    "random",
    "rule_from_json",
    "run_id",
    "sleep",
    "step_context",
    "uuid4",
    "wait_signal",
]

_EXPORTS: dict[str, tuple[str, ...]] = {
    "celery_durable.core.children": ("ChildHandle",),
    "celery_durable.core.blackouts": ("Blackout", "OnBlackout"),
    "celery_durable.core.ids": ("MAX_ID_LENGTH", "parse_run_id", "run_id"),
    "celery_durable.core.outcomes": ("Cancelled", "Faulted", "Finished"),
    "celery_durable.core.policies": ("CatchUp", "Overlap"),
    "celery_durable.core.read_models": ("RunView", "ScheduleView"),
    "celery_durable.core.retry": ("Retry",),
    "celery_durable.core.secrets": ("Secret",),
    "celery_durable.core.rules": (
        "Cron",
        "Crontab",
        "Daily",
        "Every",
        "FRIDAY",
        "MONDAY",
        "Once",
        "SATURDAY",
        "SUNDAY",
        "Solar",
        "THURSDAY",
        "TUESDAY",
        "WEDNESDAY",
        "Weekday",
        "Weekly",
        "rule_from_json",
    ),
    "celery_durable.core.specs": ("ScheduleSpec",),
    "celery_durable.durable": ("Durable",),
    "celery_durable.errors": (
        "AttemptTimeout",
        "DurableError",
        "InvalidSchedule",
        "RunCancelled",
        "RunEnded",
        "RunFaulted",
        "RunParked",
        "ScheduleConflict",
        "ScheduleNotFound",
        "SecretUnavailable",
        "StepFailed",
        "UnknownTask",
    ),
    "celery_durable.message": ("ScheduledRun",),
    "celery_durable.worker.branches": ("gather", "parallel", "patched", "race"),
    "celery_durable.worker.context": ("step_context",),
    "celery_durable.worker.primitives": ("now", "random", "sleep", "uuid4", "wait_signal"),
}
"""The module of each public name, as the ``TYPE_CHECKING`` imports above give it."""

_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
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
