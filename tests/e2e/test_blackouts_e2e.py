"""A blackout window set at run time, honoured by a real beat and worker (SPEC P4).

Redis broker, a SQLite journal shared with the processes, the worker records what it runs in
a Redis list (``tests/e2e/beat_app.py``). A schedule due every second defers out of a global
window set while beat runs: one run is sent when the window ends, none inside it.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_durable import Blackout, Durable, Every
from celery_durable.core.schedule_events import RunDecided, RunSent, RunSkipped
from tests.e2e.test_beat_e2e import beat_cmd, worker_cmd
from tests.support.processes import running_process, wait_for

pytestmark = pytest.mark.timeout(120)


def test_a_global_window_set_while_beat_runs_defers_to_one_run_at_its_end(
    tmp_path: Path, redis_url: str, sqlite_url: str
) -> None:
    env = {"E2E_BROKER": redis_url, "E2E_SINK": redis_url, "CELERY_DURABLE_URL": sqlite_url}
    sink = redis.Redis.from_url(redis_url)
    reader = Celery("reader", set_as_current=False)

    @reader.task(name="e2e.tick", shared=False)
    def tick(*args: object, **kwargs: object) -> None:  # pragma: no cover - beat_app's runs
        return None

    api = Durable(reader, sqlite_url)
    try:
        api.schedules.create("each-second", "e2e.tick", None, Every(timedelta(seconds=1)),
                             on_blackout="defer")  # fmt: skip

        def runs() -> list[str]:
            return [json.loads(raw)["id"] for raw in sink.lrange("e2e:received", 0, -1)]

        with (
            running_process(worker_cmd(), log_path=tmp_path / "worker.log", env=env) as worker,
            running_process(beat_cmd(tmp_path), log_path=tmp_path / "beat.log", env=env) as beat,
        ):
            wait_for(lambda: len(runs()) >= 2, timeout=40, processes=[worker, beat])
            now = api.now()
            start, end = now + timedelta(seconds=2), now + timedelta(seconds=5)
            api.blackouts.set([Blackout.between("deploy", start, end)], reason="e2e")
            wait_for(
                lambda: any(e.due > end for e in api._store.events("each-second")
                            if isinstance(e, RunSent)),
                timeout=30,
                processes=[worker, beat],
            )  # fmt: skip
            events = api._store.events("each-second")
            [deferred] = [e for e in events if isinstance(e, RunDecided) and e.blackout]
            wait_for(lambda: deferred.run_id in runs(), timeout=20, processes=[worker, beat])
    finally:
        api.close()
        sink.close()
    assert deferred.blackout == "deploy" and deferred.send_at == end
    assert start <= deferred.due < end
    started = {e.due: e.at for e in events if isinstance(e, RunSent)}
    assert started[deferred.due] >= end  # sent when the window ended, not before
    assert not [at for due, at in started.items() if start <= at < end], "nothing started inside"
    inside = [
        e.due for e in events if isinstance(e, RunDecided | RunSkipped) and start <= e.due < end
    ]
    skipped = [e for e in events if isinstance(e, RunSkipped)]
    assert {e.reason for e in skipped} == {"blackout deploy"}
    assert sorted(inside) == sorted([deferred.due, *(e.due for e in skipped)])
    assert len(inside) >= 2  # several due times inside, one run
