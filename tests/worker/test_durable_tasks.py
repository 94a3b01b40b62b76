"""Durable tasks in-process (W1-W8) on a real journal: SQLite file and PostgreSQL.

Deliveries run through Celery's ``task.apply()`` (the worker's tracer, in this process). A
"crash" is a ``BaseException`` raised by the body, which stores nothing, like a killed
worker; the next delivery moves the injected clock past the crashed delivery's lease.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, RunCancelled, RunFaulted, StepFailed
from celery_durable.core.outcomes import Cancelled, Faulted, Finished
from celery_durable.core.retry import Retry
from celery_durable.errors import DurableError, RunEnded, RunParked
from celery_durable.message import ScheduledRun, scheduled_message
from celery_durable.worker.context import step_context
from celery_durable.worker.primitives import now, random, sleep, uuid4, wait_signal

pytestmark = pytest.mark.timeout(60)


class Crash(BaseException):
    """A worker dying mid-body: nothing is stored for it."""


class Env:
    """A Celery app with a Durable on ``url`` and a clock the test can move."""

    def __init__(self, url: str, **conf: Any) -> None:
        self.app = Celery(f"t-{uuid.uuid4().hex[:6]}", broker="memory://")
        self.app.conf.update(conf)
        self.offset = 0.0
        self.durable = Durable(self.app, url, clock=self.clock)

    def clock(self) -> datetime:
        return datetime.now(timezone.utc) + timedelta(seconds=self.offset)

    def after_crash(self) -> None:
        """Move the clock past the crashed delivery's lease."""
        self.offset += self.durable.config.run_lease + 1

    def run(self, task: Any, *args: Any, run_id: str | None = None) -> Any:
        return task.apply(args, task_id=run_id or str(uuid.uuid4())).get()

    def close(self) -> None:
        self.durable.close()


@pytest.fixture
def env(journal_url: str) -> Any:
    e = Env(journal_url)
    yield e
    e.close()


def new_id() -> str:
    return f"run-{uuid.uuid4()}"


# -- W1, W2 ----------------------------------------------------------------------------------


def test_steps_run_once_and_a_repeated_start_runs_nothing(env: Env) -> None:
    ran: list[str] = []
    bodies: list[int] = []

    @env.durable.step
    def fetch(x: int) -> int:
        ran.append("fetch")
        return x * 2

    @env.durable.step(name="store")
    def store(x: int) -> dict[str, int]:
        ran.append("store")
        return {"stored": x}

    @env.durable.task(name="t.pipeline")
    def pipeline(x: int) -> Any:
        bodies.append(1)
        return store(fetch(x))

    rid = new_id()
    assert env.run(pipeline, 21, run_id=rid) == {"stored": 42}
    assert env.run(pipeline, 21, run_id=rid) == {"stored": 42}
    assert ran == ["fetch", "store"]
    assert bodies == [1], "a finished run's redelivery must not run the body"
    assert env.durable.outcome(rid, 1) == Finished({"stored": 42})
    assert env.durable.result(rid, 1) == {"stored": 42}


def test_crash_replays_stored_steps_and_reruns_only_the_started_one(env: Env) -> None:
    seen: list[tuple[str, Any]] = []
    crash = {"at": "b"}

    @env.durable.step
    def a() -> str:
        seen.append(("a", step_context()))
        return "A"

    @env.durable.step
    def b() -> str:
        seen.append(("b", step_context()))
        if crash["at"] == "b":
            raise Crash()
        return "B"

    @env.durable.task(name="t.crashy")
    def crashy() -> list[str]:
        return [a(), b()]

    rid = new_id()
    with pytest.raises(Crash):
        env.run(crashy, run_id=rid)
    crash["at"] = ""
    env.after_crash()
    assert env.run(crashy, run_id=rid) == ["A", "B"]
    assert [name for name, _ in seen] == ["a", "b", "b"]
    first_b, second_b = seen[1][1], seen[2][1]
    assert first_b.idempotency_key == second_b.idempotency_key == f"t.crashy/{rid}/1"
    assert (first_b.position, first_b.attempt, first_b.run_id) == (1, 1, rid)


def test_step_outside_a_durable_task_is_a_plain_call(env: Env) -> None:
    @env.durable.step(retry=Retry.times(3))
    def double(x: int) -> int:
        return x * 2

    assert double(4) == 8
    assert abs((now() - datetime.now(timezone.utc)).total_seconds()) < 5
    assert 0 <= random() < 1
    assert uuid4().version == 4
    with pytest.raises(DurableError):
        step_context()


def test_stored_failure_is_raised_again_without_running(env: Env) -> None:
    calls: list[int] = []
    crash = {"on": True}

    @env.durable.step
    def broken() -> None:
        calls.append(1)
        raise KeyError("missing thing")

    @env.durable.task(name="t.failing")
    def failing() -> dict[str, Any]:
        try:
            broken()
        except StepFailed as exc:
            info = {"kind": exc.kind, "type": exc.error_type, "msg": exc.error_message}
        if crash["on"]:
            raise Crash()
        return info

    rid = new_id()
    with pytest.raises(Crash):
        env.run(failing, run_id=rid)
    crash["on"] = False
    env.after_crash()
    info = env.run(failing, run_id=rid)
    assert info == {"kind": "error", "type": "KeyError", "msg": "'missing thing'"}
    assert calls == [1]


def test_result_that_is_not_json_fails_the_step_without_retry(env: Env) -> None:
    calls: list[int] = []

    @env.durable.step(retry=Retry.times(3, initial=0.01))
    def tuple_result() -> Any:
        calls.append(1)
        return (1, 2)

    @env.durable.task(name="t.notjson")
    def notjson() -> Any:
        return tuple_result()

    rid = new_id()
    with pytest.raises(StepFailed) as info:
        env.run(notjson, run_id=rid)
    assert info.value.kind == "not_retryable"
    assert "JSON round trip" in info.value.error_message
    assert calls == [1]
    outcome = env.durable.outcome(rid, 1)
    assert isinstance(outcome, Faulted) and outcome.kind == "not_retryable"


def test_changed_body_parks_the_run_naming_position_expected_and_found(env: Env) -> None:
    version = {"body": 1, "crash": True}

    @env.durable.step
    def load() -> int:
        return 1

    @env.durable.step
    def old_step() -> int:
        return 2

    @env.durable.step
    def new_step() -> int:
        return 3

    @env.durable.task(name="t.changing")
    def changing() -> int:
        x = load()
        y = old_step() if version["body"] == 1 else new_step()
        if version["crash"]:
            raise Crash()
        return x + y

    rid = new_id()
    with pytest.raises(Crash):
        env.run(changing, run_id=rid)
    version.update(body=2, crash=False)
    env.after_crash()
    with pytest.raises(RunParked) as info:
        env.run(changing, run_id=rid)
    message = str(info.value)
    assert "position 1" in message and "old_step" in message and "new_step" in message
    assert info.value.position == 1
    outcome = env.durable.outcome(rid, 1)
    assert isinstance(outcome, Faulted) and outcome.kind == "parked"
    assert env.durable.runs.row(rid)["status"] == "parked"


# -- W3 --------------------------------------------------------------------------------------


def test_retries_count_attempts_and_keep_the_key(env: Env) -> None:
    seen: list[tuple[int, str]] = []

    @env.durable.step(retry=Retry.times(3, initial=0.05))
    def flaky() -> str:
        ctx = step_context()
        seen.append((ctx.attempt, ctx.idempotency_key))
        if ctx.attempt < 3:
            raise ConnectionError("try again")
        return "ok"

    @env.durable.task(name="t.retry")
    def retry_task() -> str:
        return flaky()

    rid = new_id()
    assert env.run(retry_task, run_id=rid) == "ok"
    assert [a for a, _ in seen] == [1, 2, 3]
    assert len({k for _, k in seen}) == 1


def test_non_retryable_exception_fails_at_once(env: Env) -> None:
    calls: list[int] = []

    @env.durable.step(retry=Retry.times(5, initial=0.01, dont_retry_on=(PermissionError,)))
    def guarded() -> None:
        calls.append(1)
        raise PermissionError("denied")

    @env.durable.task(name="t.nonretry")
    def nonretry() -> None:
        guarded()

    with pytest.raises(StepFailed) as info:
        env.run(nonretry)
    assert info.value.kind == "not_retryable" and calls == [1]


def test_attempt_timeout(env: Env) -> None:
    calls: list[int] = []

    @env.durable.step(retry=Retry(attempts=2, initial=0.01, timeout=0.2))
    def hangs() -> None:
        calls.append(1)
        time.sleep(2)

    @env.durable.task(name="t.timeout")
    def timeout_task() -> None:
        hangs()

    started = time.monotonic()
    with pytest.raises(StepFailed) as info:
        env.run(timeout_task)
    assert info.value.kind == "timeout" and calls == [1, 1]
    assert time.monotonic() - started < 1.5


def test_deadline_counts_from_the_stored_start_across_a_crash(env: Env) -> None:
    attempts: list[int] = []
    crash = {"on": True}

    @env.durable.step(retry=Retry.forever(deadline=0.5, initial=0.2, multiplier=1))
    def never() -> None:
        attempts.append(step_context().attempt)
        if crash["on"] and step_context().attempt == 2:
            raise Crash()
        raise OSError("down")

    @env.durable.task(name="t.deadline")
    def deadline_task() -> None:
        never()

    rid = new_id()
    with pytest.raises(Crash):
        env.run(deadline_task, run_id=rid)
    crash["on"] = False
    env.after_crash()  # the clock jumps far past the deadline of 0.5 s
    with pytest.raises(StepFailed) as info:
        env.run(deadline_task, run_id=rid)
    # Attempt 2 crashed (nothing stored): it runs again, then the deadline is long gone.
    assert attempts == [1, 2, 2]
    assert info.value.attempts == 2


# -- W4 --------------------------------------------------------------------------------------


def test_deterministic_helpers_return_stored_values_on_replay(env: Env) -> None:
    crash = {"on": True}

    @env.durable.task(name="t.helpers")
    def helpers() -> list[Any]:
        values = [now().isoformat(), str(uuid4()), random()]
        if crash["on"]:
            raise Crash(values)
        return values

    rid = new_id()
    with pytest.raises(Crash) as first:
        env.run(helpers, run_id=rid)
    crash["on"] = False
    env.after_crash()
    assert env.run(helpers, run_id=rid) == first.value.args[0]


def test_durable_sleep_stores_its_wake_time(env: Env) -> None:
    @env.durable.task(name="t.sleep")
    def sleeper() -> float:
        start = time.monotonic()
        sleep(0.3)
        return time.monotonic() - start

    assert env.run(sleeper) >= 0.29


def test_signals_kept_before_the_wait_consumed_oldest_first(env: Env) -> None:
    @env.durable.task(name="t.waits")
    def waits() -> list[Any]:
        return [wait_signal("go"), wait_signal("go"), wait_signal("other", timeout=0.2)]

    rid = new_id()
    env.durable.signal(rid, "go", {"n": 1})
    env.durable.signal(rid, "go", {"n": 2})
    assert env.run(waits, run_id=rid) == [{"n": 1}, {"n": 2}, None]
    with pytest.raises(RunEnded):
        env.durable.signal(rid, "go", 3)


def test_signal_after_the_wait_wakes_the_run(env: Env) -> None:
    @env.durable.task(name="t.waiter")
    def waiter() -> Any:
        return wait_signal("approve", timeout=30)

    rid = new_id()
    thread = threading.Thread(target=lambda: env.run(waiter, run_id=rid), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while (env.durable.runs.row(rid) or {}).get("status") != "suspended":
        assert time.monotonic() < deadline, "the run never suspended on its wait"
        time.sleep(0.02)
    env.durable.signal(rid, "approve", "yes")
    assert env.durable.result(rid, 10) == "yes"
    thread.join(5)


def test_cancel_reaches_the_current_step_and_cleanup_runs(env: Env) -> None:
    cleaned: list[int] = []

    @env.durable.step
    def cleanup() -> str:
        cleaned.append(1)
        return "cleaned"

    @env.durable.task(name="t.cancellable")
    def cancellable() -> None:
        try:
            sleep(30)
        except StepFailed as exc:
            assert exc.kind == "cancelled"
            cleanup()
            raise

    rid = new_id()
    thread = threading.Thread(
        target=lambda: _swallow(env.run, cancellable, run_id=rid), daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 10
    while (env.durable.runs.row(rid) or {}).get("status") != "suspended":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # A 30 s sleep comes back by a broker countdown; the dispatcher sends it again only if
    # that message is lost: one lease after the wake time.
    lease = env.durable.config.run_lease
    wake = env.durable.runs.wakeups(env.clock() + timedelta(seconds=31 + lease))
    assert [r.run_id for r in wake] == [rid] and wake[0].task == "t.cancellable"
    assert env.durable.runs.wakeups(env.clock() + timedelta(seconds=31)) == []
    assert env.durable.cancel(rid) is True
    assert env.durable.outcome(rid, 10) == Cancelled()
    with pytest.raises(RunCancelled):
        env.durable.result(rid, 1)
    assert cleaned == [1]
    assert env.durable.cancel(rid) is False
    thread.join(5)


def _swallow(fn: Any, *args: Any, **kwargs: Any) -> None:
    with contextlib.suppress(Exception):
        fn(*args, **kwargs)


# -- W7 --------------------------------------------------------------------------------------


def test_outcomes_faulted_unknown_and_timeout(env: Env) -> None:
    crash = {"on": True}

    @env.durable.task(name="t.raises")
    def raises() -> None:
        raise ValueError("bad input")

    @env.durable.task(name="t.stuck")
    def stuck() -> None:
        if crash["on"]:
            raise Crash()

    rid = new_id()
    with pytest.raises(ValueError):
        env.run(raises, run_id=rid)
    assert env.durable.outcome(rid, 1) == Faulted("bad input", "ValueError", None)
    with pytest.raises(RunFaulted) as info:
        env.durable.result(rid, 1)
    assert info.value.error_type == "ValueError"
    with pytest.raises(LookupError):
        env.durable.outcome(new_id(), 0.1)
    stuck_id = new_id()
    with pytest.raises(Crash):
        env.run(stuck, run_id=stuck_id)
    with pytest.raises(TimeoutError):
        env.durable.result(stuck_id, 0.1)


# -- W8 --------------------------------------------------------------------------------------


def test_two_deliveries_at_once_execute_once(env: Env) -> None:
    calls: list[int] = []
    inside = threading.Event()

    @env.durable.step
    def slow() -> int:
        calls.append(1)
        inside.set()
        time.sleep(0.5)
        return 7

    @env.durable.task(name="t.once")
    def once() -> int:
        return slow()

    rid = new_id()
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(env.run(once, run_id=rid)))
    first.start()
    assert inside.wait(10)
    results.append(env.run(once, run_id=rid))  # the second delivery: the run is claimed
    first.join(10)
    assert calls == [1]
    assert sorted(results, key=str) == [7, None]
    assert env.durable.result(rid, 1) == 7


# -- messages --------------------------------------------------------------------------------


def test_scheduled_run_travels_as_json(env: Env) -> None:
    @env.durable.task(name="t.scheduled")
    def scheduled(run: ScheduledRun) -> list[Any]:
        assert isinstance(run, ScheduledRun)
        return [run.schedule, run.due.isoformat(), run.input]

    due = datetime(2026, 11, 16, 1, 0, tzinfo=timezone.utc)
    args, kwargs, headers = scheduled_message(ScheduledRun("nightly", due, {"dir": "/srv"}))
    assert headers == {}
    result = scheduled.apply(args, kwargs, task_id="nightly@2026-11-16T01:00:00.0000000Z").get()
    assert result == ["nightly", due.isoformat(), {"dir": "/srv"}]


def test_task_options_pass_through_and_durable_defaults(env: Env) -> None:
    @env.durable.task(name="t.routed", rate_limit="10/s", time_limit=30, max_retries=7)
    def routed() -> None:
        return None

    assert routed.rate_limit == "10/s" and routed.time_limit == 30 and routed.max_retries == 7
    assert routed.acks_late is True and routed.reject_on_worker_lost is True
    assert isinstance(routed, env.app.Task)


def test_stale_runs_for_the_dispatcher(env: Env) -> None:
    crash = {"on": True}

    @env.durable.task(name="t.dies")
    def dies(x: int) -> int:
        if crash["on"]:
            raise Crash()
        return x

    rid = new_id()
    with pytest.raises(Crash):
        env.run(dies, 5, run_id=rid)
    assert env.durable.runs.stale(env.clock()) == []
    later = env.clock() + timedelta(seconds=env.durable.config.run_lease + 1)
    [resend] = env.durable.runs.stale(later)
    assert (resend.run_id, resend.task, resend.args, resend.kwargs) == (rid, "t.dies", [5], {})
    env.durable.runs.record_sent("other", "t.dies", [1], {}, now=env.clock(), lease=10)
    soon = env.clock() + timedelta(seconds=11)
    assert [r.run_id for r in env.durable.runs.stale(soon)] == ["other"]


def test_arguments_must_be_json(env: Env) -> None:
    @env.durable.task(name="t.args")
    def args_task(x: Any) -> Any:
        return x

    with pytest.raises(DurableError, match="JSON"):
        args_task.apply(((1, 2),), task_id=new_id()).get()


def test_owner_liveness_and_short_sleep_limit() -> None:
    import os
    import socket
    import subprocess
    import sys

    from celery_durable.worker.claim import short_sleep_limit
    from celery_durable.worker.owners import owner_alive

    host = socket.gethostname()
    assert owner_alive(f"{host}:{os.getpid()}:abc")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert not owner_alive(f"{host}:{dead.pid}:abc")
    assert owner_alive(f"elsewhere-{host}:{dead.pid}:abc")
    app = Celery("limits", broker="memory://")
    assert short_sleep_limit(app) == 60.0
    app.conf.broker_transport_options = {"visibility_timeout": 10}
    assert short_sleep_limit(app) == 5.0
