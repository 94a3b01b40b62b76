"""Three ``celery beat -S durable`` processes share 16 partitions of one journal (D10, D11).

300 schedules of one second each (``CatchUp.ALL``, so every due time must be decided) and no
worker: the test reads the Redis queue and the journal. One beat is killed with SIGKILL, its
partitions move to the others within the lease; started again, it gets a share back. Over
the whole test no due time is decided twice, none is missing (gap check), and a run is sent
twice only where a killed beat had sent it without recording the start.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_durable import Durable
from celery_durable.store.partitions import partition_of_lease, read_leases
from tests.support.processes import ManagedProcess, python_command, running_process, wait_for

APP = "tests.e2e.beat_app"
PARTITIONS = 16
SCHEDULES = 300
LEASE = 3.0


@pytest.fixture(params=["postgres", "mysql"])
def db_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue({"postgres": "pg_url", "mysql": "mysql_url"}[request.param]))


def beat_cmd(tmp_path: Path) -> list[str]:
    return python_command(
        "-m", "celery", "-A", APP, "beat", "-S", "durable", "-l", "INFO",
        "--schedule", str(tmp_path / "unused-beat-schedule"),
    )  # fmt: skip


def held_by_pid(durable: Durable) -> dict[int, set[int]]:
    """Partitions held now, by the PID in the holder's name (host:pid:suffix)."""
    now = datetime.now(timezone.utc)
    out: dict[int, set[int]] = {}
    for row in read_leases(durable.journal):
        k = partition_of_lease(row.name)
        if k is not None and row.expires_at >= now:
            out.setdefault(int(row.owner.split(":")[-2]), set()).add(k)
    return out


def sent_ids(client: redis.Redis) -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange("celery", 0, -1)]


def test_three_beats_share_sixteen_partitions_through_a_kill_and_a_restart(
    tmp_path: Path, redis_url: str, db_url: str
) -> None:
    env = {
        "E2E_BROKER": redis_url,
        "E2E_SINK": redis_url,
        "CELERY_DURABLE_URL": db_url,
        "E2E_BEAT": "many",
        "E2E_SCHEDULES": str(SCHEDULES),
        "E2E_PARTITIONS": str(PARTITIONS),
        "E2E_LEASE": str(LEASE),
    }
    client = redis.Redis.from_url(redis_url)
    client.delete("celery")
    reader = Durable(Celery("reader", set_as_current=False), db_url)
    beats: list[ManagedProcess] = []

    def fair() -> dict[int, set[int]] | None:
        held = held_by_pid(reader)
        alive = {p.pid for p in beats if p.is_alive()}
        counts = sorted(len(held.get(pid, ())) for pid in alive)
        covered = set().union(*held.values()) if held else set()
        return held if covered == set(range(PARTITIONS)) and counts == [5, 5, 6] else None

    try:
        started_at = datetime.now(timezone.utc)
        with (
            running_process(beat_cmd(tmp_path), log_path=tmp_path / "b1.log", env=env) as one,
            running_process(beat_cmd(tmp_path), log_path=tmp_path / "b2.log", env=env) as two,
            running_process(beat_cmd(tmp_path), log_path=tmp_path / "b3.log", env=env) as three,
        ):
            beats[:] = [one, two, three]
            wait_for(fair, timeout=40, interval=0.3, processes=beats, message="a fair share")
            time.sleep(2)  # steady state: every beat deciding its share
            victim = three
            lost = held_by_pid(reader)[victim.pid]
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            killed_at = time.monotonic()

            def taken_over() -> bool:
                held = held_by_pid(reader)
                return set().union(*(held.get(p.pid, set()) for p in (one, two))) == set(
                    range(PARTITIONS)
                )

            wait_for(taken_over, timeout=LEASE * 4, interval=0.2, processes=[one, two])
            takeover = time.monotonic() - killed_at
            assert takeover <= LEASE + 2.5, f"partitions {sorted(lost)} moved after {takeover:.1f}s"
            with running_process(
                beat_cmd(tmp_path), log_path=tmp_path / "b3-again.log", env=env
            ) as again:
                beats[:] = [one, two, again]
                joined_at = time.monotonic()
                wait_for(fair, timeout=30, interval=0.3, processes=beats, message="a share back")
                rejoin = time.monotonic() - joined_at
                time.sleep(1)
                last_tick = datetime.now(timezone.utc)
        # every beat stopped (SIGTERM): now the invariants, over the whole test
        ids = sent_ids(client)
        decided: set[str] = set()  # decided before the beats' last two seconds
        decided_twice: list[str] = []
        gaps: list[str] = []
        stale: list[str] = []
        for i in range(SCHEDULES):
            sid = f"many-{i:03d}"
            runs = reader.schedules.runs(sid)
            # a run decided in the beats' last moment may be sent by the next beat (D8)
            decided.update(r.run_id for r in runs if r.due < last_tick - timedelta(seconds=2))
            dues = sorted(r.due for r in runs)
            if len(dues) != len(set(dues)):
                decided_twice.append(sid)
            if any(b - a != timedelta(seconds=1) for a, b in pairwise(sorted(set(dues)))):
                gaps.append(sid)
            # decided up to the end of the test: three beats were alive for its last second
            if not dues or dues[-1] < last_tick - timedelta(seconds=2):
                stale.append(sid)
        assert not decided_twice, f"due times decided twice: {decided_twice[:5]}"
        assert not gaps, f"due times missing: {gaps[:5]}"
        assert not stale, f"schedules not decided up to the end: {stale[:5]}"
        twice = [rid for rid, n in Counter(ids).items() if n > 1]
        # Only what the killed beat sent in its last moment may go out again (A6).
        assert len(twice) <= 2 * len(lost) * SCHEDULES // PARTITIONS, twice[:5]
        # each was sent (D8 re-sends what the killed beat had decided and not sent)
        assert decided <= set(ids), sorted(decided - set(ids))[:5]
        # and the decisions span the test: one per schedule and second, from the start
        seconds = (last_tick - started_at).total_seconds()
        assert len(decided) >= SCHEDULES * (seconds - 10), (len(decided), seconds)
        print(
            f"takeover {takeover:.1f}s, rejoin {rejoin:.1f}s, {len(set(ids))} runs, "
            f"{len(twice)} sent twice"
        )
    finally:
        reader.close()
        client.delete("celery")
        client.close()
