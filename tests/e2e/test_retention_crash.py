"""Kill -9 of a real ``celery beat -S durable`` in the middle of a retention batch (O1).

The journal holds 40 days of history written with a fake clock. The first beat runs with
``CELERY_DURABLE_TEST_CRASH=prune-batch`` and dies inside its first prune transaction, after the
batch's snapshots were written and before its events were deleted. Nothing of it may remain;
a second beat resumes pruning and every schedule reads back as before.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from celery import Celery

from celery_durable import Durable, Every
from celery_durable.store.journal.schema import events as events_table
from celery_durable.store.journal.schema import snapshots as snapshots_table
from tests.support.clock import FakeClock
from tests.support.processes import python_command, running_process, wait_for

UTC = timezone.utc


@pytest.fixture
def broker(redis_url: str) -> Iterator[str]:
    yield redis_url
    client = redis.Redis.from_url(redis_url)
    client.delete("celery", "e2e:received")  # what the beats sent (nothing consumes it here)
    client.close()


def count(durable: Durable, table: sa.Table) -> int:
    with durable.journal.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() or 0)


def beat_cmd(tmp_path: Path) -> list[str]:
    return python_command(
        "-m", "celery", "-A", "tests.e2e.beat_app", "beat", "-S", "durable", "-l", "INFO",
        "--schedule", str(tmp_path / "unused-beat-schedule"),
    )  # fmt: skip


def test_kill_in_a_prune_batch_leaves_nothing_half_deleted(
    tmp_path: Path, sqlite_url: str, broker: str
) -> None:
    app = Celery("history", broker="memory://", set_as_current=False)
    app.conf.durable_retention = timedelta(days=366)  # the history is written unpruned

    @app.task(name="e2e.tick", shared=False)
    def tick() -> None:  # pragma: no cover - nothing consumes the queue
        return None

    clock = FakeClock(datetime.now(UTC) - timedelta(days=41))
    durable = Durable(app, sqlite_url, clock=clock)
    for n in range(3):
        durable.schedules.create(f"six-hourly-{n}", "e2e.tick", None, Every(timedelta(hours=6)))
    dispatcher = durable.dispatcher()
    for _ in range(4 * 40):
        clock.advance(hours=6)
        dispatcher.tick()
    dispatcher.close()
    before = {v.id: v for v in durable.schedules.list()}
    events = count(durable, events_table)

    env = {
        "E2E_BROKER": broker,
        "E2E_SINK": broker,
        "CELERY_DURABLE_URL": sqlite_url,
        "E2E_PRUNE_INTERVAL": "1",  # the first pass one second after start-up
    }
    crash = env | {"CELERY_DURABLE_TEST_CRASH": "prune-batch"}
    with running_process(beat_cmd(tmp_path), log_path=tmp_path / "beat1.log", env=crash) as beat:
        wait_for(lambda: beat.returncode is not None, timeout=60)
        assert beat.returncode == -signal.SIGKILL, beat.log_tail()
    # The batch's transaction died with the process: no snapshot, no event gone.
    assert count(durable, snapshots_table) == 0
    assert count(durable, events_table) >= events
    durable.index.rebuild(datetime.now(UTC))
    for sid, view in before.items():
        got = durable.schedules.state(sid)
        assert got is not None and got.runs_decided >= view.runs_decided, sid

    # Ten days beyond the retention go: 4 runs a day, two events each, per schedule. A pass
    # takes several batches, and each batch writes its schedule's snapshot: wait for the pass
    # to have gone through them all, not only for the first snapshot of each schedule.
    bound = events + 3 * 4 - 3 * 4 * 2 * 9
    with running_process(beat_cmd(tmp_path), log_path=tmp_path / "beat2.log", env=env) as beat:
        wait_for(
            lambda: count(durable, snapshots_table) == 3 and count(durable, events_table) <= bound,
            timeout=60,
            processes=[beat],
        )
    assert count(durable, events_table) <= bound
    for sid, view in before.items():
        got = durable.schedules.state(sid)
        assert got is not None and not got.deleted and not got.paused, sid
        runs = durable.schedules.runs(sid)
        assert len({r.run_id for r in runs}) == len(runs), sid
        assert min(r.due for r in runs) >= datetime.now(UTC) - timedelta(days=31), sid
        assert got.runs_decided >= view.runs_decided + 1  # the beat decided the latest due time
    durable.index.rebuild(datetime.now(UTC))
    again = {v.id: v.runs_decided for v in durable.schedules.list() if v.id in before}
    for sid, decided in again.items():
        view = durable.schedules.state(sid)
        assert view is not None and view.runs_decided == decided, sid
    durable.close()
