"""Partitions (D10, D11): the stable hash, the fair share, the journal setting, and several
dispatchers on one PostgreSQL journal with a fake clock and a real Redis broker.

The real-process version (three ``celery beat`` subprocesses, SIGKILL) is in
tests/e2e/test_partitions_e2e.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
import redis
from celery import Celery

from celery_durable import Durable, Every
from celery_durable.config import ConfigError, DurableConfig
from celery_durable.core.partitions import (
    PartitionsError,
    check_partitions,
    partition_of,
    plan,
    slot_of,
    targets,
)
from celery_durable.dispatch.dispatcher import Dispatcher
from celery_durable.store.partitions import (
    read_leases,
    resolve_partitions,
    set_partitions,
    stored_partitions,
)
from tests.support.clock import T0, FakeClock

# -- the pure core ----------------------------------------------------------------------------


def test_the_slot_is_stable_across_processes() -> None:
    """Python's hash() is salted per process; the slot must not be (a CRC-32 of UTF-8)."""
    code = "from celery_durable.core.partitions import slot_of; print(slot_of('nightly-ø'))"
    seen = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(seed)},
        ).stdout.strip()
        for seed in (1, 2)
    }
    assert seen == {str(slot_of("nightly-ø"))}


def test_partitions_spread_schedules_evenly() -> None:
    counts = Counter(partition_of(f"job-{i}", 16) for i in range(3200))
    assert set(counts) == set(range(16))
    assert max(counts.values()) < 1.3 * 200 and min(counts.values()) > 0.7 * 200


@pytest.mark.parametrize("bad", [0, -1, 2.5, "x", True, None, 257, "1.5", "\u00b2", "\u0663"])
def test_bad_partition_counts_are_refused_naming_the_value(bad: object) -> None:
    with pytest.raises(PartitionsError, match="durable_partitions") as info:
        check_partitions(bad)
    assert repr(bad) in str(info.value) or str(bad) in str(info.value)


@pytest.mark.parametrize("bad", [0, -3, 1.5, "many"])
def test_the_app_setting_is_checked_before_anything_is_stored(bad: object) -> None:
    with pytest.raises(ConfigError, match="durable_partitions"):
        DurableConfig.from_app({"durable_partitions": bad})
    assert DurableConfig.from_app({}).partitions is None
    assert DurableConfig.from_app({"durable_partitions": "8"}).partitions == 8


def test_targets_split_evenly_and_never_above_the_ceiling() -> None:
    assert sorted(targets(["b", "a", "c"], 16).values()) == [5, 5, 6]
    assert targets(["a"], 16) == {"a": 16}
    assert sum(targets([f"b{i}" for i in range(5)], 3).values()) == 3


def _settle(beats: list[str], n: int, rounds: int = 10) -> dict[int, str]:
    """Run the plan of every beat in turn until nothing moves; the resulting holders."""
    holders: dict[int, str] = {}
    for _ in range(rounds):
        moved = False
        for me in beats:
            moves = plan(me, n, beats, holders)
            for k in moves.release:
                del holders[k]
                moved = True
            for k in moves.take:
                if k not in holders:
                    holders[k] = me
                    moved = True
        if not moved:
            return holders
    raise AssertionError(f"the plan did not settle: {holders}")


def test_the_plan_settles_to_a_fair_share_and_rebalances_on_join_and_leave() -> None:
    holders = _settle(["a"], 16)
    assert Counter(holders.values()) == {"a": 16}
    joined = _settle(["a", "b", "c"], 16)  # a joins... b and c join a beat holding all
    assert sorted(Counter(joined.values()).values()) == [5, 5, 6]
    assert len(joined) == 16
    # c dies: its partitions are free, a and b take them up to 8 each.
    left = {k: o for k, o in joined.items() if o != "c"}
    for _ in range(3):
        for me in ["a", "b"]:
            for k in plan(me, 16, ["a", "b"], left).take:
                left.setdefault(k, me)
    assert Counter(left.values()) == {"a": 8, "b": 8}


def test_a_dead_beat_still_listed_keeps_others_from_grabbing_then_its_share_moves() -> None:
    """While the dead beat's presence has not expired, nobody takes above its target."""
    holders = {k: ("a" if k < 8 else "b") for k in range(16)}
    del holders[15]  # b's lease of 15 expired first
    assert plan("a", 16, ["a", "b"], holders).take == ()
    assert plan("b", 16, ["a", "b"], holders).take == (15,)


# -- the journal setting ----------------------------------------------------------------------


def test_sqlite_keeps_one_partition(sqlite_url: str) -> None:
    durable = Durable(Celery("p", broker="memory://", set_as_current=False), sqlite_url)
    try:
        with pytest.raises(PartitionsError, match="SQLite"):
            resolve_partitions(durable.journal, 4, T0)
        with pytest.raises(PartitionsError, match="SQLite"):
            set_partitions(durable.journal, 2, T0)
        assert resolve_partitions(durable.journal, None, T0) == 1
        assert stored_partitions(durable.journal) is None  # nothing stored for the default
    finally:
        durable.close()


def test_the_first_beat_stores_the_count_and_a_mismatch_names_both(pg_url: str) -> None:
    durable = Durable(Celery("p", broker="memory://", set_as_current=False), pg_url)
    try:
        assert resolve_partitions(durable.journal, 8, T0) == 8
        assert resolve_partitions(durable.journal, None, T0) == 8
        with pytest.raises(PartitionsError) as info:
            resolve_partitions(durable.journal, 4, T0)
        message = str(info.value)
        assert "4" in message and "8" in message and "partitions set 4" in message
        assert set_partitions(durable.journal, 4, T0).after == 4
        assert resolve_partitions(durable.journal, 4, T0) == 4
    finally:
        durable.close()


def test_a_count_is_not_stored_while_a_one_partition_beat_holds_the_lease(pg_url: str) -> None:
    """D10: a journal that never stored a count has one partition; a beat configured with
    another count must not store it while a beat works that one partition (both would send
    the same schedules), and is told how to change it."""
    clock = FakeClock(T0)
    plain = Durable(Celery("p", broker="memory://", set_as_current=False), pg_url, clock=clock)
    try:
        beat = plain.dispatcher(owner="one-partition-beat")
        beat.tick()
        assert beat.leases.held == frozenset({0})
        with pytest.raises(PartitionsError) as info:
            resolve_partitions(plain.journal, 4, clock())
        message = str(info.value)
        assert "one-partition-beat" in message and "partitions set 4" in message
        assert stored_partitions(plain.journal) is None
        beat.close()
        assert resolve_partitions(plain.journal, 4, clock()) == 4
    finally:
        plain.close()


# -- several dispatchers on one journal --------------------------------------------------------


@pytest.fixture
def app(redis_url: str) -> Celery:
    app = Celery("partition_tests", broker=redis_url, set_as_current=False)
    app.conf.update(broker_connection_retry_on_startup=False, durable_partitions=8)

    @app.task(name="work", shared=False)
    def work() -> None:  # pragma: no cover - the tests read the queue
        return None

    return app


@pytest.fixture
def queue(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.delete("celery")
    yield client
    client.close()


def _sent(queue: redis.Redis) -> list[str]:
    import json

    out = []
    while (raw := queue.rpop("celery")) is not None:
        out.append(json.loads(raw)["headers"]["id"])
    return out


def _held(dispatchers: list[Dispatcher]) -> list[frozenset[int]]:
    return [d.leases.held for d in dispatchers]


def test_three_dispatchers_share_eight_partitions_and_each_due_time_is_sent_once(
    app: Celery, pg_url: str, queue: redis.Redis
) -> None:
    clock = FakeClock(T0)
    durables = [Durable(app, pg_url, clock=clock) for _ in range(3)]
    try:
        for i in range(40):
            durables[0].schedules.create(f"job-{i}", "work", rule=Every(timedelta(seconds=10)))
        beats = [
            d.dispatcher(owner=f"beat-{n}", lease_ttl=4, poll_interval=1)
            for n, d in enumerate(durables)
        ]
        sent: list[str] = []
        for _ in range(6):
            for beat in beats:
                beat.tick()
            clock.advance(seconds=1)
        held = _held(beats)
        assert sorted(len(h) for h in held) == [2, 3, 3]
        assert frozenset().union(*held) == frozenset(range(8))
        # each beat reads only its partitions' schedules (D10)
        for beat in beats:
            assert {partition_of(s, 8) for s in beat.cache.states} <= beat.leases.held
        for _ in range(25):
            for beat in beats:
                beat.tick()
            sent += _sent(queue)
            clock.advance(seconds=1)
        # beat-2 stops without a word (as after SIGKILL): its leases expire, others take over.
        dead = beats.pop()
        lost = dead.leases.held
        for _ in range(6):
            for beat in beats:
                beat.tick()
            sent += _sent(queue)
            clock.advance(seconds=1)
        assert frozenset().union(*_held(beats)) == frozenset(range(8))
        assert lost and lost <= frozenset().union(*_held(beats))
        assert sorted(len(h) for h in _held(beats)) == [4, 4]
        for _ in range(25):
            for beat in beats:
                beat.tick()
            sent += _sent(queue)
            clock.advance(seconds=1)
        assert len(sent) == len(set(sent)), "a run was sent twice"
        reader = durables[0]
        for i in range(40):
            dues = [r.due for r in reader.schedules.runs(f"job-{i}")]
            assert len(dues) == len(set(dues))
        assert len(sent) >= 40 * 5
    finally:
        for d in durables:
            d.close()


def test_changing_the_count_is_refused_while_a_beat_holds_a_lease(app: Celery, pg_url: str) -> None:
    clock = FakeClock(T0)
    durable = Durable(app, pg_url, clock=clock)
    try:
        beat = durable.dispatcher(owner="only", lease_ttl=4, poll_interval=1)
        beat.tick()
        assert beat.leases.held == frozenset(range(8))
        with pytest.raises(PartitionsError, match="while beats hold leases"):
            set_partitions(durable.journal, 4, clock())
        assert stored_partitions(durable.journal) == 8
        beat.close()
        assert [r for r in read_leases(durable.journal) if r.expires_at >= clock()] == []
        assert set_partitions(durable.journal, 4, clock()).before == 8
    finally:
        durable.close()


# -- the CLI: beats, health, partitions set (D11) ----------------------------------------------


def test_cli_lists_beats_fails_health_on_an_unheld_partition_and_refuses_set_while_held(
    app: Celery, pg_url: str
) -> None:
    from tests.cli.test_cli import as_json, cli, fails

    # The CLI judges leases by the wall clock: the fake clock starts at the real time.
    clock = FakeClock(datetime.now(timezone.utc).replace(microsecond=0))
    durable = Durable(app, pg_url, clock=clock)
    try:
        durable.schedules.create("nightly", "work", rule=Every(timedelta(hours=1)))
        one = durable.dispatcher(owner="beat-one", lease_ttl=600, poll_interval=1)
        two = Durable(app, pg_url, clock=clock).dispatcher(
            owner="beat-two", lease_ttl=600, poll_interval=1
        )
        for _ in range(3):
            one.tick()
            two.tick()
            clock.advance(seconds=1)
        listed = as_json(pg_url, "beats")
        assert listed["partitions"] == 8 and listed["unheld_partitions"] == []
        assert sorted(len(b["partitions"]) for b in listed["beats"]) == [4, 4]
        assert {b["owner"] for b in listed["beats"]} == {"beat-one", "beat-two"}
        assert all(b["lag_seconds"] == 0.0 for b in listed["beats"])
        assert "while beats hold leases" in fails(pg_url, 4, "partitions", "set", "4")
        assert cli(pg_url, "health").exit_code == 0
        assert "must be" in fails(pg_url, 2, "partitions", "set", "0")
        assert "must be" in fails(pg_url, 2, "partitions", "set", "two")
        one.close()
        two.close()
        result = cli(pg_url, "health", "--json")
        report = json.loads(result.stdout)
        assert result.exit_code == 7 and report["unheld_partitions"] == list(range(8))
        assert "8 of 8 partitions have no holder" in report["reason"]
        assert as_json(pg_url, "partitions", "set", "4") == {"partitions": 4, "before": 8}
        assert as_json(pg_url, "partitions", "show") == {"partitions": 4}
    finally:
        durable.close()


def test_the_partition_gauges_name_each_holder(app: Celery, pg_url: str) -> None:
    from prometheus_client import CollectorRegistry

    from celery_durable.observability.metrics import install_metrics

    clock = FakeClock(T0)
    durable = Durable(app, pg_url, clock=clock)
    try:
        registry = CollectorRegistry()
        install_metrics(registry, durable=durable, gauge_ttl=0).disconnect()
        beat = durable.dispatcher(owner="only", lease_ttl=600, poll_interval=1)
        beat.tick()
        for k in range(8):
            assert (
                registry.get_sample_value("celery_durable_partition_held", {"partition": str(k)})
                == 1
            )
            labels = {"partition": str(k), "holder": "only"}
            assert registry.get_sample_value("celery_durable_partition_holder", labels) == 1
        beat.leases.release([3])
        assert registry.get_sample_value("celery_durable_partition_held", {"partition": "3"}) == 0
        beat.close()
    finally:
        durable.close()
