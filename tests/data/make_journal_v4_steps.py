"""Write ``tests/data/journal-v4-steps.sqlite``: a durable run with stored step results in a
SQLite journal of schema version 4, as the code before the events table's trigger (journal
version 5, 2026-12-06) stored it, for ``tests/store/test_upgrade.py`` (SPEC §9).

    python -m tests.data.make_journal_v4_steps   # run from a checkout of the previous code

The file was written by the code of 2026-12-06 before that trigger: do not regenerate it with
newer code, the point is that it holds the old form. It holds one run, ``steps``: two steps
stored (``first``, ``second``), then suspended in a durable sleep of :data:`NAP`; after the
sleep a third step. The test opens it with the current code at :data:`BASE` and lets the
clock pass: the trigger is added, the run finishes without running the stored steps again,
and an append past the end of its stream is refused.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from celery import Celery

from celery_durable import sleep
from celery_durable.testing import DurableHarness, TestClock

FIXTURE = Path(__file__).with_name("journal-v4-steps.sqlite")
BASE = datetime(2026, 12, 6, 11, 0, tzinfo=timezone.utc)
NAP = timedelta(seconds=100)


def register(durable: Any, calls: list[str]) -> Any:
    """The fixture's task on a harness (also used by the test to continue the run); each
    step's execution is appended to ``calls``."""

    @durable.step
    def first(x: int) -> int:
        calls.append("first")
        return x + 1

    @durable.step
    def second(x: int) -> int:
        calls.append("second")
        return x * 10

    @durable.step
    def third(x: int) -> int:
        calls.append("third")
        return x + 3

    @durable.task(name="legacy.steps")
    def steps(x: int) -> int:
        y = second(first(x))
        sleep(NAP)
        return third(y)

    return steps


def main() -> None:
    FIXTURE.unlink(missing_ok=True)
    app = Celery("journal-v4-steps", broker="memory://", set_as_current=False)
    app.conf.update(task_ignore_result=True)
    calls: list[str] = []
    with DurableHarness(app, f"sqlite:///{FIXTURE}", clock=TestClock(BASE)) as durable:
        durable.start()
        task = register(durable, calls)
        task.apply_async((4,), task_id="steps")
        durable.run_until_idle()
    assert calls == ["first", "second"], calls
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
