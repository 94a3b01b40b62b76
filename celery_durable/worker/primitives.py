"""Deterministic helpers, durable sleep and signal waits for durable task bodies (W4).

Each call takes a position like a step. ``now()``, ``uuid4()`` and ``random()`` store their
value the first time and return the stored value on replay. ``sleep`` stores its wake time and
gives the worker back; ``wait_signal`` consumes the oldest stored signal of a name, or gives the
worker back until one arrives or its timeout passes. Outside a durable task they are plain
calls (``wait_signal`` excepted: it needs a run to receive signals).
"""

from __future__ import annotations

import random as _random
import time
import uuid as _uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from celery_durable.core.codec import time_from_json, time_to_json
from celery_durable.core.retry import Seconds, seconds
from celery_durable.core.run_aggregate import (
    SIGNAL_CONSUMED,
    SIGNAL_TIMED_OUT,
    SIGNAL_WAIT_STARTED,
    SLEEP_STARTED,
    STEP_COMPLETED,
    PositionId,
)
from celery_durable.errors import DurableError
from celery_durable.worker.context import Changed, RunContext, current_run
from celery_durable.worker.steps import INLINE_WAIT, cancelled, step_failed
from celery_durable.worker.traced import traced


def _value(name: str, make: Callable[[], Any], decode: Callable[[Any], Any]) -> Any:
    run = current_run()
    if run is None or run.in_step:
        return decode(make())
    position, record = run.reach(name, name)
    if record is not None:
        if record.status == "completed":
            return decode(record.result)
        if record.status == "failed":
            raise step_failed(run.run_id, position, name, record.error or {}, record.attempts)
    if run.state.cancel_pending:
        raise cancelled(run, position, name, name)
    run.notify("call", position, name)
    value = make()
    run.append([run.event(STEP_COMPLETED, position, name=name, kind=name, result=value)])
    run.notify("stored", position, name)
    return decode(value)


@traced("now")
def now() -> datetime:
    """The current time (aware UTC), stored on first use so that replay sees the same time."""
    run = current_run()
    clock = (lambda: datetime.now(timezone.utc)) if run is None else run.now
    return _value("now", lambda: time_to_json(clock()), time_from_json)


@traced("uuid4")
def uuid4() -> _uuid.UUID:
    """A random UUID, stored on first use."""
    return _value("uuid4", lambda: str(_uuid.uuid4()), _uuid.UUID)


@traced("random")
def random() -> float:
    """A random float in [0, 1), stored on first use."""
    return _value("random", _random.random, float)


@traced("sleep")
def sleep(duration: Seconds) -> None:
    """Sleep durably: the wake time is stored when the call is first reached (W4).

    Up to a second is slept inside the worker. A longer sleep gives the worker back: the task
    comes back by a broker countdown when the sleep is short (``durable_short_sleep``, 60 s
    by default, and below Redis' visibility timeout), otherwise the dispatcher sends it again
    at the wake time. A delivery that comes early goes back to sleep without running anything.
    """
    delay = seconds(duration, "sleep duration") or 0.0
    run = current_run()
    if run is None or run.in_step:
        time.sleep(delay)
        return
    position, record = run.reach("sleep", "sleep")
    if record is not None and record.status == "failed":
        raise step_failed(run.run_id, position, "sleep", record.error or {}, record.attempts)
    if run.state.cancel_pending:
        raise cancelled(run, position, "sleep", "sleep")
    events = []
    if record is None:
        wake = run.now() + timedelta(seconds=delay)
        events.append(
            run.event(
                SLEEP_STARTED, position, name="sleep", kind="sleep", wake_at=time_to_json(wake)
            )
        )
    else:
        wake = record.until or run.now()
    remaining = (wake - run.now()).total_seconds()
    if remaining <= INLINE_WAIT:
        if events:
            run.append(events)
        run.wait(remaining)
        return
    try:
        raise run.suspend(wake, "sleep", events)
    except Changed:
        raise cancelled(run, position, "sleep", "sleep") from None


@traced("signal", name=lambda name, timeout=None: str(name))
def wait_signal(name: str, timeout: Seconds | None = None) -> Any:
    """The payload of the oldest unconsumed signal called ``name``, waiting for one (W4).

    Signals sent before the wait are kept and consumed oldest first. Without a signal the
    worker is given back until one arrives (``durable.signal`` sends the run again) or until
    ``timeout`` seconds after the wait was first reached; then ``None`` is returned and a
    signal arriving later stays stored for the next wait of that name.
    """
    if not isinstance(name, str) or not name:
        raise TypeError("a signal name must be a non-empty str")
    limit = seconds(timeout, "timeout")
    run = current_run()
    if run is None or run.in_step:
        raise DurableError("wait_signal() can only be called inside a durable task (not in a step)")
    position, record = run.reach(name, "signal")
    if record is not None:
        if record.status == "completed":
            return record.result
        if record.status == "timed_out":
            return None
        if record.status == "failed":
            raise step_failed(run.run_id, position, name, record.error or {}, record.attempts)
    while True:
        try:
            return _wait_once(run, position, name, record, limit)
        except Changed:
            continue


def _wait_once(
    run: RunContext, position: PositionId, name: str, record: Any, limit: float | None
) -> Any:
    if run.state.cancel_pending:
        raise cancelled(run, position, name, "signal")
    pending = run.state.pending_signal(name)
    if pending is not None:
        signal_version, payload = pending
        run.append(
            [
                run.event(
                    SIGNAL_CONSUMED, position, name=name, kind="signal",
                    signal=signal_version, payload=payload,
                )
            ]
        )  # fmt: skip
        return payload
    now = run.now()
    events = []
    if record is None or record.status != "waiting":
        until = None if limit is None else now + timedelta(seconds=limit)
        events.append(
            run.event(
                SIGNAL_WAIT_STARTED, position, name=name, kind="signal",
                at=time_to_json(now), until=None if until is None else time_to_json(until),
            )
        )  # fmt: skip
    else:
        until = record.until
    if until is not None and now >= until:
        run.append([*events, run.event(SIGNAL_TIMED_OUT, position, name=name, kind="signal")])
        return None
    raise run.suspend(until, "signal", events, wait=name)
