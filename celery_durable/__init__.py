"""celery_durable: durable periodic work for Celery.

Schedules are event streams in a SQL journal; every due time is decided and stored before its
task is enqueued with a deterministic run ID; durable tasks journal their steps. Importing this
package does nothing else: no connection, no app, no thread.
"""

# ruff: noqa: I001 - the re-exports below are ``import A as A`` lists, one statement per module

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_durable.core.blackouts import Blackout as Blackout, OnBlackout as OnBlackout
    from celery_durable.core.children import ChildHandle as ChildHandle
    from celery_durable.core.ids import (
        MAX_ID_LENGTH as MAX_ID_LENGTH,
        parse_run_id as parse_run_id,
        run_id as run_id,
    )
    from celery_durable.core.outcomes import (
        Cancelled as Cancelled,
        Faulted as Faulted,
        Finished as Finished,
    )
    from celery_durable.core.policies import CatchUp as CatchUp, Overlap as Overlap
    from celery_durable.core.read_models import RunView as RunView, ScheduleView as ScheduleView
    from celery_durable.core.retry import Retry as Retry
    from celery_durable.core.rules import (
        FRIDAY as FRIDAY,
        MONDAY as MONDAY,
        SATURDAY as SATURDAY,
        SUNDAY as SUNDAY,
        THURSDAY as THURSDAY,
        TUESDAY as TUESDAY,
        WEDNESDAY as WEDNESDAY,
        Cron as Cron,
        Crontab as Crontab,
        Daily as Daily,
        Every as Every,
        Once as Once,
        Solar as Solar,
        Weekday as Weekday,
        Weekly as Weekly,
        rule_from_json as rule_from_json,
    )
    from celery_durable.core.secrets import Secret as Secret
    from celery_durable.core.specs import ScheduleSpec as ScheduleSpec
    from celery_durable.durable import Durable as Durable
    from celery_durable.errors import (
        AttemptTimeout as AttemptTimeout,
        DurableError as DurableError,
        InvalidSchedule as InvalidSchedule,
        RunCancelled as RunCancelled,
        RunEnded as RunEnded,
        RunFaulted as RunFaulted,
        RunParked as RunParked,
        ScheduleConflict as ScheduleConflict,
        ScheduleNotFound as ScheduleNotFound,
        SecretUnavailable as SecretUnavailable,
        StepFailed as StepFailed,
        UnknownTask as UnknownTask,
    )
    from celery_durable.message import ScheduledRun as ScheduledRun
    from celery_durable.worker.branches import (
        gather as gather,
        parallel as parallel,
        patched as patched,
        race as race,
    )
    from celery_durable.worker.context import step_context as step_context
    from celery_durable.worker.primitives import (
        now as now,
        random as random,
        sleep as sleep,
        uuid4 as uuid4,
        wait_signal as wait_signal,
    )


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

__all__ = sorted(_MODULE_OF)  # the table above is the one runtime list of exports


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
