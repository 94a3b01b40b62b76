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

from celery_durable import ChildHandle, DurableError, StepFailed, UnknownTask
from celery_durable.core.ids import run_stream
from celery_durable.testing import DurableHarness, TestClock
from tests.support.clock import T0

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["sqlite", "postgres"])
def durable(celery_app: Celery, request: pytest.FixtureRequest) -> Iterator[DurableHarness]:
    url = request.getfixturevalue({"sqlite": "sqlite_url", "postgres": "pg_url"}[request.param])
    with DurableHarness(celery_app, url, clock=TestClock(T0)) as harness:
        harness.start()
        yield harness


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
    from celery_durable.worker import children

    monkeypatch.setattr(children, "wake_parent", lambda run: None)
    monkeypatch.setattr("celery_durable.worker.body.wake_parent", lambda run: None)

    @durable.task(name="kids.lost.child")
    def child_task() -> str:
        return "done"

    @durable.task(name="kids.lost.parent")
    def parent() -> str:
        return str(durable.child(child_task))

    parent.apply_async(task_id="lost")
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


# -- W13 ------------------------------------------------------------------------------------------


def test_runs_show_lists_the_children_and_a_child_names_its_parent(
    celery_app: Celery, sqlite_url: str
) -> None:
    from tests.test_cli import as_json, ok

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
