"""The dispatcher reads its schedules' due times a window at a time (D13).

Start-up brings into memory the due times of the index rows due within ``WINDOW`` of the clock,
not every schedule's; later windows are read as the clock reaches them. Nothing may be lost by
it: every due time of every schedule is still decided once, after a restart and after another
beat took over with a saved read position older than its rows. Real Redis; memory, SQLite,
PostgreSQL and MariaDB stores (``make_durable``, tests/dispatch/conftest.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta

import redis

from celery_durable import Durable, Every
from celery_durable.core.ids import run_id
from celery_durable.dispatch.dispatcher import Dispatcher
from celery_durable.dispatch.state_cache import WINDOW
from tests.support.clock import T0, FakeClock

HOUR = timedelta(hours=1)


def sent_ids(redis_url: str) -> list[str]:
    client = redis.Redis.from_url(redis_url)
    found = []
    while (raw := client.rpop("celery")) is not None:
        found.append(json.loads(raw)["headers"]["id"])
    return found


def run_until(dispatcher: Dispatcher, clock: FakeClock, end: datetime, redis_url: str) -> list[str]:
    """Tick as the beat loop does (sleeping what each tick returns) until ``end``."""
    seen: list[str] = []
    while clock.now < end:
        clock.advance(seconds=dispatcher.tick())
        seen += sent_ids(redis_url)
    return seen


def test_a_restarted_beat_reads_the_due_times_near_the_clock_and_misses_none_later(
    make_durable: Callable[[], Durable], clock: FakeClock, redis_url: str
) -> None:
    # 40 hourly schedules whose due times are spread 80 s apart over the hour.
    first = make_durable()
    anchors = []
    for k in range(40):
        first.schedules.create(f"r{k:02d}", "backup", f"/srv/{k}", Every(HOUR))
        anchors.append(clock.now)
        clock.advance(seconds=80)
    before = first.dispatcher(owner="before", poll_interval=60)
    before.tick()  # the index rows and their read position
    before.close()

    # Restarted 10 s before the first due time: only the due times within the window are read.
    clock.set(anchors[0] + HOUR - timedelta(seconds=10))
    after = make_durable().dispatcher(owner="after", poll_interval=60)
    after.tick()
    near = {f"r{k:02d}" for k, a in enumerate(anchors) if a + HOUR <= clock.now + WINDOW}
    assert after.cache.watching == near
    assert len(near) < 40

    seen = run_until(after, clock, anchors[0] + 2 * HOUR + timedelta(seconds=1), redis_url)
    expected = [
        run_id(f"r{k:02d}", a + n * HOUR)
        for n in (1, 2)
        for k, a in enumerate(anchors)
        if a + n * HOUR <= clock.now
    ]
    assert sorted(seen) == sorted(expected)
    assert len(seen) == len(set(seen)) > 40


def test_a_beat_taking_over_watches_a_schedule_whose_row_is_newer_than_the_saved_position(
    make_durable: Callable[[], Durable], clock: FakeClock, redis_url: str
) -> None:
    # The first beat stores a run's start with the schedule's row, then dies before it saves
    # its read position: the next beat reads that run's events after the position, and the
    # row, due again in ten minutes, lies past its first window.
    first = make_durable()
    first.schedules.create("late", "backup", "/srv", Every(timedelta(minutes=10)))
    dead = first.dispatcher(owner="dead", poll_interval=60)
    dead.tick()
    clock.advance(minutes=10)
    dead.tick()
    assert sent_ids(redis_url) == [run_id("late", T0 + timedelta(minutes=10))]

    clock.advance(seconds=dead.lease_ttl + 1)  # its lease runs out; no close, no checkpoint
    heir = make_durable().dispatcher(owner="heir", poll_interval=60)
    seen = run_until(heir, clock, T0 + timedelta(minutes=20, seconds=1), redis_url)
    assert seen == [run_id("late", T0 + timedelta(minutes=20))]


def test_a_running_beat_reads_the_states_of_a_coming_burst_before_its_due_time(
    make_durable: Callable[[], Durable], clock: FakeClock, redis_url: str
) -> None:
    """Schedules due together at T, seen by a beat started well before: the beat wakes
    ``WINDOW_AHEAD`` before T and reads their states then, so that at T it decides and sends
    them without reading a row; each is still sent once, at T, not before."""
    from celery_durable.dispatch.state_cache import WINDOW_AHEAD

    setup = make_durable()
    for k in range(30):
        setup.schedules.create(f"m{k:02d}", "backup", f"/srv/{k}", Every(HOUR))
    due = clock.now + HOUR
    primer = setup.dispatcher(owner="primer", poll_interval=60)
    primer.tick()  # the index rows and their read position
    primer.close()

    clock.set(due - timedelta(seconds=30))
    dispatcher = make_durable().dispatcher(owner="beat", poll_interval=60)
    sleep = dispatcher.tick()
    assert not dispatcher.cache.states, "nothing is read 30 s ahead"
    assert clock.now + timedelta(seconds=sleep) == due - WINDOW_AHEAD
    clock.advance(seconds=sleep)
    sleep = dispatcher.tick()
    assert sent_ids(redis_url) == []
    assert set(dispatcher.cache.states) == {f"m{k:02d}" for k in range(30)}
    assert clock.now + timedelta(seconds=sleep) == due

    reads: list[list[str]] = []
    real_load = dispatcher.index.load

    def counted_load(schedule_ids=None):  # type: ignore[no-untyped-def]
        reads.append(list(schedule_ids or []))
        return real_load(schedule_ids)

    dispatcher.index.load = counted_load  # type: ignore[method-assign]
    clock.advance(seconds=sleep)
    dispatcher.tick()
    assert reads == [], "the states at T were read from their rows again"
    assert sorted(sent_ids(redis_url)) == sorted(run_id(f"m{k:02d}", due) for k in range(30))
    assert run_until(dispatcher, clock, due + timedelta(minutes=5), redis_url) == []
    dispatcher.close()


def test_a_start_takes_due_times_earliest_first_and_equal_ones_by_schedule_id(
    make_durable: Callable[[], Durable], clock: FakeClock
) -> None:
    """The window read at start-up is sorted by due time only and heapified at once (D13,
    2026-12-06): the schedules due are still handed over earliest first, and those due at the
    same instant in the order of their IDs, whatever order the rows come in."""
    durable = make_durable()
    early = [f"e{k:02d}" for k in (7, 3, 11, 0, 5, 9, 1)]
    late = [f"a{k:02d}" for k in (4, 2, 8, 6)]  # sorts before "e…", due 30 s later
    for sid in early:
        durable.schedules.create(sid, "backup", f"/srv/{sid}", Every(HOUR))
    clock.advance(seconds=30)
    for sid in late:
        durable.schedules.create(sid, "backup", f"/srv/{sid}", Every(HOUR))
    writer = durable.dispatcher(owner="writer", poll_interval=60)
    writer.tick()  # the index rows and their read position
    writer.close()

    clock.advance(seconds=HOUR.total_seconds())  # all due: the early ones 30 s before the late
    starting = make_durable().dispatcher(owner="starting", poll_interval=60)
    now = clock.now
    starting.leases.hold(now)
    starting.load(now)
    assert starting.cache.pop_due(now) == sorted(early) + sorted(late)
    starting.close()
