"""Where the harness meets the broker: sends with an ``eta`` are held until the test clock
reaches it, every send is counted until the worker has finished its delivery."""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from celery import Celery, signals

from celery_durable.core.codec import time_from_json
from celery_durable.testing._clock import TestClock, aware_utc

__all__ = ["BrokerSeam"]


@dataclass(order=True)
class _Held:
    due: datetime
    order: int
    name: str = ""
    message: Any = None
    options: Any = None


class BrokerSeam:
    """Replaces ``app.amqp.send_task_message`` for a test: holds delayed messages on the test
    clock and counts the deliveries the worker has not finished."""

    def __init__(self, app: Celery, clock: TestClock) -> None:
        self.app = app
        self.clock = clock
        self._lock = threading.Condition()
        self._held: list[_Held] = []
        self._order = itertools.count()
        self._in_flight: Counter[str] = Counter()
        self.sent = 0
        """Messages handed to the broker so far."""
        self._send: Callable[..., Any] = app.amqp.send_task_message

    def install(self, stack: ExitStack) -> None:
        """Intercept the app's sends and watch the worker's deliveries until ``stack`` closes."""
        amqp = self.app.amqp

        def send(producer: Any, name: str, message: Any, **options: Any) -> Any:
            return self._intercept(producer, name, message, options)

        amqp.send_task_message = send
        stack.callback(lambda: amqp.__dict__.pop("send_task_message", None))
        for signal in (signals.task_postrun, signals.task_revoked, signals.task_unknown):
            signal.connect(self._delivery_done, weak=False)
            stack.callback(signal.disconnect, self._delivery_done)

    def next_due(self) -> datetime | None:
        """When the earliest held message is due on the test clock."""
        with self._lock:
            return self._held[0].due if self._held else None

    def wait_idle(self, deadline: float, timeout: float) -> None:
        """Wait until every message sent has been run (``TimeoutError`` at ``deadline``)."""
        with self._lock:
            while self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"the worker did not finish {sorted(self._in_flight)} within {timeout:g} s"
                    )
                self._lock.wait(min(left, 0.05))

    def _intercept(self, producer: Any, name: str, message: Any, options: dict[str, Any]) -> Any:
        headers = message.headers
        eta = headers.get("eta") if isinstance(headers, dict) else None
        if eta:
            # Celery set the eta from wall time (app.now()); the same delay on the test clock.
            delay = time_from_json(eta) if isinstance(eta, str) else eta
            wait = (aware_utc(delay, "eta") - datetime.now(timezone.utc)).total_seconds()
            # The eta was taken a moment before now: round up to the millisecond, and hold
            # for at least one, so that a countdown always lands after the instant it waits
            # for (else a run that is not due yet would be sent back at the same instant).
            wait = max(math.ceil(wait * 1000) / 1000, 0.001)
            message = message._replace(headers={**headers, "eta": None})
            with self._lock:
                due = self.clock() + timedelta(seconds=wait)
                heapq.heappush(self._held, _Held(due, next(self._order), name, message, options))
            return None
        return self._publish(producer, name, message, options)

    def _publish(self, producer: Any, name: str, message: Any, options: dict[str, Any]) -> Any:
        task_id = message.headers.get("id")
        with self._lock:
            self._in_flight[task_id] += 1
            self.sent += 1
        try:
            return self._send(producer, name, message, **options)
        except BaseException:
            self._finished(task_id)
            raise

    def release_due(self) -> None:
        now = self.clock()
        while True:
            with self._lock:
                if not self._held or self._held[0].due > now:
                    return
                item = heapq.heappop(self._held)
            with self.app.producer_or_acquire() as producer:
                self._publish(producer, item.name, item.message, item.options)

    def _delivery_done(self, sender: Any = None, **info: Any) -> None:
        request = info.get("request")
        task_id = info.get("task_id") or info.get("id") or getattr(request, "id", None)
        message = info.get("message")
        if task_id is None and message is not None:
            task_id = getattr(message, "headers", {}).get("id")
        self._finished(task_id)

    def _finished(self, task_id: Any) -> None:
        with self._lock:
            if self._in_flight.get(task_id, 0) > 0:
                self._in_flight[task_id] -= 1
                if not self._in_flight[task_id]:
                    del self._in_flight[task_id]
            self._lock.notify_all()
