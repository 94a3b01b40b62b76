"""Write ``tests/data/journal-v1.sqlite``: a journal in the current (v1) format, through the
public API only, for ``tests/store/test_upgrade.py`` (SPEC §9, persistent contracts).

    python -m tests.data.make_journal_v1            # rewrites tests/data/journal-v1.sqlite

Do not regenerate it after a change to a stored format: the point of the file is that it was
written by the *previous* code. Add a migration instead, and keep ``test_upgrade.py`` green.

What it holds (times from a fake clock starting at ``BASE``, so the schedule part is exact):

* ``every-10m`` — ``Every(10 min)``, ``CatchUp.ALL``, plain task: 6 runs decided and started;
* ``pending-5m`` — ``Every(5 min)``, plain task: its last run decided but never enqueued (the
  broker was down for that tick);
* ``paused-daily`` — ``Daily(02:00, Europe/Oslo)``, paused;
* ``deleted-cron`` — ``Cron("*/15 * * * *")``, one run, then deleted;
* ``changed-weekly`` — ``Weekly`` changed once (input and rule);
* ``once`` — ``Once`` in the past: decided, complete;
* ``skip-durable`` — ``Every(1 min)``, ``Overlap.SKIP``, durable task: a run that never ends,
  so the next due times are recorded as skipped;
* durable runs, executed in-process: ``flow-finished`` (two steps, a durable sleep, a signal sent
  before the wait; ``Finished``), ``flow-faulted`` (a step that fails; ``Faulted``), and
  ``flow-future``, which has only a stored signal (its run has not started).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from datetime import datetime, time, timedelta, timezone
from pathlib import Path
from typing import Any

from celery import Celery

from celery_durable import (
    CatchUp,
    Cron,
    Daily,
    Durable,
    Every,
    Once,
    Overlap,
    Retry,
    Weekly,
    sleep,
    wait_signal,
)

UTC = timezone.utc
BASE = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
FIXTURE = Path(__file__).with_name("journal-v1.sqlite")


class Clock:
    """A settable clock; :meth:`__call__` is what ``Durable(clock=…)`` calls."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


def build(url: str, clock: Any = None, broker: str = "memory://") -> tuple[Durable, Any]:
    """The app of the fixture (also used by the test to continue from it)."""
    app = Celery(f"upgrade-{id(clock)}", broker=broker, set_as_current=False)
    app.conf.update(task_ignore_result=True, durable_run_lease=300)
    durable = Durable(app, url, clock=clock)

    @app.task(name="upgrade.plain", shared=False)
    def plain(*args: Any, **kwargs: Any) -> None:
        return None

    @durable.step(name="fetch")
    def fetch(n: int) -> dict[str, Any]:
        return {"n": n, "items": [1, 2.5, "é", None]}

    @durable.step(name="fail", retry=Retry.none())
    def fail() -> None:
        raise ValueError("the fixture's failing step")

    @durable.task(name="upgrade.flow")
    def flow(n: int = 1) -> Any:
        first = fetch(n)
        sleep(0.2)
        got = wait_signal("go")
        return {"first": first, "got": got}

    @durable.task(name="upgrade.failing")
    def failing() -> Any:
        return fail()

    @durable.task(name="upgrade.scheduled")
    def scheduled(run: Any) -> Any:
        return fetch(0)

    tasks = {"flow": flow, "failing": failing, "scheduled": scheduled, "plain": plain}
    return durable, tasks


def make(path: Path) -> None:
    url = f"sqlite:///{path}"
    clock = Clock(BASE)
    durable, _ = build(url, clock)
    s = durable.schedules
    s.create("every-10m", "upgrade.plain", {"a": 1}, Every(timedelta(minutes=10)), CatchUp.ALL)
    s.create("pending-5m", "upgrade.plain", None, Every(timedelta(minutes=5)))
    s.create("paused-daily", "upgrade.plain", "x", Daily(time(2), "Europe/Oslo"))
    s.create("deleted-cron", "upgrade.plain", None, Cron("*/15 * * * *"))
    s.create("changed-weekly", "upgrade.plain", 1, Weekly(["mon"], time(8), "Europe/Oslo"))
    s.create("once", "upgrade.plain", None, Once(BASE + timedelta(minutes=1)))
    s.create(
        "skip-durable", "upgrade.scheduled", {"k": "v"}, Every(timedelta(minutes=1)),
        CatchUp.LATEST, overlap=Overlap.SKIP,
    )  # fmt: skip
    dispatcher = durable.dispatcher()
    for minute in range(1, 61):
        clock.now = BASE + timedelta(minutes=minute)
        dispatcher.tick()
        if minute == 20:
            s.pause("paused-daily")
            s.change(
                "changed-weekly", "upgrade.plain", 2,
                Weekly(["mon", "thu"], time(9), "Europe/Oslo"), CatchUp.NONE,
            )  # fmt: skip
        if minute == 16:
            s.delete("deleted-cron")
    dispatcher.close()
    # One more due time of pending-5m, decided while the broker is down: never enqueued.
    clock.now = BASE + timedelta(minutes=65)
    down, _ = build(url, clock, broker="redis://127.0.0.1:1/0")
    down.app.conf.broker_connection_timeout = 1
    down_dispatcher = down.dispatcher()
    down_dispatcher.tick()
    down_dispatcher.close()
    down.close()
    # Durable runs, in this process (real clock: their own timing does not matter).
    runs, run_tasks = build(url)
    runs.signal("flow-finished", "go", {"payload": "before the wait"})
    run_tasks["flow"].apply(args=[3], task_id="flow-finished")
    run_tasks["failing"].apply(task_id="flow-faulted")
    runs.signal("flow-future", "go", ["kept", 1])
    runs.close()
    durable.close()


def write_fixture(make: Callable[[Path], None], fixture: Path) -> None:
    """Run ``make`` on a fresh SQLite file and copy it to ``fixture`` as one consistent file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "journal.sqlite"
        make(path)
        # A consistent single file: fold the WAL into the database before copying.
        import sqlite3

        conn = sqlite3.connect(path)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.close()
        shutil.copyfile(path, fixture)
    print(f"wrote {fixture} ({fixture.stat().st_size} bytes)")


def main() -> None:
    write_fixture(make, FIXTURE)


if __name__ == "__main__":
    main()
