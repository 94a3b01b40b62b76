"""Publishing decided runs: build each run's message and enqueue it with ``task_id = run ID``.

A broker that is away leaves the runs decided; they are tried again after the retry delay
(D3). A message that can never be built is recorded as failed to start, logged once (D5).
A task that is not registered is logged once per due time and tried again (D4).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from kombu.exceptions import EncodeError

from celery_durable import tracing
from celery_durable.core.catchup import recent_due_times
from celery_durable.core.codec import time_to_json
from celery_durable.core.rules import LiveSchedules
from celery_durable.core.schedule_aggregate import PendingRun, ScheduleState
from celery_durable.core.schedule_events import Content
from celery_durable.errors import DurableError, SecretUnavailable
from celery_durable.fast_publish import FastPath
from celery_durable.message import Resend, passes_through, run_message
from celery_durable.secret_lookup import secret_lookup

log = logging.getLogger("celery_durable.dispatcher")

#: Errors that mean "this message can never be built", as opposed to "the broker is away" (D5).
#: A secret input that cannot be read is one (P5): the error names the reference. An option
#: no date can hold (an ``expires`` stored before it was bounded) overflows Celery's builder.
PERMANENT_SEND_ERRORS: tuple[type[BaseException], ...] = (
    TypeError,
    ValueError,
    OverflowError,
    EncodeError,
    SecretUnavailable,
)


class TaskMissing(DurableError, LookupError):
    """A run's task is not registered in the dispatcher's app (D4)."""


class Publisher:
    """Sends the messages of decided runs and remembers which wait for a retry.

    ``retry_at`` maps a run ID to the moment its message may be tried again (the broker was
    away, or its task is not registered).
    """

    def __init__(self, app: Any, retry_delay: timedelta) -> None:
        self.app = app
        self.retry_delay = retry_delay
        self.secrets = secret_lookup(app)
        self.retry_at: dict[str, datetime] = {}
        self._missing_logged: dict[str, datetime] = {}
        self._failed_logged: set[str] = set()
        self._broker_down_since: datetime | None = None
        self.fast = FastPath(app)
        self._fast_now = False
        self._traced = True
        """Whether this round's sends are traced: asked once per round (a burst's rounds)."""
        self._tasks: Mapping[str, Any] = {}

    def send(
        self, runs: Sequence[tuple[str, PendingRun]], now: datetime, *, batch_size: int
    ) -> Iterable[tuple[str, PendingRun, str | Resend | None]]:
        """Enqueue runs and yield ``(sid, run, outcome)``.

        The outcome is ``None`` for a plain task that was sent, a :class:`Resend` (the message,
        to record) for a durable task that was sent, the error text for a run that never can be.
        """
        if not runs:
            return
        sent: list[tuple[str, PendingRun, Resend | None]] = []
        failed: list[tuple[str, PendingRun, str]] = []
        try:
            with self.app.producer_or_acquire() as producer:
                connect_once(producer)
                self._fast_now = self.fast.usable()
                self._traced = tracing.tracer() is not None
                self._tasks = self.app.tasks
                self.fast.start_round()
                batch = getattr(producer, "batch", None)
                context = batch(max_size=batch_size) if batch is not None else nullcontext()
                with context:
                    for sid, pending in runs:
                        try:
                            record = self.publish(sid, pending, producer, now)
                        except TaskMissing as exc:
                            self.log_missing(sid, pending.task, pending.due, now, exc)
                            self.retry_at[pending.run_id] = now + self.retry_delay
                        except PERMANENT_SEND_ERRORS as exc:
                            failed.append((sid, pending, f"{type(exc).__name__}: {exc}"))
                        else:
                            sent.append((sid, pending, record))
        except Exception as exc:  # the broker is away: nothing of this round counts as sent
            if self._broker_down_since is None:
                self._broker_down_since = now
                log.error(
                    "cannot enqueue %d decided run(s): %s: %s; retrying every %.0fs",
                    len(runs),
                    type(exc).__name__,
                    exc,
                    self.retry_delay.total_seconds(),
                )
            for _sid, pending in runs:
                self.retry_at[pending.run_id] = now + self.retry_delay
            sent = []
        else:
            if self._broker_down_since is not None and sent:
                log.warning("broker reachable again; enqueueing decided runs")
                self._broker_down_since = None
        for sid, pending, record in sent:
            self.retry_at.pop(pending.run_id, None)
            yield sid, pending, record
        for sid, pending, error in failed:
            if pending.run_id not in self._failed_logged:
                self._failed_logged.add(pending.run_id)
                log.error(
                    "run %r of schedule %r (due %s, task %r) can never be enqueued: %s",
                    pending.run_id,
                    sid,
                    time_to_json(pending.due),
                    pending.task,
                    error,
                    extra={"schedule": sid, "run_id": pending.run_id, "due": pending.due},
                )
            yield sid, pending, error

    def may_send(self, run_id: str, now: datetime) -> bool:
        """Whether the run's message may be tried at ``now`` (none waits for a retry)."""
        return self.retry_at.get(run_id, now) <= now

    def retries_of(self, state: ScheduleState) -> dict[str, datetime]:
        """When each of the schedule's sendable runs that waits for a retry is tried again."""
        retry_at = self.retry_at
        return {p.run_id: retry_at[p.run_id] for p in state.sendable() if p.run_id in retry_at}

    def publish(
        self, sid: str, pending: PendingRun, producer: Any, now: datetime | None = None
    ) -> Resend | None:
        """Send one run's message at ``now``; a durable run's message comes back to be
        recorded."""
        task = self._tasks.get(pending.task)
        if task is None and not task_sendable(self.app, pending.task, pending.options):
            raise TaskMissing(f"task {pending.task!r} is not registered", task=pending.task)
        durable = bool(getattr(task, "__durable__", False))
        message = run_message(sid, pending, durable=durable, now=now, secrets=self.secrets)
        if task is not None and not durable and self._fast_now:
            if not self._traced:
                self.fast.send(task, pending.run_id, message, producer)  # D12
                return None
            with tracing.sending(sid, pending, now, message.headers) as headers:
                traced = dataclasses.replace(message, headers=headers)
                self.fast.send(task, pending.run_id, traced, producer)  # D12
            return None
        # B4: a beat_schedule task known only to the workers goes by name, as stock beat's.
        send = task.apply_async if task is not None else partial(self.app.send_task, pending.task)
        with tracing.sending(sid, pending, now, message.headers) as headers:
            send(
                message.args,
                message.kwargs,
                task_id=pending.run_id,
                producer=producer,
                headers=headers,
                retry=False,
                **message.options,
            )
        if not durable:
            return None
        return Resend(
            run_id=pending.run_id,
            task=pending.task,
            args=message.args,
            kwargs=message.kwargs,
            options=message.options,
            headers=message.headers,
        )

    # Deploy safety --------------------------------------------------------------------------

    def task_missing(
        self, state: ScheduleState, now: datetime, live: LiveSchedules | None = None
    ) -> bool:
        """D4: when the schedule's task is gone, log at each due time and decide nothing."""
        if not self.task_gone(state):
            return False
        content = state.content
        assert content is not None
        first = state.next_due(live)
        if first is not None and first <= now and state.cursor is not None:
            latest = recent_due_times(
                content.rule, state.cursor, now, state.anchor, 1, live and live.as_of(now)
            ).run
            self.log_missing(
                state.schedule_id, content.task, latest[-1] if latest else first, now, None
            )
        elif first is not None and first <= now:
            self.log_missing(state.schedule_id, content.task, first, now, None)
        return True

    def task_gone(self, state: ScheduleState) -> bool:
        """Whether an active schedule's task can be sent by nobody here (D4)."""
        content = state.content
        return content is not None and state.active and not self.sendable_task(content)

    def sendable_task(self, content: Content) -> bool:
        """Registered here, or an imported schedule's task, sent by name if need be (B4, I1)."""
        return task_sendable(self.app, content.task, content.options)

    def log_missing(
        self, sid: str, task: str, due: datetime, now: datetime, exc: Exception | None
    ) -> None:
        """Log a missing task once per schedule and due time (D4)."""
        if self._missing_logged.get(sid) == due:
            return
        self._missing_logged[sid] = due
        log.error(
            "schedule %r: task %r is not registered; nothing is decided for due time %s",
            sid,
            task,
            time_to_json(due),
            extra={"schedule": sid, "task": task, "due": due},
        )


def task_sendable(app: Any, task: str, options: Mapping[str, Any]) -> bool:
    """The one D4 predicate: whether a run of ``task`` with these options can be sent from
    ``app``: its task is registered there, or its schedule's options are passed through as
    their source scheduler sent them, by name (B4, I1)."""
    return task in app.tasks or passes_through(options)


def connect_once(producer: Any) -> None:
    """Connect the producer now, trying each broker host once, without sleeping.

    Left to itself, kombu retries a lost connection inside the first publish for up to
    ``broker_connection_timeout`` (4 s by default, with 2 s sleeps): a tick would stall there
    while the broker is down. Failing at once keeps the loop turning (D3): the runs stay
    decided and are tried again after ``min(check interval, 5 s)``.
    """
    connection = getattr(producer, "connection", None)
    ensure = getattr(connection, "ensure_connection", None)
    if ensure is None:
        return
    hosts = len(getattr(connection, "alt", None) or ()) or 1
    ensure(max_retries=hosts - 1, interval_start=0, interval_step=0, interval_max=0)
