"""The ``durable`` fixture's object: a real ``Durable`` with a test clock, a worker in the
test process, time skipping, crash injection and the replay check (docs/testing-your-code.md).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery import Celery

from celery_durable.core.branches import position_order
from celery_durable.core.divergence import Divergence
from celery_durable.core.ids import run_stream
from celery_durable.core.run_aggregate import fold
from celery_durable.durable import Durable
from celery_durable.runtime import Runtime
from celery_durable.testing._clock import TestClock, aware_utc
from celery_durable.testing._seam import BrokerSeam
from celery_durable.worker.context import DeliveryKilled

__all__ = ["CrashPlan", "DurableHarness", "StepRecord", "assert_replays"]

MAX_EVENTS = 100_000
"""Stops in one ``advance``: more means something asks for attention endlessly."""


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One position of a durable run as its journal holds it."""

    position: int | str
    """``3``, or ``"3.1.0"`` inside a parallel branch (S4)."""
    name: str
    kind: str
    status: str
    result: Any
    attempts: int


class CrashPlan:
    """A simulated worker crash right after a step's result is stored (W1, D8).

    Armed by :meth:`DurableHarness.crash_after_step`; used as a context manager it is disarmed
    on leaving, and leaving raises ``AssertionError`` when the crash never happened.
    """

    def __init__(self, harness: DurableHarness, step: str | int, run_id: str | None, times: int):
        self._harness = harness
        self.step = step
        self.run_id = run_id
        self.left = times
        self.crashed: list[tuple[str, int | str, str]] = []
        """``(run ID, position, step name)`` of every crash it caused."""

    def matches(self, run_id: str, position: int | str, name: str) -> bool:
        target = self.step
        hit = position == target if isinstance(target, int) else name == target
        return hit and self.left > 0 and self.run_id in (None, run_id)

    def disarm(self) -> None:
        self._harness._plans = [p for p in self._harness._plans if p is not self]

    def __enter__(self) -> CrashPlan:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.disarm()
        if exc_type is None and not self.crashed:
            raise AssertionError(
                f"crash_after_step({self.step!r}) never crashed a delivery: no durable run "
                "stored a step with that name or position inside the block"
            )


class DurableHarness:
    """The ``durable`` fixture: a real ``Durable`` plus a test clock, a worker and time skipping.

    Attributes not defined here (``schedules``, ``task``, ``step``, ``signal``, ``cancel``,
    ``runs``, ``run_ended`` …) are the wrapped :class:`~celery_durable.Durable`'s;
    ``harness.durable`` is the ``Durable`` itself. ``outcome`` and ``result`` look once by
    default instead of waiting.
    """

    def __init__(self, app: Celery, url: str, *, clock: TestClock | None = None) -> None:
        self.app = app
        self.clock = clock or TestClock()
        self._stack = ExitStack()
        runtime = Runtime.registered(app)
        if runtime is not None:
            # A project's app: its tasks hold its runtime, so that runtime is pointed at the
            # test's journal and clock for the test, and restored afterwards.
            self.durable = Durable.for_app(app)
            self._stack.callback(runtime.rebind(url, self.clock))
        else:
            self.durable = Durable(app, url, clock=self.clock)
        self._stack.callback(self.durable.close)
        self._lock = threading.Lock()
        self.seam = BrokerSeam(app, self.clock)
        self._calls: Counter[tuple[str, str]] = Counter()
        self._plans: list[CrashPlan] = []
        self._dispatcher: Any = None
        self._known: set[str] = set()
        self.worker: Any = None

    # -- set-up -------------------------------------------------------------------------------

    def start(self, worker: Any = None) -> DurableHarness:
        """Intercept sends, watch the worker, and start one (unless ``worker`` is given)."""
        self.seam.install(self._stack)
        runtime = self.durable.runtime
        runtime.step_hooks.append(self._on_step)
        self._stack.callback(runtime.step_hooks.remove, self._on_step)
        self._purge()
        self.worker = worker
        self._stack.callback(self._close_dispatcher)
        return self

    def _worker_ready(self) -> None:
        """Start the worker at first need, so that it knows the tasks the test defined; tell
        a running one about tasks registered since."""
        if self.worker is None:
            # Celery's shared test task celery.ping, which wakes the worker to stop it.
            import celery.contrib.testing.tasks  # noqa: F401
            from celery.contrib.testing.worker import start_worker

            with self.app.connection_for_write() as conn:
                in_memory = conn.as_uri().startswith("memory://")
            if in_memory:
                # kombu polls an in-memory queue once a second by default: a test would wait.
                saved = self.app.conf.broker_transport_options
                options = dict(saved or {})
                options.setdefault("polling_interval", 0.005)
                self.app.conf.broker_transport_options = options
                self._stack.callback(setattr, self.app.conf, "broker_transport_options", saved)

            self.worker = self._stack.enter_context(
                start_worker(self.app, pool="solo", perform_ping_check=False, loglevel="WARNING")
            )
            self._stack.callback(self._wake_to_stop)
            self._known = set(self.app.tasks)
        elif set(self.app.tasks) != self._known:
            consumer = getattr(self.worker, "consumer", None)
            if consumer is not None:
                consumer.update_strategies()
            self._known = set(self.app.tasks)

    def close(self) -> None:
        """Stop the worker and the dispatcher, restore the app, close the journal."""
        self._stack.close()

    def __enter__(self) -> DurableHarness:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.durable, name)

    def _wake_to_stop(self) -> None:
        """Let the worker see the stop at once: it looks between two messages (or after two
        seconds of none) and then waits for one more, so ask it to terminate and send it two
        pings (``celery.ping`` of Celery's test app; without it the stop takes ~4 s)."""
        from celery.worker import state

        if "celery.ping" not in self.app.tasks:
            return
        state.should_terminate = 0
        for _ in range(2):
            self.app.tasks["celery.ping"].apply_async(ignore_result=True)

    def _purge(self) -> None:
        # In-memory brokers live as long as the process: drop what earlier tests left.
        with self.app.connection_for_write() as conn:
            for queue in self.app.amqp.queues.values():
                queue.bind(conn.default_channel).purge()

    def _close_dispatcher(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.close()

    # -- the broker seam -------------------------------------------------------------------------

    # -- outcomes -----------------------------------------------------------------------------

    def outcome(self, run_id: str, timeout: float | None = 0) -> Any:
        """The run's outcome, as ``Durable.outcome``, but looking once by default: in a test
        the clock moves only by ``advance``, so waiting would only hang."""
        try:
            return self.durable.outcome(run_id, timeout)
        except TimeoutError:
            raise TimeoutError(
                f"run {run_id!r} has not ended at {self.clock().isoformat()} (test clock); "
                "run durable.run_until_idle(), or advance the clock, to let it go on"
            ) from None

    def result(self, run_id: str, timeout: float | None = 0) -> Any:
        """The run's value, as ``Durable.result`` (``RunFaulted``, ``RunCancelled``), looking
        once by default (see :meth:`outcome`)."""
        from celery_durable.core.outcomes import raise_for

        return raise_for(run_id, self.outcome(run_id, timeout))

    # -- steps --------------------------------------------------------------------------------

    def _on_step(self, moment: str, run_id: str, position: int | str, name: str) -> None:
        if moment == "call":
            with self._lock:
                self._calls[(run_id, name)] += 1
            return
        for plan in list(self._plans):
            if plan.matches(run_id, position, name):
                plan.left -= 1
                plan.crashed.append((run_id, position, name))
                if plan.left <= 0:
                    plan.disarm()
                raise DeliveryKilled(f"simulated crash after step {name!r} of run {run_id!r}")

    def crash_after_step(
        self, step: str | int, *, run_id: str | None = None, times: int = 1
    ) -> CrashPlan:
        """Kill the delivery that stores step ``step`` (a name or a position) right after it is
        stored, as a worker crash would: nothing more is stored and the claim stays until the
        run lease (``durable_run_lease``, 5 min) passes; the dispatcher then sends the run
        again (D8) — ``advance`` past the lease resumes it. ``times``: how many deliveries to
        kill. Usable as a context manager (disarmed on leaving, which fails if no crash
        happened)."""
        if not isinstance(step, str | int) or isinstance(step, bool):
            raise TypeError(f"step must be a step name or a position, not {step!r}")
        if isinstance(times, bool) or not isinstance(times, int) or times < 1:
            raise ValueError(f"times must be a whole number of deliveries, at least 1: {times!r}")
        plan = CrashPlan(self, step, run_id, times)
        self._plans.append(plan)
        return plan

    def steps_of(self, run_id: str) -> list[StepRecord]:
        """The positions of a run as stored, in order (``LookupError`` for an unknown run)."""
        state = fold(self.durable.journal.read_stream(run_stream(run_id)))
        if not state.started:
            raise LookupError(f"no durable run {run_id!r} in the journal")
        return [
            StepRecord(pos, p.name, p.kind, p.status, p.result, p.attempts)
            for pos, p in sorted(state.positions.items(), key=lambda item: position_order(item[0]))
        ]

    def step_calls(self, run_id: str | None = None) -> Counter[str]:
        """How often each step's function was called in this test (all attempts and re-runs),
        by step name; for one run, or all runs."""
        with self._lock:
            found: Counter[str] = Counter()
            for (rid, name), count in self._calls.items():
                if run_id is None or rid == run_id:
                    found[name] += count
            return found

    # -- time -----------------------------------------------------------------------------------

    def now(self) -> datetime:
        """The test clock's time (aware UTC)."""
        return self.clock()

    def dispatcher(self, **options: Any) -> Any:
        """The test's dispatcher (one per test; ticked by :meth:`advance`)."""
        if options:
            return self.durable.dispatcher(**options)
        if self._dispatcher is None:
            self._dispatcher = self.durable.dispatcher(owner=f"test-{uuid.uuid4().hex[:8]}")
        return self._dispatcher

    def tick(self) -> None:
        """One dispatcher tick at the clock's time: decide and send what is due (no waiting)."""
        dispatcher = self.dispatcher()
        dispatcher.resender.check_soon()
        dispatcher.tick()

    def run_until_idle(self, timeout: float = 30.0) -> None:
        """Without moving the clock: tick, release held messages that are due, and wait until
        the worker has run every message sent, until nothing new is sent.

        ``TimeoutError`` (naming the task ids) when messages are still unfinished after
        ``timeout`` seconds of wall time: a task that hangs, or a queue no worker consumes.
        """
        self._worker_ready()
        deadline = time.monotonic() + timeout
        while True:
            before = self.seam.sent
            self.seam.release_due()
            self.tick()
            self.seam.release_due()
            self.seam.wait_idle(deadline, timeout)
            if self.seam.sent == before:
                return

    def advance(
        self, by: timedelta | None = None, *, until: datetime | None = None, **units: float
    ) -> None:
        """Move the clock forward — ``advance(timedelta(days=7))``, ``advance(hours=1)`` or
        ``advance(until=moment)`` — stopping at every due time, wake-up, retry and countdown
        on the way, each handled on time, as a dispatcher and worker running all along would.
        """
        target = self._target(by, until, units)
        self.run_until_idle()
        for _ in range(MAX_EVENTS):
            following = self._next_event()
            if following is None or following > target:
                break
            self.clock.set(max(following, self.clock()))
            self.run_until_idle()
        else:
            raise RuntimeError(
                f"advance stopped after {MAX_EVENTS} stops before {target}: something asks "
                "for attention endlessly (a schedule whose task is not registered, D4?)"
            )
        self.clock.set(max(target, self.clock()))
        self.run_until_idle()

    def downtime(
        self, by: timedelta | None = None, *, until: datetime | None = None, **units: float
    ) -> None:
        """Move the clock forward with nothing running (no dispatcher, no worker), then
        resume: what became due meanwhile is caught up by each schedule's policy (C1–C3)."""
        target = self._target(by, until, units)
        self.clock.set(target)
        self.run_until_idle()

    def _target(
        self, by: timedelta | None, until: datetime | None, units: dict[str, float]
    ) -> datetime:
        given = [x for x in (by, until, units or None) if x is not None]
        if len(given) != 1:
            raise TypeError("give one of: a timedelta, until=datetime, or units (days=…)")
        now = self.clock()
        if until is not None:
            target = aware_utc(until, "until")
        else:
            step = by if by is not None else timedelta(**units)
            if not isinstance(step, timedelta):
                raise TypeError(f"advance takes a timedelta, not {type(step).__name__}")
            target = now + step
        if target < now:
            raise ValueError(f"the test clock cannot go back from {now} to {target}")
        return target

    def _next_event(self) -> datetime | None:
        dispatcher = self.dispatcher()
        moments = [self.seam.next_due(), dispatcher.next_attention, self.durable.runs.next_resend()]
        found = [m for m in moments if m is not None]
        return min(found) if found else None

    # -- replay check ---------------------------------------------------------------------------

    def replay_check(self, **select: Any) -> list[Divergence]:
        """Replay the stored runs (ended, and still going: W14) against the current code (W6);
        see :func:`celery_durable.worker.replay.check_runs` for ``select``."""
        from celery_durable.worker.replay import check_runs

        return check_runs(self.durable.runtime, **select)


def assert_replays(durable: Any, **select: Any) -> None:
    """Fail with every divergence when stored runs would take another path now (W6, W14).

    ``durable``: the fixture or a ``Durable``; ``select`` as for the replay check.
    """
    from celery_durable.worker.replay import check_runs

    runtime = durable.durable.runtime if isinstance(durable, DurableHarness) else durable.runtime
    found = check_runs(runtime, **select)
    if found:
        lines = "\n".join(f"  {d}" for d in found)
        raise AssertionError(f"{len(found)} run(s) would now take another path:\n{lines}")
