"""The fault hook: one injected function the dispatcher and retention call at named points.

Crash tests set ``CELERY_DURABLE_TEST_CRASH`` in a child process (tests/e2e/test_beat_e2e.py,
tests/e2e/test_retention_crash.py); here the hook itself is checked: the runtime builds it from
that variable, it kills only at its own point, and each point is reached where it is named.
"""

from __future__ import annotations

import signal
import subprocess
import textwrap
from datetime import timedelta

import pytest
from celery import Celery

from celery_durable import Durable, Every
from celery_durable.runtime import CRASH_VARIABLE, Runtime
from tests.support.clock import FakeClock
from tests.support.processes import child_env, python_command


def test_the_hook_kills_at_its_own_point_only() -> None:
    script = textwrap.dedent(
        """
        from celery import Celery
        from celery_durable.runtime import Runtime
        runtime = Runtime(Celery(set_as_current=False))
        runtime.fault("prune-batch")
        print("alive", flush=True)
        runtime.fault("after-decide")
        print("not reached", flush=True)
        """
    )
    done = subprocess.run(
        python_command("-c", script),
        env=child_env() | {CRASH_VARIABLE: "after-decide"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (-signal.SIGKILL, "alive\n"), done.stderr


def test_the_dispatcher_and_retention_call_the_hook_at_their_points(
    redis_url: str, sqlite_url: str, clock: FakeClock
) -> None:
    app = Celery("fault_points", broker=redis_url, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = False

    @app.task(name="tick", shared=False)
    def tick() -> None:  # pragma: no cover - nothing consumes the queue
        return None

    durable = Durable(app, sqlite_url, clock=clock)
    points: list[str] = []
    durable.runtime.fault = points.append
    try:
        durable.schedules.create("s", "tick", None, Every(timedelta(minutes=1)))
        dispatcher = durable.dispatcher()
        for _ in range(5):
            clock.advance(minutes=1)
            dispatcher.tick()
        assert points.count("after-decide") == 5
        dispatcher.close()
        clock.advance(days=1)
        durable.prune(timedelta(hours=1))
        assert "prune-batch" in points  # (prune-runs: only where durable run rows are kept)
    finally:
        durable.close()


def test_a_runtime_takes_its_hook_as_an_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Runtime(fault=...)``: the hook given wins over the variable (which would kill here)."""
    monkeypatch.setenv(CRASH_VARIABLE, "after-decide")
    points: list[str] = []
    runtime = Runtime(Celery(set_as_current=False), fault=points.append)
    runtime.fault("after-decide")
    assert points == ["after-decide"]
    with pytest.raises(TypeError, match="fault"):
        Runtime(Celery(set_as_current=False), fault="after-decide")  # type: ignore[arg-type]
