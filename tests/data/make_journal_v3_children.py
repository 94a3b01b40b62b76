"""Write ``tests/data/journal-v3-children.sqlite``: a parent waiting for its fan-out's children
in a journal of schema version 3, as the code before the run table's ``wake_after`` column
(journal version 4, 2026-12-06) stored it, for ``tests/store/test_upgrade.py`` (SPEC §9).

    python -m tests.data.make_journal_v3_children   # run from a checkout of the previous code

The file was written by the code of 2026-12-06 before that column: do not regenerate it with
newer code, the point is that it holds the old form. It holds one run, ``fan``: a
``map_children`` of :data:`INPUTS` inputs, :data:`AT_MOST` at a time, whose first children
are suspended in a durable sleep of :data:`NAP` (a long one: the dispatcher sends them when it
ends), and the parent suspended waiting for them (its row has no countdown). The test opens
it with the current code at :data:`BASE` and lets the clock pass: the first child's end wakes
the parent, as it did when the file was written, and the fan-out finishes.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from celery import Celery

from celery_durable import sleep
from celery_durable.testing import DurableHarness, TestClock

FIXTURE = Path(__file__).with_name("journal-v3-children.sqlite")
BASE = datetime(2026, 12, 6, 8, 0, tzinfo=timezone.utc)
INPUTS = 6
AT_MOST = 3
NAP = timedelta(seconds=100)


def register(durable: Any) -> Any:
    """The fixture's tasks on a harness (also used by the test to continue the run)."""

    @durable.task(name="legacy.kids.child")
    def child(x: int) -> int:
        sleep(NAP)
        return x * 10

    @durable.task(name="legacy.kids.fan")
    def fan(n: int) -> list[int]:
        return list(durable.map_children(child, range(n), at_most=AT_MOST))

    return fan


def main() -> None:
    FIXTURE.unlink(missing_ok=True)
    app = Celery("journal-v3-children", broker="memory://", set_as_current=False)
    app.conf.update(task_ignore_result=True)
    with DurableHarness(app, f"sqlite:///{FIXTURE}", clock=TestClock(BASE)) as durable:
        durable.start()
        fan = register(durable)
        fan.apply_async((INPUTS,), task_id="fan")
        durable.run_until_idle()
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
