"""Parallel branches (W9) and ``patched`` markers (W14) in-process on a real journal.

Deliveries run through Celery's ``task.apply()`` as in tests/worker/test_durable_tasks.py; a "crash"
is a ``BaseException`` raised inside a branch's step, which stores nothing for that step.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from celery import group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_durable import Cancelled, StepFailed, gather, parallel, patched, race
from celery_durable.core.branches import position_order
from celery_durable.core.ids import run_stream
from celery_durable.core.run_aggregate import fold
from celery_durable.errors import DurableError, RunFaulted, RunParked
from celery_durable.worker.branches import BranchRun
from celery_durable.worker.context import current_run, step_context
from celery_durable.worker.primitives import sleep, wait_signal
from celery_durable.worker.replay import replay_run
from tests.worker import test_durable_tasks as durable_tasks

pytestmark = pytest.mark.timeout(60)


class Crash(BaseException):
    """A worker dying inside a branch: nothing is stored for the step."""


class Env(durable_tasks.Env):
    def positions(self, run_id: str) -> dict[Any, Any]:
        state = fold(self.durable.journal.read_stream(run_stream(run_id)))
        return {
            p: (r.name, r.kind, r.status, r.result)
            for p, r in sorted(state.positions.items(), key=lambda i: position_order(i[0]))
        }


@pytest.fixture(params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest) -> Any:
    url = request.getfixturevalue({"sqlite": "sqlite_url", "postgres": "pg_url"}[request.param])
    e = Env(url)
    yield e
    e.durable.close()


def new_id() -> str:
    return f"run-{uuid.uuid4()}"


def test_branches_get_dotted_positions_and_replay_without_running(env: Env) -> None:
    calls: list[str] = []

    @env.durable.step
    def fetch(name: str) -> str:
        calls.append(name)
        ctx = step_context()
        return f"{name}@{ctx.position}:{ctx.idempotency_key.rsplit('/', 1)[1]}"

    crash = {"on": "b2"}

    @env.durable.step
    def maybe_crash(name: str) -> str:
        calls.append(name)
        if crash["on"] == name:
            raise Crash()
        return name

    @env.durable.task(name="t.branches")
    def body() -> Any:
        first = fetch("head")
        both = parallel(
            lambda: [fetch("a1"), fetch("a2")],
            lambda: [fetch("b1"), maybe_crash("b2")],
        )
        return [first, both, fetch("tail")]

    rid = new_id()
    with pytest.raises(Crash):
        env.run(body, run_id=rid)
    assert set(calls) == {"head", "a1", "a2", "b1", "b2"}
    env.after_crash()
    crash["on"] = ""
    calls.clear()
    result = env.run(body, run_id=rid)
    assert calls == ["b2", "tail"], "only the step without a stored result runs again"
    assert result == [
        "head@0:0",
        [["a1@1.0.0:1.0.0", "a2@1.0.1:1.0.1"], ["b1@1.1.0:1.1.0", "b2"]],
        "tail@2:2",
    ]
    assert list(env.positions(rid)) == [0, 1, "1.0.0", "1.0.1", "1.1.0", "1.1.1", 2]
    assert env.positions(rid)[1][:3] == ("2 branches", "parallel", "started"), "the call's marker"


def test_a_failing_branch_stops_the_others_and_is_raised(env: Env) -> None:
    started: list[str] = []
    release = threading.Event()

    @env.durable.step
    def slow(name: str) -> str:
        started.append(name)
        release.wait(10)
        return name

    @env.durable.step
    def boom() -> None:
        started.append("boom")
        release.set()
        raise ValueError("branch 1 broke")

    @env.durable.task(name="t.fail")
    def body() -> Any:
        return parallel(lambda: [slow("a1"), slow("a2")], boom)

    rid = new_id()
    with pytest.raises(StepFailed, match="branch 1 broke"):
        env.run(body, run_id=rid)
    assert started.count("a2") == 0, "no new step starts once a branch failed"
    stored = env.positions(rid)
    assert stored["0.0.0"][2] == "completed", "the step in flight is stored"
    assert "0.0.1" not in stored
    assert env.durable.outcome(rid, 1).error_type == "celery_durable.errors.StepFailed"  # type: ignore[union-attr]


def test_a_branch_waiting_to_retry_a_step_starts_no_attempt_once_another_failed(
    env: Env,
) -> None:
    """A step in a retry back-off when another branch fails tries no more (W9: no further
    step of the other branches starts), and ``parallel`` raises without waiting out the
    back-offs (here 5 attempts, 30 s in all)."""
    from celery_durable import Retry

    attempts: list[float] = []
    first_failed = threading.Event()

    @env.durable.step(retry=Retry.times(5, initial=2))
    def flaky() -> None:
        attempts.append(time.monotonic())
        first_failed.set()
        raise ValueError("not yet")

    @env.durable.step
    def boom() -> None:
        first_failed.wait(10)
        time.sleep(0.1)  # flaky is in its back-off now
        raise RuntimeError("branch 0 broke")

    @env.durable.task(name="t.retrying")
    def body() -> Any:
        return parallel(boom, flaky)

    rid = new_id()
    began = time.monotonic()
    with pytest.raises(StepFailed, match="branch 0 broke"):
        env.run(body, run_id=rid)
    assert len(attempts) == 1, "no attempt starts after the group stopped"
    assert time.monotonic() - began < 1.9, "the back-off is not waited out"
    stored = env.positions(rid)
    assert stored["0.0.0"][2] == "failed" and stored["0.1.0"][2] == "retrying"
    with pytest.raises(RunFaulted, match="branch 0 broke"):
        env.run(body, run_id=rid)  # a redelivery returns the stored outcome (W1)
    assert len(attempts) == 1


def test_race_stores_its_winner_and_replay_returns_it(env: Env) -> None:
    fast = {"branch": 0}
    gates = [threading.Event(), threading.Event()]
    ran: list[int] = []

    @env.durable.step
    def work(i: int) -> str:
        ran.append(i)
        if fast["branch"] != i:
            gates[i].wait(5)
        return f"branch {i}"

    @env.durable.step
    def after(value: str) -> str:
        if fast["branch"] == 0:
            raise Crash()  # the first delivery dies after the race
        return value

    @env.durable.task(name="t.race")
    def body() -> Any:
        return after(race(lambda: work(0), lambda: work(1)))

    rid = new_id()
    with pytest.raises(Crash):
        env.run(body, run_id=rid)
    gates[1].set()
    assert env.positions(rid)[0] == ("2 branches", "race", "completed", {"winner": 0})
    # A reader that skips the group markers (the version before them) sees the race it wrote.
    stream = env.durable.journal.read_stream(run_stream(rid))
    old_reader = fold(e for e in stream if not e.type.startswith("Branches"))
    assert (old_reader.positions[0].name, old_reader.positions[0].kind) == ("race", "race")
    # On replay branch 1 would win at once, but the stored winner is branch 0.
    fast["branch"] = 1
    env.after_crash()
    ran.clear()
    assert env.run(body, run_id=rid) == "branch 0"
    assert ran == [], "the winner's step replays; the losers do not run"


def test_gather_keeps_item_order_and_its_bound(env: Env) -> None:
    lock = threading.Lock()
    live = {"now": 0, "max": 0}

    @env.durable.step
    def square(x: int) -> int:
        with lock:
            live["now"] += 1
            live["max"] = max(live["max"], live["now"])
        time.sleep(0.02 * (5 - x % 5))
        with lock:
            live["now"] -= 1
        return x * x

    @env.durable.task(name="t.gather")
    def body() -> Any:
        return gather(square, range(10), at_most=3)

    rid = new_id()
    assert env.run(body, run_id=rid) == [x * x for x in range(10)]
    assert live["max"] == 3
    assert [p for p in env.positions(rid)] == [0] + [f"0.{i}.0" for i in range(10)]


def test_bad_input_is_refused_before_anything_is_stored(env: Env) -> None:
    seen: list[str] = []

    @env.durable.task(name="t.bad")
    def body(which: str) -> Any:
        seen.append(which)
        if which == "branch":
            return parallel(lambda: 1, 2)  # type: ignore[arg-type]
        if which == "race":
            return race("x")  # type: ignore[arg-type]
        if which == "zero":
            return gather(str, [1], at_most=0)
        if which == "float":
            return gather(str, [1], at_most=2.0)  # type: ignore[arg-type]
        return gather(3, [1])  # type: ignore[arg-type]

    cases = {
        "branch": (TypeError, "parallel: branch 1 must be a callable"),
        "race": (TypeError, "race: branch 0 must be a callable"),
        "zero": (ValueError, "at_most must be at least 1, not 0"),
        "float": (TypeError, "at_most must be an int, not float"),
        "fn": (TypeError, "gather: fn must be callable, not int"),
    }
    for which, (error, message) in cases.items():
        with pytest.raises(error, match=message):
            body.run(which)  # outside a run: the same checks
        rid = new_id()
        with pytest.raises(error, match=message):
            env.run(body, which, run_id=rid)
        assert env.positions(rid) == {}, "no position is stored for refused input"


def test_branches_that_need_arguments_are_refused_before_anything_is_stored(env: Env) -> None:
    """A branch is a callable *without arguments* (W9), gather's ``fn`` takes one item: one
    that cannot be called so is refused at the call, not run as a branch that fails (which
    stored the group, its stop or a race's winner, and took a position)."""

    def two(a: int, b: int) -> int:
        return a + b

    @env.durable.step(name="after")
    def after() -> str:
        return "after"

    @env.durable.task(name="t.args")
    def body(which: str) -> Any:
        try:
            if which == "parallel":
                parallel(lambda: 1, lambda x: x)
            elif which == "race":
                race(two, lambda: 1)
            elif which == "gather_none":
                gather(lambda: 1, [1, 2])
            else:
                gather(two, [1, 2])
        except TypeError as exc:
            return [str(exc), after()]
        return None

    cases = {
        "parallel": "parallel: branch 1 must be a callable without arguments",
        "race": "race: branch 0 must be a callable without arguments",
        "gather_none": "gather: fn must take one item as its argument",
        "gather_two": "gather: fn must take one item as its argument",
    }
    for which, message in cases.items():
        rid = new_id()
        error, value = env.run(body, which, run_id=rid)
        assert message in error, error
        assert value == "after"
        # Nothing stored for the refused call, and it took no position.
        assert env.positions(rid) == {0: ("after", "step", "completed", "after")}
    # Defaults, *args and callables without a readable signature are fine.
    assert parallel(lambda x=1: x, lambda *args: len(args)) == [1, 0]
    assert gather(str, [1, 2]) == ["1", "2"]


def test_durable_sleep_and_signal_waits_are_refused_inside_a_branch(env: Env) -> None:
    @env.durable.task(name="t.refuse")
    def body(which: str) -> Any:
        if which == "sleep":
            return parallel(lambda: sleep(30), lambda: 1)
        return parallel(lambda: 1, lambda: wait_signal("go"))

    rid = new_id()
    with pytest.raises(DurableError, match=r"position 0\.0\.0 .*cannot do on its own"):
        env.run(body, "sleep", run_id=rid)
    assert "0.0.0" not in env.positions(rid), "the sleep's wake time is not stored"
    with pytest.raises(DurableError, match=r"wait_signal\('go'\) at position 0\.1\.0"):
        env.run(body, "signal", run_id=new_id())


def test_outside_a_run_they_are_plain_concurrent_calls() -> None:
    barrier = threading.Barrier(3, timeout=5)

    def meet(x: int) -> int:
        barrier.wait()  # only passes if the three run at the same time
        return x

    assert parallel(lambda: meet(1), lambda: meet(2), lambda: meet(3)) == [1, 2, 3]
    assert gather(meet, [4, 5, 6], at_most=3) == [4, 5, 6]
    assert race(lambda: (time.sleep(0.5), "slow")[1], lambda: "fast") == "fast"
    assert patched("anything") is True


def test_patched_takes_the_old_branch_on_an_old_journal(env: Env) -> None:
    version = {"new": False}
    calls: list[str] = []

    @env.durable.step
    def old_step() -> str:
        calls.append("old")
        return "old"

    @env.durable.step
    def new_step() -> str:
        calls.append("new")
        return "new"

    @env.durable.step
    def last() -> str:
        if not version["new"]:
            raise Crash()
        return "last"

    @env.durable.task(name="t.patch")
    def body() -> Any:
        first = new_step() if version["new"] and patched("use-new-step") else old_step()
        return [first, last()]

    old_run = new_id()
    with pytest.raises(Crash):
        env.run(body, run_id=old_run)  # started by the old code, stopped mid-way
    version["new"] = True
    env.after_crash()
    assert env.run(body, run_id=old_run) == ["old", "last"]
    assert list(env.positions(old_run)) == [0, 1], "positions did not move"
    new_run = new_id()
    assert env.run(body, run_id=new_run) == ["new", "last"]
    assert env.positions(new_run)[0] == ("use-new-step", "patch", "completed", True)
    assert list(env.positions(new_run)) == [0, 1, 2]
    calls.clear()
    assert env.run(body, run_id=new_run) == ["new", "last"]
    assert calls == []


def test_parallel_returns_what_a_celery_group_of_the_same_functions_returns(env: Env) -> None:
    """Celery's own ``group`` (run eagerly, in order) is the oracle for results and order."""

    def work(x: int) -> dict[str, int]:
        return {"x": x, "square": x * x}

    task = env.app.task(name="t.plain_work")(work)
    step = env.durable.step(name="work")(work)
    inputs = [3, 1, 4, 1, 5]

    @env.durable.task(name="t.oracle")
    def body(xs: list[int]) -> Any:
        return [parallel(*[(lambda x=x: step(x)) for x in xs]), gather(step, xs, at_most=2)]

    expected = group(task.s(x) for x in inputs).apply().get()
    rid = new_id()
    assert env.run(body, inputs, run_id=rid) == [expected, expected]
    assert env.run(body, inputs, run_id=rid) == [expected, expected]


def test_a_cancel_reaches_the_branches_at_their_next_step(env: Env) -> None:
    ran: list[str] = []

    @env.durable.step
    def cancel_me() -> str:
        ran.append("cancel_me")
        env.durable.cancel(step_context().run_id)
        return "asked"

    @env.durable.step
    def later(name: str) -> str:
        ran.append(name)
        return name

    @env.durable.task(name="t.cancel")
    def body() -> Any:
        return parallel(lambda: [cancel_me(), later("a")], lambda: later("b"))

    rid = new_id()
    with pytest.raises(StepFailed) as failed:
        env.run(body, run_id=rid)
    assert failed.value.kind == "cancelled"
    assert "a" not in ran, "the branch that asked for the cancel stops at its next step"
    assert env.durable.outcome(rid, 1) == Cancelled()


# -- a failed group replays stopped (W9) and a changed group call parks (W6) -------------------


def wait_until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the condition")
        time.sleep(0.005)


def test_a_replayed_failed_parallel_starts_no_step_the_first_delivery_did_not(env: Env) -> None:
    """Branch 1 fails while branch 0's first step runs; that step's result is stored after
    the group stopped, so branch 0's second step never starts. The body handles the failure
    and the worker dies in the next step. On replay the stored failure and the stored step
    return at once: the group must begin stopped, or branch 0 starts its second step, which
    the first delivery never did."""
    ran: list[str] = []
    crash = {"on": True}

    @env.durable.step(name="slow")
    def slow() -> str:
        ran.append("slow")
        view = current_run()  # the branch's view: its group stops when branch 1 fails
        wait_until(lambda: view.group.stopped)  # type: ignore[union-attr]
        return "slow"

    @env.durable.step(name="second")
    def second() -> str:
        ran.append("second")
        return "second"

    @env.durable.step(name="boom")
    def boom() -> None:
        ran.append("boom")
        raise ValueError("branch 1 broke")

    @env.durable.step(name="after")
    def after(position: Any) -> Any:
        ran.append("after")
        if crash["on"]:
            raise Crash()
        return position

    @env.durable.task(name="t.stopped_replay")
    def body() -> Any:
        try:
            parallel(lambda: [slow(), second()], boom)
        except StepFailed as failure:
            return after(failure.position)
        return after("no failure")

    rid = new_id()
    with pytest.raises(Crash):
        env.run(body, run_id=rid)
    assert sorted(ran) == ["after", "boom", "slow"], "the first delivery never starts 'second'"
    stored = env.positions(rid)
    assert stored["0.0.0"][2] == "completed" and "0.0.1" not in stored
    env.after_crash()
    crash["on"] = False
    ran.clear()
    assert env.run(body, run_id=rid) == "0.1.0"
    assert ran == ["after"], "the replay starts no step the first delivery did not start"
    assert env.positions(rid)[0] == ("2 branches", "parallel", "started", None), "the marker"
    state = fold(env.durable.journal.read_stream(run_stream(rid)))
    assert state.positions[0].stopped_by == 1, "the group's stop names the failing branch"
    assert replay_run(env.durable.runtime, rid) is None, "the replay check agrees"


def _group_call(shape: str, step: Any) -> Any:
    """The group call of one body version: ``parallel2``, ``gather2``, ``race3`` … or
    ``step``."""
    if shape == "step":
        return step("instead")
    kind, count = shape[:-1], int(shape[-1])
    if kind == "gather":
        return gather(step, [f"i{i}" for i in range(count)])
    branches = [(lambda i=i: step(f"b{i}")) for i in range(count)]
    return (parallel if kind == "parallel" else race)(*branches)


@pytest.mark.parametrize(
    ("before", "after", "expected", "found"),
    [
        ("parallel2", "step", ("2 branches", "parallel"), ("s", "step")),
        ("parallel2", "gather2", ("2 branches", "parallel"), ("2 branches", "gather")),
        ("gather2", "parallel2", ("2 branches", "gather"), ("2 branches", "parallel")),
        ("parallel2", "parallel3", ("2 branches", "parallel"), ("3 branches", "parallel")),
        ("parallel3", "parallel2", ("3 branches", "parallel"), ("2 branches", "parallel")),
        ("race2", "race3", ("2 branches", "race"), ("3 branches", "race")),
        ("gather2", "gather1", ("2 branches", "gather"), ("1 branch", "gather")),
    ],
)
def test_a_changed_group_call_parks_the_run_naming_position_expected_and_found(
    env: Env, before: str, after: str, expected: tuple[str, str], found: tuple[str, str]
) -> None:
    deployed = {"shape": before}
    ran: list[str] = []

    @env.durable.step(name="s")
    def s(x: str) -> str:
        ran.append(x)
        return x

    @env.durable.step(name="end")
    def end() -> str:
        if deployed["shape"] == before:
            raise Crash()  # the first delivery dies after the group call
        return "end"

    @env.durable.task(name=f"t.w6.{before}.{after}")
    def body() -> Any:
        return [_group_call(deployed["shape"], s), end()]

    rid = new_id()
    with pytest.raises(Crash):
        env.run(body, run_id=rid)
    deployed["shape"] = after
    env.after_crash()
    ran.clear()
    with pytest.raises(RunParked) as parked:
        env.run(body, run_id=rid)
    assert (parked.value.position, parked.value.expected, parked.value.found) == (
        0,
        expected,
        found,
    )
    assert "non-deterministic replay at position 0" in str(parked.value)
    assert ran == [], "nothing of the changed call runs"
    outcome = env.durable.outcome(rid, 1)
    assert outcome.kind == "parked"  # type: ignore[union-attr]


class _HeldBack:
    """The run's lock, as the thread ``held`` takes it the first time: that thread waits
    for ``release`` before taking it (a busy CPU holding a branch's thread up just before
    it stores)."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.held: threading.Thread | None = None
        self.waiting = threading.Event()
        self.release = threading.Event()

    def __enter__(self) -> Any:
        if threading.current_thread() is self.held and not self.waiting.is_set():
            self.waiting.set()
            assert self.release.wait(10)
        return self.lock.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self.lock.__exit__(*exc)


def test_a_race_loser_held_up_before_it_stores_stores_nothing_after_the_winner(
    env: Env,
) -> None:
    """W9, W6: the loser's step ends first, but its thread is held up on its way to store
    the result until the race is decided, its winner stored, the delivery dead and its lease
    gone. The loser stores nothing (no result after the winner's, no renewal of the dead
    delivery's claim), so the next delivery of a changed body parks the run (before the fix
    of 2026-12-06 the loser stored its result with a claim of a delivery that no longer ran,
    and the next delivery left the run to it: no park, no outcome)."""
    deployed = {"shape": "race2"}
    held: list[_HeldBack] = []
    installed = threading.Event()

    @env.durable.step(name="s")
    def s(x: str) -> str:
        if x == "b0":  # the winner ends once the loser is held up, past its own step
            assert installed.wait(10) and held[0].waiting.wait(10)
        return x

    @env.durable.step(name="end")
    def end() -> str:
        if deployed["shape"] == "race2":
            raise Crash()
        return "end"

    @env.durable.task(name="t.w6.race.held_loser")
    def body() -> Any:
        return [_group_call(deployed["shape"], s), end()]

    def hold_the_loser(moment: str, run_id: str, position: Any, name: str) -> None:
        if (moment, position) == ("call", "0.1.0") and not held:
            view = current_run()
            assert isinstance(view, BranchRun)
            lock = view.root.lock = _HeldBack(view.root.lock)  # type: ignore[assignment]
            lock.held = threading.current_thread()
            held.append(lock)
            installed.set()

    env.durable.runtime.step_hooks.append(hold_the_loser)
    rid = new_id()
    with pytest.raises(Crash):
        env.run(body, run_id=rid)
    env.after_crash()
    loser = held[0].held
    assert loser is not None
    held[0].release.set()
    loser.join(10)
    assert not loser.is_alive()
    stream = env.durable.journal.read_stream(run_stream(rid))
    events = [(e.type, e.data.get("position")) for e in stream]
    assert events[-3:] == [("BranchesStarted", 0), ("StepCompleted", "0.0.0"), ("StepCompleted", 0)]
    assert env.positions(rid)[0] == ("2 branches", "race", "completed", {"winner": 0})

    deployed["shape"] = "race3"
    with pytest.raises(RunParked) as parked:
        env.run(body, run_id=rid)
    assert (parked.value.position, parked.value.expected, parked.value.found) == (
        0,
        ("2 branches", "race"),
        ("3 branches", "race"),
    )


# -- property: any completion order, failures, races, gather's bound, nesting (W9) -------------


@st.composite
def group_bodies(draw: Any) -> dict[str, Any]:
    """A group call (``parallel``, ``gather`` with ``at_most``, ``race``) of 1-3 branches;
    each branch a few steps that succeed or fail, or a nested ``parallel``; a step where the
    first delivery crashes (``None``: it crashes in the step after the call); the delay of
    every step in each of the two deliveries (so the branches end in another order)."""
    labels: list[str] = []

    def steps(prefix: str, nest: bool) -> list[Any]:
        actions: list[Any] = []
        for i in range(draw(st.integers(0 if nest else 1, 2))):
            label = f"{prefix}.{i}"
            if nest and draw(st.integers(0, 3)) == 0:
                subs = draw(st.integers(1, 2))
                actions.append(["nested", [steps(f"{label}.{j}", False) for j in range(subs)]])
            else:
                labels.append(label)
                actions.append(["step", label])
        return actions

    kind = draw(st.sampled_from(["parallel", "gather", "race"]))
    branches = [steps(f"b{b}", True) for b in range(draw(st.integers(1, 3)))]
    delays = st.fixed_dictionaries({label: st.sampled_from([0.0, 0.003, 0.01]) for label in labels})
    return {
        "kind": kind,
        "at_most": draw(st.integers(1, 3)),
        "branches": branches,
        "fails": draw(st.sets(st.sampled_from(labels))) if labels else set(),
        "crash": draw(st.none() | st.sampled_from(labels)) if labels else None,
        "delays": [draw(delays), draw(delays)],
    }


def position_of(label: str) -> str:
    """``b1.2.0.1`` (branch 1, its action 2: a nested call, sub-branch 0, step 1) is at
    ``0.1.2.0.1``: the group call takes position 0."""
    return "0." + label[1:]


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=group_bodies())
def test_any_completion_order_replays_to_the_same_outcome_and_starts_nothing_new(
    sqlite_env: Env, plan: dict[str, Any]
) -> None:
    env = sqlite_env
    delivery = {"n": 0}
    ran: list[list[str]] = [[], []]
    seen: list[Any] = [None, None]

    @env.durable.step(name="leg")
    def leg(label: str) -> str:
        n = delivery["n"]
        assert step_context().position == position_of(label)
        ran[n].append(label)
        time.sleep(plan["delays"][n][label])
        if n == 0 and label == plan["crash"]:
            raise Crash()
        if label in plan["fails"]:
            raise ValueError(f"{label} fails")
        return label

    @env.durable.step(name="after")
    def after(outcome: Any) -> Any:
        seen[delivery["n"]] = outcome
        if delivery["n"] == 0:
            raise Crash()  # the first delivery always dies after the call (if it gets there)
        return outcome

    def actions(items: list[Any]) -> list[Any]:
        out = []
        for what, arg in items:
            if what == "step":
                out.append(leg(arg))
            else:
                out.append(parallel(*[(lambda sub=sub: actions(sub)) for sub in arg]))
        return out

    @env.durable.task(name=f"t.prop{uuid.uuid4().hex[:8]}")
    def body() -> Any:
        branches = [(lambda items=items: actions(items)) for items in plan["branches"]]
        try:
            if plan["kind"] == "parallel":
                value = parallel(*branches)
            elif plan["kind"] == "gather":
                value = gather(lambda b: branches[b](), range(len(branches)), plan["at_most"])
            else:
                value = race(*branches)
            outcome: Any = {"value": value}
        except StepFailed as failure:
            outcome = {"failed": failure.position}
        return after(outcome)

    rid = new_id()
    with pytest.raises(Crash):
        env.run(body, run_id=rid)
    before = fold(env.durable.journal.read_stream(run_stream(rid))).positions
    settled = {p for p, r in before.items() if r.status in ("completed", "failed")}
    env.after_crash()
    delivery["n"] = 1
    result = env.run(body, run_id=rid)

    assert result == seen[1]
    replayed = {position_of(label) for label in ran[1]}
    assert not replayed & settled, "a step with a stored result ran again (W2)"
    if seen[0] is not None:
        assert ran[1] == [], "the replay started a step the first delivery did not"
        assert seen[1] == seen[0], "the replay ends the call as the first delivery did"
    for position, record in before.items():
        decided = record.kind == "race" and record.status == "completed"
        stopped = record.stopped_by is not None
        if record.kind in ("parallel", "gather", "race") and (stopped or decided):
            inside = [label for label in ran[1] if position_of(label).startswith(f"{position}.")]
            assert inside == [], f"the replay started {inside} in the group stopped at {position}"
    stored = fold(env.durable.journal.read_stream(run_stream(rid))).positions
    for position, record in stored.items():
        if record.kind == "step" and record.status == "completed" and position != 1:
            assert record.result == f"b{str(position)[2:]}", "each branch got its own result"
    assert stored[0].kind == plan["kind"] and stored[0].branches == len(plan["branches"])
    assert replay_run(env.durable.runtime, rid) is None, "the replay check agrees"


@pytest.fixture(scope="module")
def sqlite_env(tmp_path_factory: pytest.TempPathFactory) -> Any:
    e = Env(f"sqlite:///{tmp_path_factory.mktemp('prop') / 'journal.db'}")
    yield e
    e.durable.close()
