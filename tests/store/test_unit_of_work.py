"""The unit of work's contract (core/unit_of_work.py; A6, A8, D2, D8), on every store.

Every test taking ``any_store`` runs on the memory store and on the SQL store over SQLite,
PostgreSQL and MariaDB: events, run rows, rows of sent runs and index rows are stored together
or not at all, a conflict stores nothing, and the database's errors leave the store as the
library's own (``JournalUnavailable`` with the driver's error as its cause).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from celery_durable.core.journal import Append, NewEvent
from celery_durable.core.rules import Every
from celery_durable.core.schedule_aggregate import Create, ScheduleState, decide_all
from celery_durable.core.schedule_events import Content
from celery_durable.core.unit_of_work import WAKE_AGAIN_AFTER
from celery_durable.errors import AppendConflict, JournalError, JournalUnavailable
from celery_durable.message import Resend
from celery_durable.store.journal.sql import SqlJournal
from celery_durable.store.memory import MemoryStore
from celery_durable.store.sql_store import SqlStore
from celery_durable.store.stores import AnyStore
from tests.support import services
from tests.support.clock import T0

NOW = T0


@pytest.fixture(params=["memory", "sqlite", "postgres", "mysql"])
def any_store(request: pytest.FixtureRequest) -> Iterator[AnyStore]:
    """The memory store, and the SQL store on each database."""
    store: AnyStore
    if request.param == "memory":
        store = MemoryStore()
    else:
        url = {"sqlite": "sqlite_url", "postgres": "pg_url", "mysql": "mysql_url"}[request.param]
        store = SqlStore(SqlJournal(str(request.getfixturevalue(url))))
    try:
        yield store
    finally:
        store.close()


def ev(type_: str = "Happened", **data: Any) -> NewEvent:
    return NewEvent(type=type_, data=data)


def state_of(sid: str) -> ScheduleState:
    content = Content(task="t", input=None, rule=Every(timedelta(minutes=1)))
    _, state = decide_all(ScheduleState(schedule_id=sid), [Create(content=content, now=NOW)])
    return state


def written(store: AnyStore, run_id: str = "r1", sid: str = "s1") -> tuple[Any, ...]:
    """What the tests write, as read back: the stream, the run row, the index row."""
    events = [(e.type, e.version) for e in store.journal.read_stream(f"run/{run_id}")]
    row = store.run_table().row(run_id)
    index = store.schedule_index().load([sid]).get(sid)
    return events, None if row is None else row["status"], None if index is None else index.version


def test_events_run_row_sent_rows_and_index_rows_are_stored_together(any_store: AnyStore) -> None:
    with any_store.unit_of_work() as unit:
        versions = unit.append(
            [Append(stream="run/r1", expected_version=0, events=[ev("A"), ev("B")])]
        )
        unit.save_run("r1", {"status": "running", "owner": "w", "task": "t"}, now=NOW)
        unit.record_sent([Resend(run_id="r2", task="t2", args=[1])], now=NOW, lease=60)
        unit.save_index([state_of("s1")], now=NOW)
    assert versions == [2]
    assert written(any_store) == ([("A", 1), ("B", 2)], "running", 1)
    runs = any_store.run_table()
    sent = runs.row("r2")
    assert sent is not None and (sent["status"], sent["task"]) == ("queued", "t2")
    assert sent["lease_until"] == NOW + timedelta(seconds=60)
    resend = runs.resend_of("r2")
    assert resend is not None and resend.args == [1]


def test_an_exception_in_the_unit_stores_nothing_of_it(any_store: AnyStore) -> None:
    with pytest.raises(RuntimeError), any_store.unit_of_work() as unit:
        unit.append([Append(stream="run/r1", expected_version=0, events=[ev()])])
        unit.save_run("r1", {"status": "running"}, now=NOW)
        unit.record_sent([Resend(run_id="r2", task="t")], now=NOW, lease=60)
        unit.save_index([state_of("s1")], now=NOW)
        raise RuntimeError("the caller fails before the end of the unit")
    assert written(any_store) == ([], None, None)
    assert any_store.run_table().row("r2") is None


def test_a_conflict_stores_nothing_not_even_the_writes_before_it(any_store: AnyStore) -> None:
    any_store.journal.append("run/r1", 0, [ev("Mine")])
    with pytest.raises(AppendConflict) as info, any_store.unit_of_work() as unit:
        unit.save_run("r1", {"status": "running"}, now=NOW)
        unit.save_index([state_of("s1")], now=NOW)
        unit.append([Append(stream="run/r1", expected_version=0, events=[ev("Theirs")])])
    assert info.value.stream == "run/r1"  # type: ignore[attr-defined]
    assert written(any_store) == ([("Mine", 1)], None, None)
    # A unit that read the stream right goes through afterwards.
    with any_store.unit_of_work() as unit:
        assert unit.append([Append(stream="run/r1", expected_version=1, events=[ev()])]) == [2]


def test_appends_in_one_unit_count_the_ones_before_them(any_store: AnyStore) -> None:
    with any_store.unit_of_work() as unit:
        assert unit.append([Append(stream="run/r1", expected_version=0, events=[ev()])]) == [1]
        assert unit.append([Append(stream="run/r1", expected_version=1, events=[ev()])]) == [2]
    assert [e.version for e in any_store.journal.read_stream("run/r1")] == [1, 2]


def test_a_unit_whose_conflict_was_swallowed_stores_nothing(any_store: AnyStore) -> None:
    with pytest.raises(JournalError, match="rolled back"), any_store.unit_of_work() as unit:
        unit.append([Append(stream="run/r1", expected_version=0, events=[ev()])])
        with pytest.raises(AppendConflict):
            unit.append([Append(stream="run/r1", expected_version=0, events=[ev()])])
    assert any_store.journal.read_stream("run/r1") == []


def test_a_run_row_is_created_then_updated_and_a_sent_row_never_overwrites(
    any_store: AnyStore,
) -> None:
    with any_store.unit_of_work() as unit:  # a fast worker's claim before the dispatcher's row
        unit.save_run("r1", {"status": "running", "owner": "w"}, now=NOW)
    later = NOW + timedelta(seconds=5)
    with any_store.unit_of_work() as unit:
        unit.record_sent([Resend(run_id="r1", task="t")], now=later, lease=60)
        unit.save_run("r1", {"wake_at": later, "message": {"args": [3]}}, now=later)
    row = any_store.run_table().row("r1")
    assert row is not None
    assert (row["status"], row["owner"], row["wake_at"], row["updated_at"]) == (
        "running",
        "w",
        later,
        later,
    )
    resend = any_store.run_table().resend_of("r1")
    assert resend is not None and resend.args == [3]


def test_queued_gives_the_sent_runs_no_worker_has_claimed(any_store: AnyStore) -> None:
    with any_store.unit_of_work() as unit:
        unit.record_sent(
            [Resend(run_id=r, task="t", args=[i]) for i, r in enumerate(["q1", "q2", "c1"])],
            now=NOW,
            lease=60,
        )
        unit.save_run("c1", {"status": "running", "owner": "w"}, now=NOW)
    found = any_store.run_table().queued(["q1", "c1", "unknown", "q2"])
    assert sorted((r.run_id, tuple(r.args)) for r in found) == [("q1", (0,)), ("q2", (1,))]
    assert any_store.run_table().queued([]) == []


def test_only_the_first_wake_of_a_suspended_run_sends_it_until_it_suspends_again(
    any_store: AnyStore,
) -> None:
    """A child's end wakes its parent in its own unit of work (W10): the first one marks the
    suspended row and gets the parent's message, the ones after it nothing, until the parent
    is claimed and suspends again. A run that is not suspended is never woken."""
    message = {"task": "p", "args": [1], "kwargs": {}}
    with any_store.unit_of_work() as unit:
        unit.save_run("p", {"status": "running", "task": "p", "message": message}, now=NOW)
        assert unit.wake("p", now=NOW, lease=60) is None  # running: nothing to wake
    suspended = {"status": "suspended", "owner": None, "lease_until": None}
    with any_store.unit_of_work() as unit:
        unit.save_run("p", {**suspended, "wake_at": NOW + timedelta(hours=1)}, now=NOW)
    with any_store.unit_of_work() as unit:
        woke = unit.wake("p", now=NOW, lease=60)
        assert unit.wake("p", now=NOW, lease=60) is None  # the same unit marked it
    assert woke is not None and (woke.run_id, woke.task) == ("p", "p")
    assert woke.to_json()["args"] == [1]
    for _ in range(2):
        with any_store.unit_of_work() as unit:
            assert unit.wake("p", now=NOW + timedelta(seconds=29), lease=60) is None
    # A mark older than WAKE_AGAIN_AFTER: that wake-up was lost, the next end sends again.
    later = NOW + timedelta(seconds=WAKE_AGAIN_AFTER)
    with any_store.unit_of_work() as unit:
        assert unit.wake("p", now=later, lease=60) is not None
    with any_store.unit_of_work() as unit:
        assert unit.wake("p", now=later, lease=60) is None
    row = any_store.run_table().row("p")
    assert row is not None and row["status"] == "suspended"
    assert row["wake_at"] == NOW + timedelta(hours=1)  # the dispatcher's fallback stays
    with any_store.unit_of_work() as unit:  # claimed, then suspended again
        unit.save_run("p", {"status": "running", "lease_until": NOW}, now=NOW)
    with any_store.unit_of_work() as unit:
        unit.save_run("p", {**suspended, "wake_at": NOW}, now=NOW)
    with any_store.unit_of_work() as unit:
        assert unit.wake("p", now=NOW, lease=60) is not None
    with any_store.unit_of_work() as unit:
        unit.wake("missing", now=NOW, lease=60)  # no row: nothing happens


def test_a_parent_counting_down_its_childrens_ends_is_woken_by_the_last_one_counted(
    any_store: AnyStore,
) -> None:
    """W11: a parent suspended with ``wake_after`` n is counted down by each child's end and
    woken by the n-th; a child that did not finish wakes it at once (``at_once``); the next
    suspension without a countdown is woken by the first end again."""
    message = {"task": "p", "args": [], "kwargs": {}}
    kids = ["p:0.0", "p:0.1", "p:0.2", "p:0.3"]
    with any_store.unit_of_work() as unit:
        unit.save_run("p", {"status": "running", "task": "p", "message": message}, now=NOW)
        unit.record_sent([Resend(run_id=k, task="k") for k in kids], now=NOW, lease=60)
    suspended = {"status": "suspended", "owner": None, "lease_until": None, "wake_at": NOW}
    with any_store.unit_of_work() as unit:
        unit.save_run("p", {**suspended, "wake_after": 3}, now=NOW)
        assert unit.wait_for("p", kids, wake_after=3, now=NOW, lease=60) is None
    for _ in range(2):
        with any_store.unit_of_work() as unit:
            assert unit.wake("p", now=NOW, lease=60) is None  # counted: 3 → 2 → 1
    assert any_store.run_table().row("p")["wake_after"] == 1
    with any_store.unit_of_work() as unit:
        woke = unit.wake("p", now=NOW, lease=60)
    assert woke is not None and woke.run_id == "p"
    row = any_store.run_table().row("p")
    assert row["wake_after"] is None and row["lease_until"] == NOW + timedelta(seconds=60)
    # Suspended again, counting down from 4: a faulted child wakes it at once.
    with any_store.unit_of_work() as unit:
        unit.save_run("p", {**suspended, "wake_after": 4}, now=NOW)
    with any_store.unit_of_work() as unit:
        assert unit.wake("p", now=NOW, lease=60, at_once=True) is not None
    # Suspended without a countdown (a sleep, one child): the first end wakes it.
    with any_store.unit_of_work() as unit:
        unit.save_run("p", {**suspended, "wake_after": None}, now=NOW)
    with any_store.unit_of_work() as unit:
        assert unit.wake("p", now=NOW, lease=60) is not None


def test_a_suspension_that_waits_for_children_counts_those_that_ended_already(
    any_store: AnyStore,
) -> None:
    """W11: the suspension's own look at the children it waits for (in its unit, under the
    row's lock) wakes the parent when enough of them ended while it was getting there, or none
    is left running; otherwise its countdown is never more than the children still running,
    so that the last of them always wakes it."""
    message = {"task": "p", "args": [], "kwargs": {}}
    kids = ["p:0.0", "p:0.1", "p:0.2", "p:0.3"]
    suspended = {"status": "suspended", "owner": None, "lease_until": None, "wake_at": NOW}

    def suspend(wake_after: int) -> Any:
        with any_store.unit_of_work() as unit:
            unit.save_run("p", {**suspended, "wake_after": wake_after}, now=NOW)
            return unit.wait_for("p", kids, wake_after=wake_after, now=NOW, lease=60)

    def end(kid: str) -> None:
        with any_store.unit_of_work() as unit:
            unit.save_run(kid, {"status": "finished", "owner": None}, now=NOW)

    with any_store.unit_of_work() as unit:
        unit.save_run("p", {"status": "running", "task": "p", "message": message}, now=NOW)
        unit.record_sent([Resend(run_id=k, task="k") for k in kids], now=NOW, lease=60)
    assert suspend(2) is None and any_store.run_table().row("p")["wake_after"] == 2
    end(kids[0])
    assert suspend(3) is None  # one of three ended: two more to go
    assert any_store.run_table().row("p")["wake_after"] == 2
    end(kids[1])
    end(kids[2])
    assert suspend(4) is None  # one left running: it wakes the parent, whatever was asked
    assert any_store.run_table().row("p")["wake_after"] == 1
    woke = suspend(2)  # two ended already: woken by its own look
    assert woke is not None and woke.run_id == "p"
    assert any_store.run_table().row("p")["lease_until"] == NOW + timedelta(seconds=60)
    end(kids[3])
    assert suspend(1) is not None  # none left running


def test_the_events_of_given_types_of_many_streams_are_read_at_once(any_store: AnyStore) -> None:
    """How a parent reads its children's ends (W11): one read for many streams."""
    with any_store.unit_of_work() as unit:
        unit.append(
            [
                Append(stream="run/a", expected_version=0, events=[ev("A"), ev("End", n=1)]),
                Append(stream="run/b", expected_version=0, events=[ev("A")]),
                Append(stream="run/c", expected_version=0, events=[ev("End", n=3), ev("End")]),
            ]
        )
    found = any_store.journal.read_streams(["run/c", "run/a", "run/b", "run/none"], types=["End"])
    assert {s: [(e.version, e.data) for e in events] for s, events in found.items()} == {
        "run/a": [(2, {"n": 1})],
        "run/c": [(1, {"n": 3}), (2, {})],
    }
    assert any_store.journal.read_streams([], types=["End"]) == {}
    assert any_store.journal.read_streams(["run/a"], types=[]) == {}


def test_a_run_row_refuses_an_unknown_field_before_anything_is_stored(any_store: AnyStore) -> None:
    with pytest.raises(ValueError, match="'colour'"), any_store.unit_of_work() as unit:
        unit.append([Append(stream="run/r1", expected_version=0, events=[ev()])])
        unit.save_run("r1", {"status": "running", "colour": "red"}, now=NOW)
    assert written(any_store) == ([], None, None)


def test_an_index_row_never_goes_back_in_version(any_store: AnyStore) -> None:
    newer = state_of("s1")
    older = ScheduleState(schedule_id="s1", version=0)
    with any_store.unit_of_work() as unit:
        unit.save_index([newer], now=NOW)
    with any_store.unit_of_work() as unit:
        unit.save_index([older], now=NOW)
    found = any_store.schedule_index().load(["s1"])["s1"]
    assert (found.version, found.content) == (newer.version, newer.content)


def test_bad_events_are_refused_before_anything_is_stored(any_store: AnyStore) -> None:
    with pytest.raises((TypeError, ValueError)), any_store.unit_of_work() as unit:
        unit.save_run("r1", {"status": "running"}, now=NOW)
        unit.append([Append(stream="run/r1", expected_version=0, events=[ev(bad={1, 2})])])
    assert written(any_store) == ([], None, None)


def test_other_readers_never_see_a_unit_before_its_end(any_store: AnyStore) -> None:
    """A reader meanwhile sees the stream as it was, or (the memory store, which keeps one
    writer at a time as SQLite does) waits for the end of the unit; never half of it."""
    seen: list[tuple[list[int], bool]] = []
    committed = threading.Event()

    def read() -> None:
        versions = [e.version for e in any_store.journal.read_stream("run/r1")]
        seen.append((versions, committed.is_set()))

    any_store.journal.read_stream("run/r1")  # connect and create the tables first
    with any_store.unit_of_work() as unit:
        unit.append([Append(stream="run/r1", expected_version=0, events=[ev(), ev()])])
        reader = threading.Thread(target=read)
        reader.start()
        reader.join(0.5)
    committed.set()
    reader.join(10)
    [(versions, after)] = seen
    assert versions == [] or (versions == [1, 2] and after), seen


def test_a_run_without_a_row_is_marked_missed_once(any_store: AnyStore) -> None:
    """P1 when the worker gets there before the dispatcher's row: the row is made ``missed``
    and the dispatcher's later insert leaves it alone; a second mark changes nothing. (This
    insert used to fail on MariaDB, whose dialect has no ``ON CONFLICT``, and to say "marked"
    every time on PostgreSQL, where an INSERT's row count is -1 unless asked to keep it.)"""
    runs = any_store.run_table()
    assert runs.mark_missed("r1", "t", NOW) is True
    assert runs.mark_missed("r1", "t", NOW) is False
    with any_store.unit_of_work() as unit:
        unit.record_sent([Resend(run_id="r1", task="t")], now=NOW, lease=60)
    row = runs.row("r1")
    assert row is not None and row["status"] == "missed"
    with any_store.unit_of_work() as unit:
        unit.save_run("r2", {"status": "running"}, now=NOW)
    assert runs.mark_missed("r2", "t", NOW) is False  # it had started
    assert runs.mark_unstarted("r3", "t", NOW, "failed_to_start") is True  # P5
    assert runs.mark_unstarted("r3", "t", NOW, "failed_to_start") is False
    row = runs.row("r3")
    assert row is not None and row["status"] == "failed_to_start"


# -- the database's errors leave the SQL store as the library's ----------------------------------


def test_a_journal_that_cannot_be_reached_is_journal_unavailable() -> None:
    store = SqlStore(
        SqlJournal(f"postgresql+psycopg://nobody@127.0.0.1:{services.free_port()}/none")
    )
    try:
        with pytest.raises(JournalUnavailable) as info, store.unit_of_work():
            pass  # pragma: no cover - the unit cannot open
        assert info.value.__cause__ is not None
        with pytest.raises(JournalUnavailable):
            store.journal.read_stream("run/r1")
    finally:
        store.close()


@pytest.fixture(params=["postgres", "mysql"])
def losable(request: pytest.FixtureRequest) -> Iterator[tuple[SqlStore, Any]]:
    """A SQL store and a function that kills its server connections."""
    if request.param == "postgres":
        pg_url = str(request.getfixturevalue("pg_url"))
        url, name = services.with_application_name(pg_url)
        store = SqlStore(SqlJournal(url))
        kill: Any = lambda: services.terminate_backends(pg_url, name)  # noqa: E731
    else:
        mysql_url = str(request.getfixturevalue("mysql_url"))
        database = str(make_url(mysql_url).database)
        store = SqlStore(SqlJournal(mysql_url))
        kill = lambda: services.kill_mysql_sessions(mysql_url, database)  # noqa: E731
    try:
        yield store, kill
    finally:
        store.close()


def test_a_connection_lost_in_a_unit_is_journal_unavailable_with_the_driver_error(
    losable: tuple[SqlStore, Any],
) -> None:
    store, kill = losable
    store.journal.read_stream("run/r1")
    with pytest.raises(JournalUnavailable) as info, store.unit_of_work() as unit:
        assert kill() >= 1
        unit.append([Append(stream="run/r1", expected_version=0, events=[ev()])])
    assert info.value.connection_lost
    assert isinstance(info.value.__cause__, sa.exc.OperationalError)
    assert "cannot write to the journal at" in str(info.value) and "\n" not in str(info.value)
    assert store.journal.read_stream("run/r1") == []  # nothing stored; the store works again


def write_run(
    store: AnyStore, append: Append, run_id: str, values: dict[str, Any], **options: Any
) -> tuple[int, Any]:
    """``write_run`` where the store has it, else the unit of work it stands for (as
    ``RunContext.write`` does)."""
    done = store.write_run(append, run_id, values, now=NOW, lease=60, **options)
    if done is not None:
        return done
    with store.unit_of_work() as unit:
        version = unit.append([append])[0]
        unit.save_run(run_id, values, now=NOW)
        woke = None
        if options.get("wake") is not None:
            woke = unit.wake(
                options["wake"], now=NOW, lease=60, at_once=options.get("at_once", False)
            )
    return version, woke


def test_write_run_stores_a_runs_events_its_row_and_its_parents_wake_up_together(
    any_store: AnyStore, request: pytest.FixtureRequest
) -> None:
    """W11 (2026-12-06): a child's claim and end in one statement on PostgreSQL (``write_run``
    answers ``None`` on the other stores: the caller uses a unit of work), with the same
    effect: the events, the run's row (created when it has none), the parent counted down by
    each end and woken by the last one counted."""
    one_statement = "postgres" in request.node.callspec.id
    message = {"task": "p", "args": [], "kwargs": {}}
    with any_store.unit_of_work() as unit:
        unit.save_run("p", {"status": "running", "task": "p", "message": message}, now=NOW)
        unit.save_run(
            "p",
            {"status": "suspended", "owner": None, "lease_until": None, "wake_at": NOW,
             "wake_after": 2},
            now=NOW,
        )  # fmt: skip
    started = [ev("RunStarted"), ev("RunClaimed")]
    claim = {"status": "running", "owner": "w", "lease_until": NOW, "wake_at": None,
             "task": "k", "message": {"args": [1], "kwargs": {}}}  # fmt: skip
    done = any_store.write_run(
        Append(stream="run/k1", expected_version=0, events=started), "k1", claim,
        now=NOW, lease=60,
    )  # fmt: skip
    assert (done is not None) is one_statement
    if done is None:
        write_run(
            any_store,
            Append(stream="run/k1", expected_version=0, events=started), "k1", claim,
        )  # fmt: skip
    else:
        assert done == (2, None)
    row = any_store.run_table().row("k1")  # no row before: created
    assert row is not None and (row["status"], row["task"], row["owner"]) == ("running", "k", "w")
    resend = any_store.run_table().resend_of("k1")
    assert resend is not None and resend.args == [1]
    end = {"status": "finished", "owner": None, "lease_until": None, "wake_at": None}
    counted = write_run(
        any_store, Append(stream="run/k1", expected_version=2, events=[ev("RunFinished")]),
        "k1", end, wake="p",
    )  # fmt: skip
    assert counted == (3, None)
    assert any_store.run_table().row("p")["wake_after"] == 1
    assert any_store.run_table().row("k1")["status"] == "finished"
    write_run(any_store, Append(stream="run/k2", expected_version=0, events=[ev("RunStarted")]),
              "k2", claim)  # fmt: skip
    version, woke = write_run(
        any_store, Append(stream="run/k2", expected_version=1, events=[ev("RunFinished")]),
        "k2", end, wake="p",
    )  # fmt: skip
    assert version == 2 and woke is not None and (woke.run_id, woke.task) == ("p", "p")
    parent = any_store.run_table().row("p")
    assert parent["wake_after"] is None and parent["lease_until"] == NOW + timedelta(seconds=60)
    assert [e.type for e in any_store.journal.read_stream("run/k2")] == [
        "RunStarted", "RunFinished",
    ]  # fmt: skip
    # Marked: the next end sends nothing (its wake-up is in flight).
    write_run(any_store, Append(stream="run/k3", expected_version=0, events=[ev("RunStarted")]),
              "k3", claim)  # fmt: skip
    assert write_run(
        any_store, Append(stream="run/k3", expected_version=1, events=[ev("RunFaulted")]),
        "k3", {**end, "status": "faulted"}, wake="p", at_once=True,
    ) == (2, None)  # fmt: skip


@pytest.mark.parametrize("expected", [0, 5], ids=["taken", "gap"])
def test_write_run_that_conflicts_stores_nothing_and_counts_no_parent_down(
    any_store: AnyStore, expected: int
) -> None:
    """A version taken by another writer, or an expected version past the stream's end: an
    ``AppendConflict``, and neither the run's row nor its parent's countdown changes."""
    with any_store.unit_of_work() as unit:
        unit.save_run(
            "p", {"status": "suspended", "owner": None, "lease_until": None, "wake_after": 2},
            now=NOW,
        )  # fmt: skip
        unit.save_run("k", {"status": "running", "owner": "w"}, now=NOW)
    any_store.journal.append("run/k", 0, [ev("Mine")])
    end = {"status": "finished", "owner": None, "lease_until": None, "wake_at": None}
    with pytest.raises(AppendConflict):
        write_run(
            any_store,
            Append(stream="run/k", expected_version=expected, events=[ev("Theirs"), ev("End")]),
            "k", end, wake="p",
        )  # fmt: skip
    assert [e.type for e in any_store.journal.read_stream("run/k")] == ["Mine"]
    assert any_store.run_table().row("k")["status"] == "running"
    assert any_store.run_table().row("p")["wake_after"] == 2


def test_a_childs_end_during_its_parents_suspension_waits_for_it_and_wakes_it(
    any_store: AnyStore,
) -> None:
    """W11's "no end is missed": a child's end (``write_run`` with ``wake``, one statement on
    PostgreSQL) that comes while its parent's suspension is being stored waits for that
    suspension's commit, since the suspension's look at its children did not see the end,
    and then counts the parent down (here: wakes it, the last one awaited)."""
    message = {"task": "p", "args": [], "kwargs": {}}
    with any_store.unit_of_work() as unit:
        unit.save_run("p", {"status": "running", "task": "p", "message": message}, now=NOW)
        unit.save_run("k", {"status": "running", "owner": "w", "task": "k"}, now=NOW)
    any_store.journal.append("run/k", 0, [ev("RunStarted")])
    end = {"status": "finished", "owner": None, "lease_until": None, "wake_at": None}
    ended: list[Any] = []

    def child_ends() -> None:
        append = Append(stream="run/k", expected_version=1, events=[ev("RunFinished")])
        ended.append(write_run(any_store, append, "k", end, wake="p"))

    child = threading.Thread(target=child_ends)
    with any_store.unit_of_work() as unit:
        unit.save_run(
            "p", {"status": "suspended", "owner": None, "lease_until": None, "wake_at": NOW},
            now=NOW,
        )  # fmt: skip
        child.start()
        child.join(0.5)
        assert child.is_alive() and not ended  # it waits for the parent's row
        assert unit.wait_for("p", ["k"], wake_after=1, now=NOW, lease=60) is None
    child.join(10)
    [(version, woke)] = ended
    assert version == 2 and woke is not None and woke.run_id == "p"
    assert any_store.run_table().row("p")["lease_until"] == NOW + timedelta(seconds=60)
