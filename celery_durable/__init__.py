"""celery_durable: durable periodic work for Celery.

Schedules are event streams in a SQL journal; every due time is decided and stored before its
task is enqueued with a deterministic run ID; durable tasks journal their steps. Importing this
package does nothing else: no connection, no app, no thread.
"""

from celery_durable.durable import Durable
from celery_durable.errors import (
    DurableError,
    InvalidSchedule,
    RunCancelled,
    RunFaulted,
    ScheduleConflict,
    StepFailed,
    UnknownTask,
)
from celery_durable.ids import MAX_ID_LENGTH, parse_run_id, run_id
from celery_durable.policies import CatchUp, Overlap
from celery_durable.rules import (
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
    Weekly,
)
from celery_durable.tasks import ScheduledRun
from celery_durable.views import RunView, ScheduleView

__all__ = [
    "FRIDAY",
    "MAX_ID_LENGTH",
    "MONDAY",
    "SATURDAY",
    "SUNDAY",
    "THURSDAY",
    "TUESDAY",
    "WEDNESDAY",
    "CatchUp",
    "Cron",
    "Daily",
    "Durable",
    "DurableError",
    "Every",
    "InvalidSchedule",
    "Once",
    "Overlap",
    "RunCancelled",
    "RunFaulted",
    "RunView",
    "ScheduleConflict",
    "ScheduleView",
    "ScheduledRun",
    "StepFailed",
    "UnknownTask",
    "Weekly",
    "parse_run_id",
    "run_id",
]
