"""The schedule index projection (D2) on real journals."""

from __future__ import annotations

import logging
import re
import threading
import time
from datetime import timedelta, timezone

import pytest
from celery import Celery
from sqlalchemy import event, text, update

from celery_durable import CatchUp, Durable, Every
from celery_durable.core.journal import Append
from celery_durable.core.schedule_events import ScheduleCreated, to_new_event
from celery_durable.dispatch.state_cache import INDEX_CHECKPOINT
from celery_durable.store.index import PROJECTION
from celery_durable.store.journal.schema import progress, schedule_index
from tests.support.clock import T0, FakeClock

UTC = timezone.utc


@pytest.fixture
def app() -> Celery:
    app = Celery("index_tests", broker="memory://", set_as_current=False)
    app.task(name="noop", shared=False)(_noop)
    return app


def _noop(*args: object) -> None:  # pragma: no cover - never runs
    return None


def run_history(durable: Durable, clock: FakeClock, schedules: int, seconds: int) -> None:
    for i in range(schedules):
        durable.schedules.create(f"s{i}", "noop", None, Every(timedelta(seconds=1)), CatchUp.ALL)
    dispatcher = durable.dispatcher()
    for _ in range(seconds):
        clock.now += timedelta(seconds=1)
        dispatcher.tick()
    dispatcher.close()


def test_start_up_reads_only_events_after_the_position(durable: Durable, clock: FakeClock) -> None:
    run_history(durable, clock, schedules=3, seconds=20)
    position = durable.index.position()
    assert 100 < position <= durable.journal.head("schedule")
    positions_read: list[int] = []

    def spy(conn, cursor, statement, parameters, context, executemany):
        # MySQL quotes the column: `position`.
        if "celery_durable_events" in statement and re.search(r"position`? >", statement):
            if isinstance(parameters, dict):  # psycopg, PyMySQL: named parameters
                positions_read.extend(v for k, v in parameters.items() if k.startswith("position"))
            else:  # sqlite: the position comes first, then LIMIT and OFFSET
                positions_read.append(parameters[0])

    engine = durable.journal._core  # the pool every journal statement goes through
    event.listen(engine, "before_cursor_execute", spy)
    try:
        fresh = durable.dispatcher()
        clock.now += timedelta(milliseconds=10)
        fresh.tick()
    finally:
        event.remove(engine, "before_cursor_execute", spy)
    assert positions_read and min(positions_read) >= position


def test_index_rows_follow_the_events(durable: Durable, clock: FakeClock) -> None:
    run_history(durable, clock, schedules=2, seconds=5)
    rows = durable.index.load()
    assert set(rows) == {"s0", "s1"}
    for sid, state in rows.items():
        assert state == durable._store.load(sid)
        assert state.runs_decided == 5


def test_rows_follow_every_tick_and_every_burst(
    durable: Durable, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(10):
        durable.schedules.create(f"s{i}", "noop", None, Every(timedelta(seconds=1)), CatchUp.ALL)
    d = durable.dispatcher()
    monkeypatch.setattr("celery_durable.dispatch.dispatcher.CHUNK", 4)
    clock.now += timedelta(milliseconds=1500)
    d.tick()  # ten due, four per round: a burst; its rows are written once it is recorded
    rows = durable.index.load()
    assert {s.runs_decided for s in rows.values()} == {1}
    assert all(rows[sid] == durable._store.load(sid) for sid in rows)
    monkeypatch.setattr("celery_durable.dispatch.dispatcher.CHUNK", 1000)
    clock.now += timedelta(seconds=1)
    d.tick()  # one round: the rows go in with the starts
    rows = durable.index.load()
    assert {s.runs_decided for s in rows.values()} == {2}
    assert all(rows[sid] == durable._store.load(sid) for sid in rows)
    # The read position moves at most once per INDEX_CHECKPOINT: behind the own events now.
    assert durable.index.position() < durable.journal.head("schedule")
    clock.now += INDEX_CHECKPOINT
    d.refresh(clock.now)
    assert durable.index.position() == durable.journal.head("schedule")
    d.close()


def test_a_dispatcher_that_dies_between_checkpoints_loses_nothing(
    durable: Durable, clock: FakeClock
) -> None:
    durable.schedules.create("s0", "noop", None, Every(timedelta(seconds=1)), CatchUp.ALL)
    first = durable.dispatcher(owner="first")
    for _ in range(3):
        clock.now += timedelta(milliseconds=400)
        first.tick()  # no close(): like kill -9, the rows of the last ticks are never written
    behind = durable.index.load()["s0"]
    clock.now += timedelta(seconds=11)  # the first one's lease runs out
    second = durable.dispatcher(owner="second")
    second.tick()
    second.close()
    row = durable.index.load()["s0"]
    assert row == durable._store.load("s0")
    assert row.runs_decided > behind.runs_decided
    decided = [
        e.data["due"] for e in durable.journal.read_stream("schedule/s0") if e.type == "RunDecided"
    ]
    assert len(decided) == len(set(decided)) == row.runs_decided  # each due time once


def test_missing_index_table_is_rebuilt_from_events(
    durable: Durable, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    run_history(durable, clock, schedules=2, seconds=5)
    before = {sid: s for sid, s in durable.index.load().items()}
    with durable.journal.engine.begin() as conn:
        conn.execute(text("DROP TABLE celery_durable_schedule_index"))
    durable.close()
    again = Durable(durable.app, str(durable.config.url), clock=clock)
    with caplog.at_level(logging.WARNING, logger="celery_durable.index"):
        d = again.dispatcher()
        clock.now += timedelta(seconds=1)
        d.tick()
    assert any("rebuild" in r.getMessage() for r in caplog.records)
    d.close()  # the rows of its own decisions are written at the checkpoint, at the latest here
    after = again.index.load()
    assert after["s0"].runs_decided == before["s0"].runs_decided + 1
    again.close()


def test_unreadable_row_is_named_and_the_index_rebuilt(
    durable: Durable, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    run_history(durable, clock, schedules=2, seconds=3)
    with durable.journal.transaction() as conn:
        conn.execute(
            update(schedule_index)
            .where(schedule_index.c.schedule_id == "s1")
            .values(state='{"format": 99}')
        )
        # Make the dispatcher read the row: a new event for s1 after the position.
    durable.schedules.pause("s1")
    with caplog.at_level(logging.WARNING):
        d = durable.dispatcher()
        clock.now += timedelta(seconds=1)
        d.tick()
    assert any("'s1'" in r.getMessage() and "unreadable" in r.getMessage() for r in caplog.records)
    d.close()
    rows = durable.index.load()
    assert rows["s1"].paused and rows["s0"].runs_decided == 4


def test_state_reads_row_plus_newer_events(durable: Durable, clock: FakeClock) -> None:
    run_history(durable, clock, schedules=1, seconds=3)
    durable.schedules.pause("s0")  # not folded into the row yet
    view = durable.schedules.state("s0")
    assert view is not None and view.paused and view.runs_decided == 3


@pytest.fixture(params=["postgres", "mysql"])
def server_url(request: pytest.FixtureRequest) -> str:
    """PostgreSQL or MariaDB: positions drawn at INSERT, so commits can come out of order."""
    return str(request.getfixturevalue({"postgres": "pg_url", "mysql": "mysql_url"}[request.param]))


def test_out_of_order_commits_are_not_skipped(
    server_url: str, app: Celery, clock: FakeClock
) -> None:
    """Writer A takes a position and holds its transaction; writer B appends after it.

    Without ordering, B would commit first with the higher position, the projection would read
    it and move past A's position for ever. The journal makes B wait for A (D2).
    """
    durable = Durable(app, server_url, clock=clock)
    durable.schedules.create("seed", "noop", None, Every(timedelta(minutes=1)))
    dispatcher = durable.dispatcher()
    dispatcher.tick()
    from celery_durable.core.rules import Every as E
    from celery_durable.core.schedule_events import Content

    created = ScheduleCreated(
        at=T0, content=Content(task="noop", input=None, rule=E(timedelta(minutes=1)))
    )
    a_holding = threading.Event()
    release_a = threading.Event()
    b_done = threading.Event()

    def writer_a() -> None:
        with durable.journal.transaction() as conn:
            durable.journal.append_in(
                conn,
                [Append(stream="schedule/a", expected_version=0, events=[to_new_event(created)])],
            )
            a_holding.set()
            release_a.wait(10)

    def writer_b() -> None:
        durable.journal.append("schedule/b", 0, [to_new_event(created)])
        b_done.set()

    ta = threading.Thread(target=writer_a)
    ta.start()
    assert a_holding.wait(10)
    tb = threading.Thread(target=writer_b)
    tb.start()
    time.sleep(0.5)
    dispatcher.refresh(clock.now)  # runs while A holds its position
    b_committed_first = b_done.is_set()
    release_a.set()
    ta.join(10)
    tb.join(10)
    dispatcher.refresh(clock.now)
    rows = durable.index.load()
    durable.close()
    assert not b_committed_first, "B committed before A: positions committed out of order"
    assert {"a", "b", "seed"} <= set(rows), "the projection skipped an event"
    _ = progress, PROJECTION
