"""Write ``tests/data/journal-branches-v1.sqlite``: durable runs with parallel branches as the
code before the group markers (``BranchesStarted``/``BranchesStopped``, W9) stored them, for
``tests/worker/test_branches_legacy.py`` (SPEC §9: journals written before must still replay).

    python -m tests.data.make_journal_branches_v1   # run from a checkout of the previous code

The file was written by the code of 2026-12-05 (before the markers): do not regenerate it with
newer code, the point is that it holds the old form. Every run but ``par-finished`` was stopped
by a simulated crash (:class:`Crash`, a ``BaseException`` raised in a step, which stores
nothing), so the test continues it with the current code:

* ``par-stopped`` — ``parallel(a, b)``: ``b``'s step failed while ``a``'s first step was still
  running; that step's result was stored after the failure, ``a``'s second step never started;
  the body caught the ``StepFailed`` and crashed in its next step;
* ``par-stopped-on`` — the same, but the body stored one more step after the call before its
  crash (so the journal shows that the call had ended);
* ``race-won`` — ``race``: branch 0 won (its winner stored at the race's position), then a crash;
* ``gather-mid`` — ``gather`` over three items: the worker "died" in the step of item 1, the
  others were stored;
* ``nested`` — a ``parallel`` nested in a branch of another, all stored, then a crash;
* ``par-finished`` — a finished run with a ``parallel`` (for the replay check).
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

from celery import Celery

from celery_durable import Durable, StepFailed, gather, parallel, race

FIXTURE = Path(__file__).with_name("journal-branches-v1.sqlite")


class Crash(BaseException):
    """A worker dying in a step: nothing is stored for it."""


class Knobs:
    """What the fixture's steps do: which crash, which gate to wait for, what ran."""

    def __init__(self) -> None:
        self.crash: set[str] = set()
        self.ran: list[str] = []
        self.failed = threading.Event()
        self.lock = threading.Lock()

    def note(self, what: str) -> None:
        with self.lock:
            self.ran.append(what)
        if what in self.crash:
            raise Crash(what)


def build(url: str, knobs: Knobs, clock: Any = None) -> tuple[Durable, dict[str, Any]]:
    """The app of the fixture (also used by the test to continue from it)."""
    app = Celery("branches-v1", broker="memory://", set_as_current=False)
    app.conf.update(task_ignore_result=True, durable_run_lease=300)
    durable = Durable(app, url, clock=clock)

    @durable.step(name="slow")
    def slow() -> str:
        knobs.note("slow")
        # Still running when the other branch fails: its result is stored after the failure.
        knobs.failed.wait(10)
        threading.Event().wait(0.3)
        return "slow"

    @durable.step(name="after_slow")
    def after_slow() -> str:
        knobs.note("after_slow")
        return "after_slow"

    @durable.step(name="boom")
    def boom() -> None:
        knobs.note("boom")
        knobs.failed.set()
        raise ValueError("branch 1 broke")

    @durable.step(name="finish")
    def finish() -> str:
        knobs.note("finish")
        return "finished"

    @durable.step(name="mark")
    def mark() -> str:
        knobs.note("mark")
        return "mark"

    @durable.step(name="quick")
    def quick(i: int) -> str:
        knobs.note(f"quick{i}")
        if i == 1:
            threading.Event().wait(0.5)  # branch 1 loses
        return f"quick{i}"

    @durable.step(name="double")
    def double(x: int) -> int:
        knobs.note(f"double{x}")
        return 2 * x

    @durable.step(name="leaf")
    def leaf(x: int) -> int:
        knobs.note(f"leaf{x}")
        return x

    @durable.task(name="legacy.par_stopped")
    def par_stopped() -> Any:
        try:
            parallel(lambda: [slow(), after_slow()], boom)
        except StepFailed as failure:
            return [failure.position, finish()]
        return ["no failure", finish()]

    @durable.task(name="legacy.par_stopped_on")
    def par_stopped_on() -> Any:
        where: Any = "no failure"
        try:
            parallel(lambda: [slow(), after_slow()], boom)
        except StepFailed as failure:
            where = failure.position
        return [where, mark(), finish()]

    @durable.task(name="legacy.race_won")
    def race_won() -> Any:
        return [race(lambda: quick(0), lambda: quick(1)), finish()]

    @durable.task(name="legacy.gather_mid")
    def gather_mid() -> Any:
        return [gather(double, [0, 1, 2], at_most=3), finish()]

    @durable.task(name="legacy.nested")
    def nested() -> Any:
        inner = parallel(lambda: parallel(lambda: leaf(1), lambda: leaf(2)), lambda: leaf(3))
        return [inner, finish()]

    @durable.task(name="legacy.par_finished")
    def par_finished() -> Any:
        return parallel(lambda: leaf(4), lambda: leaf(5))

    tasks = {
        "par-stopped": par_stopped,
        "par-stopped-on": par_stopped_on,
        "race-won": race_won,
        "gather-mid": gather_mid,
        "nested": nested,
        "par-finished": par_finished,
    }
    return durable, tasks


def make(path: Path) -> None:
    knobs = Knobs()
    durable, tasks = build(f"sqlite:///{path}", knobs)
    for run_id, crash in [
        ("par-stopped", {"finish"}),
        ("par-stopped-on", {"finish"}),
        ("race-won", {"finish"}),
        ("gather-mid", {"double1"}),
        ("nested", {"finish"}),
        ("par-finished", set()),
    ]:
        knobs.crash = crash
        knobs.failed.clear()
        with contextlib.suppress(Crash):
            tasks[run_id].apply(task_id=run_id).get()
    for run_id in ("par-stopped", "par-stopped-on"):
        stored = {e.data.get("position") for e in durable.journal.read_stream(f"run/{run_id}")}
        # The point: the failure and the in-flight step are stored, not the next one.
        if not ({"0.0.0", "0.1.0"} <= stored and "0.0.1" not in stored):
            raise SystemExit(f"{run_id} did not store the intended positions: {stored}")
    durable.close()


def main() -> None:
    from tests.data.make_journal_v1 import write_fixture

    write_fixture(make, FIXTURE)


if __name__ == "__main__":
    main()
