"""celery_durable: durable periodic work for Celery.

Schedules are event streams in a SQL journal; every due time is decided and stored before its
task is enqueued with a deterministic run ID; durable tasks journal their steps. Importing this
package does nothing else: no connection, no app, no thread.
"""

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
    Daily,
    Every,
    Once,
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
