"""Child runs in-process (W10-W13) with the durable test harness on a real journal.

The harness's worker runs parents and children in this process; sends go through the broker
seam, so a parent that gives its worker back is only run again when something sends it: the
child's worker (on the child's end) or the dispatcher (the parent's row, one lease later).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_durable import ChildHandle, Durable, DurableError, StepFailed, UnknownTask
from celery_durable.core.ids import run_stream
from celery_durable.testing import DurableHarness, TestClock
from tests.support.clock import T0

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def sqlite_durable(celery_app: Celery, sqlite_url: str) -> Iterator[DurableHarness]:
    with DurableHarness(celery_app, sqlite_url, clock=TestClock(T0)) as harness:
        harness.start()
        yield harness


def events_of(durable: DurableHarness, run_id: str) -> list[str]:
    return [e.type for e in durable.journal.read_stream(run_stream(run_id))]


def run_ids_started(durable: DurableHarness) -> Counter[str]:
    """How often each run's ``RunStarted`` is stored (a second copy of a run would show)."""
    found: Counter[str] = Counter()
    for row in durable.runs.list():
        found[row["run_id"]] += events_of(durable, row["run_id"]).count("RunStarted")
    return found


def parent_of_one_child(
    durable: DurableHarness, prefix: str, bodies: Counter[str] | None = None
) -> Any:
    """Durable tasks ``<prefix>.parent``, which returns the result of one child run, and
    ``<prefix>.child``, which returns ``"done"`` (counted in ``bodies``); the parent task."""

    @durable.task(name=f"{prefix}.child")
    def child_task() -> str:
        if bodies is not None:
            bodies["child"] += 1
        return "done"

    @durable.task(name=f"{prefix}.parent")
    def parent() -> str:
        return str(durable.child(child_task))

    return parent


# -- W10 ---------------------------------------------------------------------------------------


def test_a_child_runs_with_its_run_id_and_the_parent_gets_its_result(
    durable: DurableHarness,
) -> None:
    calls: Counter[str] = Counter()

    @durable.step(name="double")
    def double(x: int) -> int:
        calls["double"] += 1
        return x * 2

    @durable.task(name="kids.child")
    def child_task(x: int) -> int:
        return double(x)

    @durable.task(name="kids.parent")
    def parent(x: int) -> list[Any]:
        first = durable.child(child_task, x)
        second = durable.child("kids.child", first)
        return [first, second]

    parent.apply_async((5,), task_id="p1")
    durable.run_until_idle()
    assert durable.result("p1") == [10, 20]
    assert durable.result("p1:0") == 10 and durable.result("p1:1") == 20
    assert calls["double"] == 2
    # The parent gave its worker back while each child ran, and was sent again by the child.
    assert events_of(durable, "p1").count("RunSuspended") >= 1
    assert durable.children("p1") == [("p1:0", "finished"), ("p1:1", "finished")]
    assert durable.children("p1:0") == []


def test_the_parent_resumes_without_the_childs_wake_up_one_lease_later(
    sqlite_durable: DurableHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    durable = sqlite_durable
    # body first: imported after the patch of children, it would copy the patched function
    # and keep it when the patches are undone (every later test's child then wakes nothing).
    from celery_durable.worker import body, children

    monkeypatch.setattr(children, "wake_parent", lambda run: None)
    monkeypatch.setattr(body, "wake_parent", lambda run: None)

    parent_of_one_child(durable, "kids.lost").apply_async(task_id="lost")
    durable.run_until_idle()
    assert durable.run_ended("lost:0") == "finished"
    assert durable.run_ended("lost") is None
    durable.advance(timedelta(seconds=durable.config.run_lease + 1))
    assert durable.result("lost") == "done"


def test_a_faulted_child_fails_the_parents_step_with_kind_child(durable: DurableHarness) -> None:
    @durable.task(name="kids.bad")
    def bad() -> None:
        raise KeyError("no such row")

    @durable.task(name="kids.bad.parent")
    def parent() -> dict[str, Any]:
        try:
            durable.child(bad)
        except StepFailed as exc:
            return {"kind": exc.kind, "type": exc.error_type, "message": exc.error_message}
        return {}

    parent.apply_async(task_id="pf")
    durable.run_until_idle()
    seen = durable.result("pf")
    assert seen["kind"] == "child"
    assert seen["type"] == "KeyError"
    assert "pf:0" in seen["message"] and "no such row" in seen["message"]


def test_a_restart_in_the_middle_of_a_start_reaches_the_same_child(
    sqlite_durable: DurableHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start is stored, then the worker dies before the child's message leaves: the
    parent's next delivery starts nothing again, the dispatcher sends the child (D8)."""
    durable = sqlite_durable
    from celery_durable.worker import children
    from celery_durable.worker.context import DeliveryKilled

    bodies: Counter[str] = Counter()

    def killed(runtime: Any, sends: Any) -> None:
        raise DeliveryKilled("killed after the start was stored")

    monkeypatch.setattr(children, "_send", killed)

    @durable.task(name="kids.mid.child")
    def child_task() -> int:
        bodies["child"] += 1
        return 7

    @durable.task(name="kids.mid.parent")
    def parent() -> int:
        return int(durable.child(child_task))

    parent.apply_async(task_id="mid")
    durable.run_until_idle()
    assert "ChildStarted" in events_of(durable, "mid")
    assert durable.run_ended("mid:0") is None
    monkeypatch.undo()
    durable.advance(timedelta(seconds=durable.config.run_lease + 1))
    assert durable.result("mid") == 7
    assert bodies["child"] == 1
    assert events_of(durable, "mid").count("ChildStarted") == 1
    assert run_ids_started(durable)["mid:0"] == 1


def test_start_child_and_wait_child_and_a_detached_child_outlives_its_parent(
    durable: DurableHarness,
) -> None:
    @durable.task(name="kids.slow")
    def slow(n: int) -> int:
        durable_sleep(timedelta(hours=1))
        return n

    from celery_durable import sleep as durable_sleep

    @durable.task(name="kids.detach.parent")
    def parent() -> int:
        waited = durable.start_child(slow, 1)
        durable.start_child(slow, 2)  # never waited for
        assert isinstance(waited, ChildHandle)
        return int(durable.wait_child(waited))

    parent.apply_async(task_id="dp")
    durable.run_until_idle()
    durable.advance(timedelta(hours=1, seconds=1))
    assert durable.result("dp") == 1
    assert durable.result("dp:1") == 2
    assert durable.children("dp") == [("dp:0", "finished"), ("dp:1", "finished")]


# -- W12 ----------------------------------------------------------------------------------------


def test_cancelling_a_parent_cancels_the_children_it_waits_for_not_detached_ones(
    durable: DurableHarness,
) -> None:
    from celery_durable import sleep as durable_sleep

    @durable.task(name="kids.nap")
    def nap(_: Any = None) -> str:
        durable_sleep(timedelta(days=1))
        return "woke"

    @durable.task(name="kids.cancel.parent")
    def parent() -> str:
        durable.start_child(nap)  # detached
        try:
            durable.map_children(nap, [None, None, None], at_most=2)
        except StepFailed as exc:
            return exc.kind
        return "not cancelled"

    parent.apply_async(task_id="cp")
    durable.run_until_idle()
    assert [rid for rid, _ in durable.children("cp")] == ["cp:0", "cp:1.0", "cp:1.1"]
    assert durable.cancel("cp")
    durable.run_until_idle()
    # The parent's body saw the cancellation at its step, and returned (W7).
    assert durable.result("cp") == "cancelled"
    assert durable.run_ended("cp:1.0") == "cancelled"
    assert durable.run_ended("cp:1.1") == "cancelled"
    assert durable.run_ended("cp:1.2") is None  # never started
    durable.advance(timedelta(days=1, seconds=1))
    assert durable.result("cp:0") == "woke"


def test_a_child_cancelled_before_it_started_never_runs_its_body(
    sqlite_durable: DurableHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    durable = sqlite_durable
    from celery_durable.worker import children

    held: list[Any] = []
    monkeypatch.setattr(children, "_send", lambda runtime, sends: held.extend(sends))
    bodies: Counter[str] = Counter()

    @durable.task(name="kids.never")
    def never() -> None:
        bodies["never"] += 1

    @durable.task(name="kids.never.parent")
    def parent() -> None:
        durable.child(never)

    parent.apply_async(task_id="np")
    durable.run_until_idle()
    assert [r.run_id for r in held] == ["np:0"]
    assert durable.cancel("np")
    durable.run_until_idle()
    assert durable.run_ended("np") == "cancelled"
    for resend in held:  # the start's message arrives late
        resend.send(durable.app)
    durable.run_until_idle()
    assert durable.run_ended("np:0") == "cancelled"
    assert bodies["never"] == 0


def test_a_child_whose_start_is_stored_can_be_cancelled_before_a_worker_takes_it(
    durable: DurableHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's start is stored (``start_child`` returned, ``durable.children`` lists it
    ``queued``) but no worker has taken its message yet: ``durable.cancel`` of the child is
    stored (W7, W12), the child ends cancelled without running its body, and the waiting
    parent sees kind ``cancelled``. ``durable.outcome`` waits for it as for any started run
    (``TimeoutError``, not ``LookupError``)."""
    from celery_durable.worker import children

    held: list[Any] = []
    monkeypatch.setattr(children, "_send", lambda runtime, sends: held.extend(sends))
    bodies: Counter[str] = Counter()

    @durable.task(name="kids.queued")
    def queued_child() -> None:
        bodies["child"] += 1

    @durable.task(name="kids.queued.parent")
    def parent() -> str:
        try:
            durable.child(queued_child)
        except StepFailed as exc:
            return exc.kind
        return "finished"

    parent.apply_async(task_id="cq")
    durable.run_until_idle()
    assert durable.children("cq") == [("cq:0", "queued")]
    with pytest.raises(TimeoutError):
        durable.outcome("cq:0", timeout=0)
    assert durable.cancel("cq:0") is True
    assert durable.cancel("cq:0") is False  # asked already
    for resend in held:  # the start's message arrives
        resend.send(durable.app)
    durable.run_until_idle()
    assert durable.run_ended("cq:0") == "cancelled"
    assert bodies["child"] == 0
    assert durable.result("cq") == "cancelled"
    with pytest.raises(LookupError):
        durable.cancel("cq:7")  # no start stored: never started


def test_cancelling_a_child_does_not_cancel_its_parent(durable: DurableHarness) -> None:
    from celery_durable import sleep as durable_sleep

    @durable.task(name="kids.long")
    def long_child() -> None:
        durable_sleep(timedelta(days=1))

    @durable.task(name="kids.long.parent")
    def parent() -> str:
        try:
            durable.child(long_child)
        except StepFailed as exc:
            return exc.kind
        return "finished"

    parent.apply_async(task_id="lp")
    durable.run_until_idle()
    assert durable.cancel("lp:0")
    durable.run_until_idle()
    assert durable.run_ended("lp:0") == "cancelled"
    assert durable.result("lp") == "cancelled"


# -- W11 -----------------------------------------------------------------------------------------


def test_map_children_keeps_at_most_n_in_flight_and_returns_results_in_order(
    durable: DurableHarness,
) -> None:
    from celery_durable import sleep as durable_sleep

    @durable.task(name="kids.square")
    def square(x: int) -> int:
        # Later inputs end first: the results must still come back in input order.
        durable_sleep(timedelta(seconds=100 - x))
        return x * x

    @durable.task(name="kids.map.parent")
    def parent(n: int) -> list[int]:
        return list(durable.map_children(square, range(n), at_most=3))

    parent.apply_async((10,), task_id="mp")
    durable.run_until_idle()
    assert [rid for rid, _ in durable.children("mp")] == ["mp:0.0", "mp:0.1", "mp:0.2"]
    durable.advance(timedelta(seconds=1000))
    assert durable.result("mp") == [x * x for x in range(10)]
    assert len(durable.children("mp")) == 10
    # O(1) parent events per child: one ChildStarted and one ChildEnded each.
    kinds = Counter(events_of(durable, "mp"))
    assert kinds["ChildStarted"] == 10 and kinds["ChildEnded"] == 10
    assert sum(kinds.values()) <= 10 * 6 + 10


def test_a_fan_outs_parent_is_woken_once_per_batch_of_ends_not_once_per_end(
    durable: DurableHarness,
) -> None:
    """W11: children ending one at a time wake their parent once a quarter of those in flight
    have ended (and once at the end), not at each end: 40 children, 20 at a time, ending a
    second apart, take about ten deliveries of the parent instead of forty."""
    from celery_durable import sleep as durable_sleep

    @durable.task(name="kids.batch.child")
    def child(x: int) -> int:
        durable_sleep(timedelta(seconds=x + 1))
        return x

    @durable.task(name="kids.batch.parent")
    def parent(n: int) -> list[int]:
        return list(durable.map_children(child, range(n), at_most=20))

    parent.apply_async((40,), task_id="bp")
    durable.run_until_idle()
    for _ in range(80):
        durable.advance(timedelta(seconds=1))
    assert durable.result("bp") == list(range(40))
    deliveries = events_of(durable, "bp").count("RunClaimed")
    assert deliveries <= 15, f"the parent ran {deliveries} times for 40 children"
    assert max(run_ids_started(durable).values()) == 1


def test_a_childs_claim_step_and_end_are_three_statements_on_postgresql(
    celery_app: Celery, pg_url: str
) -> None:
    """W11's cost (2026-12-06): on PostgreSQL a child of a one-step task costs its worker
    three statements, each its own transaction in autocommit mode (no ``BEGIN`` or ``COMMIT``
    round trips): its claim (``RunStarted`` and ``RunClaimed`` with its row), its step's
    result, and its end (``RunFinished``, its row and its parent's countdown or wake-up).
    They were eight, in two transactions."""
    import threading

    import sqlalchemy as sa
    from celery import signals

    running: set[int] = set()
    statements: list[tuple[str, Any]] = []

    def started(task: Any = None, **_: Any) -> None:
        if getattr(task, "name", "") == "kids.cost.child":
            running.add(threading.get_ident())

    def ended(task: Any = None, **_: Any) -> None:
        running.discard(threading.get_ident())

    def executed(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if threading.get_ident() in running:
            level = conn.get_execution_options().get("isolation_level")
            statements.append((" ".join(statement.split())[:40], level))

    with DurableHarness(celery_app, pg_url, clock=TestClock(T0)) as durable:
        durable.start()

        @durable.step(name="kids.cost.double")
        def double(x: int) -> int:
            return 2 * x

        @durable.task(name="kids.cost.child")
        def child(x: int) -> int:
            return double(x)

        @durable.task(name="kids.cost.parent")
        def parent(n: int) -> list[int]:
            return list(durable.map_children(child, range(n), at_most=n))

        engine = durable.journal._core
        signals.task_prerun.connect(started, weak=False)
        signals.task_postrun.connect(ended, weak=False)
        sa.event.listen(engine, "before_cursor_execute", executed)
        try:
            parent.apply_async((4,), task_id="cost")
            durable.run_until_idle()
            assert durable.result("cost") == [0, 2, 4, 6]
        finally:
            sa.event.remove(engine, "before_cursor_execute", executed)
            signals.task_prerun.disconnect(started)
            signals.task_postrun.disconnect(ended)
    assert len(statements) == 3 * 4, statements
    assert {level for _, level in statements} == {"AUTOCOMMIT"}, statements


def test_a_child_that_fails_wakes_its_counting_parent_at_once(durable: DurableHarness) -> None:
    """W11: however many ends the parent waits for, a child that did not finish wakes it at
    once: it stops the fan-out while the others still run."""
    from celery_durable import sleep as durable_sleep

    @durable.task(name="kids.fails.child")
    def child(x: int) -> int:
        if x == 3:
            raise ValueError("three is refused")
        durable_sleep(timedelta(seconds=500))
        return x

    @durable.task(name="kids.fails.parent")
    def parent(n: int) -> list[int]:
        return list(durable.map_children(child, range(n), at_most=8))

    parent.apply_async((20,), task_id="fp")
    durable.run_until_idle()
    durable.advance(timedelta(seconds=2))
    outcome = durable.outcome("fp", timeout=0)
    assert outcome is not None and type(outcome).__name__ == "Faulted", outcome
    assert "three is refused" in str(outcome)
    assert len(durable.children("fp")) == 8  # no child started after the failure


def test_a_waiting_parents_deliveries_read_only_what_came_after_the_last_one(
    durable: DurableHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent's state is kept by the worker process when it suspends (W11): its next
    deliveries read the events after it, not the whole stream again; a value the body
    changed is not what the next delivery replays (the kept state is the stored one)."""
    from celery_durable import sleep as durable_sleep

    journal = durable.durable.runtime.journal
    reads: list[int] = []
    real_read = journal.read_stream

    def read_stream(stream: str, after_version: int = 0) -> Any:
        if stream == run_stream("kp"):
            reads.append(after_version)
        return real_read(stream, after_version)

    monkeypatch.setattr(journal, "read_stream", read_stream)

    @durable.step(name="rows")
    def rows() -> list[str]:
        return ["a"]

    @durable.task(name="kids.kept.child")
    def square(x: int) -> int:
        durable_sleep(timedelta(seconds=10 * (x + 1)))
        return x * x

    @durable.task(name="kids.kept.parent")
    def parent(n: int) -> list[Any]:
        seen = rows()
        seen.append("changed by the body")  # must not leak into the next delivery's replay
        return [seen, durable.map_children(square, range(n), at_most=2)]

    parent.apply_async((6,), task_id="kp")
    durable.run_until_idle()
    for _ in range(14):
        durable.advance(timedelta(seconds=10))
    claims = list(reads)  # (reading the result below reads the stream too)
    assert durable.result("kp") == [["a", "changed by the body"], [x * x for x in range(6)]]
    deliveries = events_of(durable, "kp").count("RunClaimed")
    assert deliveries >= 5
    # The first delivery reads the empty stream, the second the whole stream (the first left
    # no state: it had no fan-out yet when it claimed); every later one only the events after
    # the state kept.
    assert claims.count(0) <= 2, claims
    assert len([after for after in claims if after > 0]) >= deliveries - 2


def test_a_done_fan_outs_results_changed_by_the_body_are_replayed_as_stored(
    sqlite_durable: DurableHarness,
) -> None:
    """The kept state shares a finished fan-out's results (.parent_states); the body gets a
    copy, so what it changes is not what a later delivery replays (W11)."""
    durable = sqlite_durable
    from celery_durable import sleep as durable_sleep

    @durable.task(name="kids.done.child")
    def child_task(x: int) -> dict[str, int]:
        return {"x": x}

    @durable.task(name="kids.done.sleeper")
    def sleeper(x: int) -> int:
        durable_sleep(timedelta(seconds=10))
        return x

    @durable.task(name="kids.done.parent")
    def parent() -> list[Any]:
        first = durable.map_children(child_task, range(2), at_most=2)
        first[0]["seen"] = first[0].get("seen", 0) + 1
        first.append("more")
        return [first, durable.map_children(sleeper, range(4), at_most=1)]

    parent.apply_async(task_id="dn")
    durable.run_until_idle()
    for _ in range(6):
        durable.advance(timedelta(seconds=10))
    assert durable.result("dn") == [[{"x": 0, "seen": 1}, {"x": 1}, "more"], [0, 1, 2, 3]]
    assert events_of(durable, "dn").count("RunClaimed") >= 5


def test_a_fan_outs_later_deliveries_check_only_the_inputs_they_start(
    sqlite_durable: DurableHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every input is checked before the fan-out is stored; afterwards a delivery checks
    only the inputs it starts, not all of them again on each wake-up (W11)."""
    durable = sqlite_durable
    from celery_durable import sleep as durable_sleep
    from celery_durable.worker import children

    checked: Counter[str] = Counter()
    real_check = children._check_input

    def check(runtime: Any, args: Any, kwargs: Any, what: str) -> None:
        checked[what] += 1
        real_check(runtime, args, kwargs, what)

    monkeypatch.setattr(children, "_check_input", check)

    @durable.task(name="kids.checked.child")
    def child_task(x: int) -> int:
        durable_sleep(timedelta(seconds=10))
        return x

    @durable.task(name="kids.checked.parent")
    def parent() -> list[int]:
        return list(durable.map_children(child_task, range(8), at_most=2))

    parent.apply_async(task_id="ck")
    durable.run_until_idle()
    for _ in range(6):
        durable.advance(timedelta(seconds=10))
    assert durable.result("ck") == list(range(8))
    assert events_of(durable, "ck").count("RunClaimed") >= 4
    assert set(checked.values()) == {2}, checked  # once up front, once when started


def test_a_fan_outs_in_flight_children_are_kept_as_events_are_folded() -> None:
    from celery_durable.core.children import FanOut

    fan = FanOut(total=4, at_most=2)
    fan.start(0, "p:0.0")
    fan.start(1, "p:0.1")
    fan.end(0, {"state": "finished", "result": 0})
    fan.start(2, "p:0.2")
    assert fan.in_flight() == [(1, "p:0.1"), (2, "p:0.2")]
    assert fan.flying == {1: "p:0.1", 2: "p:0.2"}
    assert list(fan.to_start()) == []


def test_map_children_after_crashes_starts_no_finished_child_again(
    sqlite_durable: DurableHarness,
) -> None:
    durable = sqlite_durable
    bodies: Counter[int] = Counter()

    @durable.step(name="work")
    def work(x: int) -> int:
        bodies[x] += 1
        return x + 100

    @durable.task(name="kids.crash.child")
    def child_task(x: int) -> int:
        return work(x)

    @durable.task(name="kids.crash.parent")
    def parent() -> list[int]:
        return list(durable.map_children(child_task, range(12), at_most=4))

    with durable.crash_after_step("work", run_id="cr:0.5"):
        parent.apply_async(task_id="cr")
        durable.run_until_idle()
    durable.advance(timedelta(seconds=durable.config.run_lease + 1))
    assert durable.result("cr") == [x + 100 for x in range(12)]
    assert all(bodies[x] == 1 for x in range(12)), bodies
    assert set(run_ids_started(durable).values()) == {1}


def test_a_faulted_child_of_map_children_fails_the_step_and_starts_no_more(
    durable: DurableHarness,
) -> None:
    @durable.task(name="kids.maybe")
    def maybe(x: int) -> int:
        if x == 2:
            raise ValueError("two is bad")
        return x

    @durable.task(name="kids.maybe.parent")
    def parent() -> str:
        try:
            durable.map_children(maybe, range(50), at_most=3)
        except StepFailed as exc:
            return f"{exc.kind}: {exc.error_type}"
        return "ok"

    parent.apply_async(task_id="mf")
    durable.run_until_idle()
    assert durable.result("mf") == "child: ValueError"
    assert len(durable.children("mf")) < 50


# -- bad input (W10, W11): each a clear error, nothing stored ------------------------------------


def test_bad_input_is_refused_before_anything_is_stored(durable: DurableHarness) -> None:
    @durable.app.task(name="kids.plain")
    def plain() -> None:
        return None

    @durable.task(name="kids.ok")
    def ok(x: Any = None) -> None:
        return None

    errors: dict[str, str] = {}

    @durable.task(name="kids.bad.input")
    def parent() -> dict[str, str]:
        for label, call in {
            "plain": lambda: durable.child(plain),
            "unknown": lambda: durable.child("kids.nobody"),
            "at_most": lambda: durable.map_children(ok, [1], at_most=0),
            "json": lambda: durable.child(ok, object()),
        }.items():
            try:
                call()
            except (TypeError, ValueError, DurableError, UnknownTask) as exc:
                errors[label] = f"{type(exc).__name__}: {exc}"
        return errors

    parent.apply_async(task_id="bi")
    durable.run_until_idle()
    seen = durable.result("bi")
    assert "plain Celery task" in seen["plain"]
    assert "UnknownTask" in seen["unknown"] and "kids.nobody" in seen["unknown"]
    assert "at_most must be at least 1" in seen["at_most"]
    assert "json" in seen["json"].lower() or "JSON" in seen["json"]
    assert durable.children("bi") == []
    assert "ChildStarted" not in events_of(durable, "bi")
    with pytest.raises(DurableError, match="inside a durable task"):
        durable.child(ok)
    with pytest.raises(DurableError, match="inside a durable task"):
        durable.map_children(ok, [1], at_most=1)


def test_arguments_the_child_task_cannot_take_and_signatures_are_refused_before_storing(
    durable: DurableHarness,
) -> None:
    """A child's arguments are checked against its task as ``apply_async`` checks them, and
    a signature (whose arguments would be dropped) is refused: a ``TypeError`` at the call,
    nothing stored, no child that faults later (W10, W11)."""

    @durable.task(name="kids.one.arg")
    def one_arg(x: int) -> int:
        return x

    @durable.task(name="kids.two.args")
    def two_args(x: int, y: int) -> int:
        return x + y

    errors: dict[str, str] = {}

    @durable.task(name="kids.bad.call")
    def parent() -> Any:
        for label, call in {
            "missing": lambda: durable.child(one_arg),
            "extra": lambda: durable.start_child(one_arg, 1, 2),
            "keyword": lambda: durable.child("kids.one.arg", 1, y=2),
            "map": lambda: durable.map_children(two_args, [1, 2], at_most=2),
            "signature": lambda: durable.child(one_arg.s(1)),
            "map_signature": lambda: durable.map_children(one_arg.s(), [1], at_most=1),
        }.items():
            try:
                call()
            except TypeError as exc:
                errors[label] = str(exc)
        return [errors, durable.child(one_arg, 7)]

    parent.apply_async(task_id="bc")
    durable.run_until_idle()
    seen, value = durable.result("bc")
    assert value == 7
    assert "missing 1 required positional argument" in seen["missing"], seen
    assert "takes 1 positional argument but 2 were given" in seen["extra"], seen
    assert "unexpected keyword argument 'y'" in seen["keyword"], seen
    assert "missing 1 required positional argument: 'y'" in seen["map"], seen
    assert "child task 'kids.one.arg'" in seen["missing"], seen
    assert "each input of map_children('kids.two.args')" in seen["map"], seen
    for label in ("signature", "map_signature"):
        assert "not a signature" in seen[label], seen
    # A refused call takes no position: the child started afterwards is the body's first.
    assert durable.children("bc") == [("bc:0", "finished")]
    assert events_of(durable, "bc").count("ChildStarted") == 1
    assert "FanOutStarted" not in events_of(durable, "bc")


# -- W13 ------------------------------------------------------------------------------------------


def test_runs_show_lists_the_children_and_a_child_names_its_parent(
    celery_app: Celery, sqlite_url: str
) -> None:
    from tests.cli.test_cli import as_json, ok

    with DurableHarness(celery_app, sqlite_url, clock=TestClock(T0)) as durable:
        durable.start()

        @durable.task(name="kids.show.child")
        def show_child(x: int) -> int:
            if x == 1:
                raise RuntimeError("one fails")
            return x

        @durable.task(name="kids.show.parent")
        def parent() -> Any:
            one = durable.child(show_child, 0)
            with contextlib.suppress(StepFailed):
                durable.map_children(show_child, [0, 1, 2], at_most=3)
            return one

        parent.apply_async(task_id="sp")
        durable.run_until_idle()
        assert durable.result("sp") == 0
    text = ok(sqlite_url, "runs", "show", "sp")
    assert "Children (4: " in text
    for rid in ("sp:0", "sp:1.0", "sp:1.1", "sp:1.2"):
        assert rid in text
    assert "faulted" in text
    detail = as_json(sqlite_url, "runs", "show", "sp:1.1")
    assert detail["durable"]["parent"] == "sp"
    assert detail["durable"]["children"] == []
    assert "Parent" in ok(sqlite_url, "runs", "show", "sp:0")
    states = dict(
        (c["run_id"], c["state"])
        for c in as_json(sqlite_url, "runs", "show", "sp")["durable"]["children"]
    )
    assert states["sp:0"] == "finished" and states["sp:1.1"] == "faulted"


def test_a_queued_child_names_its_parent_and_has_no_children_yet(
    celery_app: Celery, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before a worker takes a child's message its own stream is empty: ``runs show`` still
    names the parent (from the message its parent sent), and ``durable.children`` of it is
    empty rather than "never started" (W13)."""
    from celery_durable.worker import children
    from tests.cli.test_cli import as_json, ok

    with DurableHarness(celery_app, sqlite_url, clock=TestClock(T0)) as durable:
        durable.start()
        monkeypatch.setattr(children, "_send", lambda runtime, sends: None)
        parent_of_one_child(durable, "kids.held").apply_async(task_id="qp")
        durable.run_until_idle()
        assert durable.children("qp") == [("qp:0", "queued")]
        assert durable.children("qp:0") == []
    detail = as_json(sqlite_url, "runs", "show", "qp:0")
    assert detail["durable"]["status"] == "queued"
    assert detail["durable"]["parent"] == "qp"
    assert detail["durable"]["children"] == []
    assert "Parent  qp" in ok(sqlite_url, "runs", "show", "qp:0")


# -- ordering of the journal's facts at a fan-out (W7, W11, W12) ---------------------------------


def test_cancelling_a_parent_after_its_map_children_finished_cancels_it_at_its_next_step(
    durable: DurableHarness,
) -> None:
    """The fan-out ended before the cancel: the replay returns its results, and the body
    sees the cancel at the step it is waiting in (here a sleep), not at the fan-out."""
    from celery_durable import sleep as durable_sleep

    @durable.task(name="kids.sq")
    def sq(x: int) -> int:
        return x * x

    @durable.task(name="kids.sq.parent")
    def parent() -> str:
        try:
            got = durable.map_children(sq, [1, 2, 3], at_most=2)
        except StepFailed as exc:
            return f"map_children raised {exc.kind} at position {exc.position}"
        try:
            durable_sleep(timedelta(hours=1))
        except StepFailed as exc:
            return f"{exc.kind} at position {exc.position}, results {got}"
        return "slept"

    parent.apply_async(task_id="cs")
    durable.run_until_idle()
    assert durable.run_ended("cs") is None, "the parent sleeps after its fan-out"
    assert durable.cancel("cs")
    durable.run_until_idle()
    assert durable.result("cs") == "cancelled at position 1, results [1, 4, 9]"
    failed = [
        e.data for e in durable.journal.read_stream(run_stream("cs")) if e.type == "StepFailed"
    ]
    assert [d["position"] for d in failed] == [1], "the finished fan-out is not failed"


def test_a_child_failure_recorded_before_a_crash_fails_the_fan_out_on_the_next_delivery(
    sqlite_durable: DurableHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delivery that saw a child fault dies before storing the step's failure: the next
    one raises the same failure and starts no further child."""
    durable = sqlite_durable
    from celery_durable.worker import children
    from celery_durable.worker.context import DeliveryKilled

    real_failed = children._failed
    kills = {"left": 1}

    def dies_once(*args: Any) -> Any:
        if kills["left"]:
            kills["left"] -= 1
            raise DeliveryKilled("killed before the step's failure was stored")
        return real_failed(*args)

    monkeypatch.setattr(children, "_failed", dies_once)

    @durable.task(name="kids.one_bad")
    def one_bad(x: int) -> int:
        if x == 1:
            raise ValueError("one is bad")
        return x

    @durable.task(name="kids.one_bad.parent")
    def parent() -> str:
        try:
            durable.map_children(one_bad, range(6), at_most=2)
        except StepFailed as exc:
            return f"{exc.kind}: {exc.error_type}"
        return "ok"

    parent.apply_async(task_id="fc")
    durable.run_until_idle()
    assert kills["left"] == 0 and durable.run_ended("fc") is None
    started = [rid for rid, _ in durable.children("fc")]
    durable.advance(timedelta(seconds=durable.config.run_lease + 1))
    assert durable.result("fc") == "child: ValueError"
    assert [rid for rid, _ in durable.children("fc")] == started, "no child started after"


def test_a_lost_wake_up_is_sent_by_the_childs_redelivery_without_beat(
    durable: DurableHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's worker dies after storing the child's end (which marked the parent woken)
    and before sending the parent. No dispatcher runs; the broker delivers the child's message
    again (never acknowledged), and that delivery, finding the child ended, wakes the parent."""
    from celery_durable.worker import body

    real_wake = body.wake_parent
    deaths = {"left": 1}

    def dies_before_the_send(run: Any) -> None:
        if deaths["left"]:
            deaths["left"] -= 1
            return  # (the worker is gone: the wake-up its end marked is never sent)
        real_wake(run)

    monkeypatch.setattr(body, "wake_parent", dies_before_the_send)
    bodies: Counter[str] = Counter()
    parent_of_one_child(durable, "kids.lost.wake", bodies).apply_async(task_id="lw")
    durable.run_until_idle()
    assert deaths["left"] == 0 and durable.run_ended("lw:0") == "finished"
    row = durable.runs.row("lw")
    assert row is not None and row["status"] == "suspended" and row["lease_until"] is not None
    # Another child's end within 30 s would find the mark and send nothing; the broker's
    # redelivery of the child's message is what comes.
    resend = durable.runs.resend_of("lw:0")
    assert resend is not None
    resend.send(durable.app)
    durable.run_until_idle()
    assert durable.result("lw") == "done"
    assert bodies == {"child": 1}


# -- a lost start without beat (W10) --------------------------------------------------------------


def test_a_start_lost_with_the_parents_worker_is_sent_by_the_parents_next_delivery(
    sqlite_durable: DurableHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker dies between committing the children's starts and sending them. No
    dispatcher re-sends stale runs (no beat: D8 finds nothing); the broker delivers the
    parent's message again, and that delivery sends the children no worker has claimed."""
    from celery import signals

    from celery_durable.store.runs import RunStore
    from celery_durable.worker import children
    from celery_durable.worker.context import DeliveryKilled

    durable = sqlite_durable
    monkeypatch.setattr(RunStore, "stale", lambda self, now, limit=100: [])
    real_send = children._send
    kills = {"left": 1}

    def dies_once(runtime: Any, sends: Any) -> None:
        if kills["left"]:
            kills["left"] -= 1
            raise DeliveryKilled("killed after the starts were stored, before the send")
        real_send(runtime, sends)

    monkeypatch.setattr(children, "_send", dies_once)
    published: Counter[str] = Counter()

    def count(sender: Any = None, headers: Any = None, **_: Any) -> None:
        published[str((headers or {}).get("id"))] += 1

    signals.before_task_publish.connect(count, weak=False)
    bodies: Counter[int] = Counter()

    @durable.task(name="kids.lost.start.child")
    def child_task(x: int) -> int:
        bodies[x] += 1
        return x + 1

    @durable.task(name="kids.lost.start.parent")
    def parent() -> list[int]:
        one = durable.child(child_task, 0)
        return [one, *durable.map_children(child_task, [1, 2, 3], at_most=2)]

    try:
        parent.apply_async(task_id="ls")
        durable.run_until_idle()
        assert kills["left"] == 0, "the worker died between the commit and the send"
        assert durable.children("ls") == [("ls:0", "queued")]
        # The lease of the dead delivery passes (the clock alone: D8 would find the child's
        # row stale now, but no dispatcher re-sends anything here).
        durable.clock.set(durable.now() + timedelta(seconds=durable.config.run_lease + 1))
        durable.run_until_idle()
        assert durable.run_ended("ls:0") is None, "nothing sends the child by itself"
        # The broker delivers the parent's message again (acks_late, the worker died).
        resend = durable.runs.resend_of("ls")
        assert resend is not None
        resend.send(durable.app)
        durable.run_until_idle()
        assert durable.result("ls") == [1, 2, 3, 4]
    finally:
        signals.before_task_publish.disconnect(count)
    assert bodies == {0: 1, 1: 1, 2: 1, 3: 1}
    assert published["ls:0"] == 1, "sent once, by the parent's next delivery"
    assert all(published[f"ls:1.{i}"] == 1 for i in range(3)), "no other child sent twice"
    assert set(run_ids_started(durable).values()) == {1}


# -- more bad input (W10): refused before anything is stored --------------------------------------


def test_child_runs_are_refused_in_branches_and_handles_are_checked(
    durable: DurableHarness,
) -> None:
    from celery_durable import parallel

    @durable.task(name="kids.leaf")
    def leaf() -> str:
        return "leaf"

    @durable.task(name="kids.other.parent")
    def other() -> Any:
        return durable.start_child(leaf).run_id

    errors: dict[str, str] = {}

    @durable.task(name="kids.branch.parent")
    def parent(foreign: str) -> dict[str, str]:
        for label, call in {
            "child": lambda: parallel(lambda: durable.child(leaf), lambda: 1),
            "start_child": lambda: parallel(lambda: durable.start_child(leaf)),
            "map_children": lambda: parallel(lambda: durable.map_children(leaf, [], at_most=1)),
            "foreign": lambda: durable.wait_child(ChildHandle(foreign)),
            "not_a_handle": lambda: durable.wait_child("x:0"),  # type: ignore[arg-type]
            "unstarted": lambda: durable.wait_child(ChildHandle("kb:7")),
        }.items():
            try:
                call()
            except (TypeError, DurableError) as exc:
                errors[label] = f"{type(exc).__name__}: {exc}"
        return errors

    other.apply_async(task_id="ko")
    durable.run_until_idle()
    foreign = durable.result("ko")
    parent.apply_async((foreign,), task_id="kb")
    durable.run_until_idle()
    seen = durable.result("kb")
    for what in ("child", "start_child", "map_children"):
        assert "cannot be called inside a parallel branch of run 'kb'" in seen[what], seen[what]
    assert "'ko:0' is not a child started by run 'kb'" in seen["foreign"]
    assert seen["not_a_handle"] == "TypeError: wait_child() takes a ChildHandle, not str"
    assert "'kb:7' is not a child started by run 'kb'" in seen["unstarted"]
    assert durable.children("kb") == []
    assert not {"ChildStarted", "FanOutStarted"} & set(events_of(durable, "kb"))
    # Outside a durable run.
    with pytest.raises(DurableError, match=r"start_child\(\) can only be called inside"):
        durable.start_child(leaf)
    with pytest.raises(DurableError, match=r"wait_child\(\) can only be called inside"):
        durable.wait_child(ChildHandle("ko:0"))


@pytest.mark.parametrize("journal", ["sqlite", "postgres"])
def test_oversized_keyword_arguments_and_too_long_child_run_ids_are_refused(
    celery_app: Celery, journal: str, request: pytest.FixtureRequest
) -> None:
    """The longest child run ID that fits is stored (PostgreSQL checks the column's length);
    one character more is refused before anything is stored."""
    url = request.getfixturevalue({"sqlite": "sqlite_url", "postgres": "pg_url"}[journal])
    celery_app.conf.durable_max_input_bytes = 1000
    with DurableHarness(celery_app, url, clock=TestClock(T0)) as durable:
        durable.start()

        @durable.task(name="kids.kw")
        def kw(x: Any = None, **kwargs: Any) -> int:
            return len(kwargs)

        @durable.task(name="kids.kw.parent")
        def parent(which: str) -> Any:
            if which == "kwargs":
                return durable.child(kw, blob="x" * 2000)
            if which == "map":
                return durable.map_children(kw, range(3), at_most=1)
            return durable.child(kw)

        parent.apply_async(("kwargs",), task_id="kk")
        long_id = "p" * 249
        parent.apply_async(("child",), task_id=long_id)  # + ":0": 251 characters, fits
        longer = "q" * 250
        parent.apply_async(("child",), task_id=longer)  # + ":0": 252 characters
        parent.apply_async(("map",), task_id="m" * 247)  # + ":0.2": 251, fits
        parent.apply_async(("map",), task_id="n" * 248)  # + ":0.2": 252
        durable.run_until_idle()
        kwargs_error = durable.outcome("kk")
        assert "the keyword arguments of child task 'kids.kw'" in kwargs_error.error
        assert "1000" in kwargs_error.error
        assert durable.result(long_id) == 0
        assert durable.result("m" * 247) == [0, 0, 0]
        for rid in (longer, "n" * 248):
            error = durable.outcome(rid).error
            assert "would have 252 characters; a run ID has at most 251" in error, error
            assert durable.children(rid) == []
            assert not {"ChildStarted", "FanOutStarted"} & set(events_of(durable, rid))
        assert "ChildStarted" not in events_of(durable, "kk")


def test_cancelling_a_parent_waiting_in_one_child_cancels_that_child(
    durable: DurableHarness,
) -> None:
    from celery_durable import sleep as durable_sleep

    @durable.task(name="kids.slow.one")
    def slow_one() -> str:
        durable_sleep(timedelta(days=1))
        return "woke"

    @durable.task(name="kids.slow.one.parent")
    def parent() -> str:
        try:
            return str(durable.child(slow_one))
        except StepFailed as exc:
            return f"{exc.kind} at position {exc.position}"

    parent.apply_async(task_id="c1")
    durable.run_until_idle()
    assert durable.children("c1") == [("c1:0", "suspended")]
    assert durable.cancel("c1")
    durable.run_until_idle()
    assert durable.result("c1") == "cancelled at position 0"
    assert durable.run_ended("c1:0") == "cancelled"


# -- W13 on a run with branches -----------------------------------------------------------------


def test_children_and_runs_show_of_a_run_with_a_parallel_and_children(
    celery_app: Celery, sqlite_url: str
) -> None:
    """Positions of such a run are ints and dotted strs: they sort by position order."""
    from celery_durable import parallel
    from tests.cli.test_cli import as_json, ok

    with DurableHarness(celery_app, sqlite_url, clock=TestClock(T0)) as durable:
        durable.start()

        @durable.step(name="s")
        def s(x: int) -> int:
            return x

        @durable.task(name="kids.mixed.child")
        def mixed_child(x: int) -> int:
            return s(x)

        @durable.task(name="kids.mixed.parent")
        def parent() -> Any:
            first = durable.child(mixed_child, 1)
            both = parallel(lambda: s(2), lambda: s(3))
            return [first, both, s(4), durable.map_children(mixed_child, [5, 6], at_most=2)]

        parent.apply_async(task_id="mx")
        durable.run_until_idle()
        assert durable.result("mx") == [1, [2, 3], 4, [5, 6]]
        assert durable.children("mx") == [
            ("mx:0", "finished"),
            ("mx:3.0", "finished"),
            ("mx:3.1", "finished"),
        ]
    text = ok(sqlite_url, "runs", "show", "mx")
    assert "Children (3: " in text and "mx:3.1" in text
    shown = as_json(sqlite_url, "runs", "show", "mx")["durable"]
    assert [c["run_id"] for c in shown["children"]] == ["mx:0", "mx:3.0", "mx:3.1"]
    assert [step["position"] for step in shown["steps"]] == [0, 1, "1.0.0", "1.1.0", 2, 3]


def test_the_replay_check_of_a_waiting_parent_cancels_and_sends_nothing(
    sqlite_durable: DurableHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parent whose delivery died after recording a child's failure (before cancelling the
    other children and storing the step's failure) cancels them on its next delivery; the
    replay check (W14) replays it without doing so, and without sending anything."""
    from celery_durable import sleep as durable_sleep
    from celery_durable.worker import children
    from celery_durable.worker.context import DeliveryKilled
    from celery_durable.worker.replay import check_runs

    durable = sqlite_durable
    real_cancel = children.cancel_children
    kills = {"left": 1}

    def dies_once(*args: Any) -> Any:
        if kills["left"]:
            kills["left"] -= 1
            raise DeliveryKilled("killed before the other children were cancelled")
        return real_cancel(*args)

    monkeypatch.setattr(children, "cancel_children", dies_once)

    @durable.task(name="kids.slow_or_bad")
    def slow_or_bad(x: int) -> int:
        if x == 0:
            raise ValueError("zero is bad")
        durable_sleep(timedelta(days=1))
        return x

    @durable.task(name="kids.slow_or_bad.parent")
    def parent() -> Any:
        return durable.map_children(slow_or_bad, range(3), at_most=3)

    parent.apply_async(task_id="rc")
    durable.run_until_idle()
    assert kills["left"] == 0
    assert durable.run_ended("rc:0.0") == "faulted" and durable.run_ended("rc") is None
    streams = {rid: events_of(durable, rid) for rid in ("rc", "rc:0.1", "rc:0.2")}
    sent = durable.seam.sent
    assert check_runs(durable.durable.runtime, run_id="rc") == []
    assert {rid: events_of(durable, rid) for rid in streams} == streams, "nothing stored"
    assert durable.seam.sent == sent, "nothing sent"


def test_a_child_under_task_always_eager_is_refused_instead_of_waited_for(
    sqlite_url: str,
) -> None:
    """With ``task_always_eager`` no worker takes a child's message: the parent, run inline,
    would wait for it for ever. The call is refused, pointing to the test harness."""
    app = Celery("eager-children", broker="memory://")
    app.conf.task_always_eager = True
    durable = Durable(app, sqlite_url)
    try:

        @durable.task(name="eager.child")
        def child_task() -> int:
            return 1

        @durable.task(name="eager.parent")
        def parent() -> int:
            return int(durable.child(child_task))

        sent = parent.apply_async(task_id="eager-p")
        with pytest.raises(DurableError, match=r"task_always_eager.*DurableHarness"):
            sent.get(timeout=10)
        assert durable.children("eager-p") == []
    finally:
        durable.close()
