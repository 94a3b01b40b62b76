"""The journal contract (SPEC A6, A8, D2, §9), run on SQLite, PostgreSQL and MariaDB.

Every test taking ``journal_url`` runs three times (ids ``sqlite``, ``postgres``, ``mysql``);
the contract's own tests (``any_journal``) run on the memory journal too.
Concurrency is tested with real OS processes and real connections; nothing is mocked.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import multiprocessing
import os
import socket
import sqlite3
import subprocess
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_durable.core.journal import Append, Journal, NewEvent, StoredEvent
from celery_durable.errors import AppendConflict, DurableError, JournalError
from celery_durable.store.journal import schema
from celery_durable.store.journal.memory import MemoryJournal
from celery_durable.store.journal.sql import SqlJournal, open_journal, read_all_query
from tests.support.processes import child_env, python_command

# ----------------------------------------------------------------------------- helpers


@pytest.fixture
def journal(journal_url: str) -> Iterator[SqlJournal]:
    j = SqlJournal(journal_url)
    try:
        yield j
    finally:
        j.close()


@pytest.fixture(params=["memory", "sqlite", "postgres", "mysql"])
def any_journal(request: pytest.FixtureRequest) -> Iterator[Journal]:
    """The journal contract's own tests run on the memory journal and on each SQL database."""
    j: Journal
    if request.param == "memory":
        j = MemoryJournal()
    else:
        url = {"sqlite": "sqlite_url", "postgres": "pg_url", "mysql": "mysql_url"}[request.param]
        j = SqlJournal(str(request.getfixturevalue(url)))
    try:
        yield j
    finally:
        j.close()


def ev(type_: str = "Happened", **data: Any) -> NewEvent:
    return NewEvent(type=type_, data=data)


def versions(events: list[StoredEvent]) -> list[int]:
    return [e.version for e in events]


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def schema_rows(j: SqlJournal) -> dict[str, int]:
    with j.engine.connect() as conn:
        rows = conn.execute(sa.select(schema.schema_versions)).all()
    return {component: version for component, version in rows}


def run_children(script: str, args_per_child: list[list[str]], go: Path) -> list[dict[str, Any]]:
    """Start one ``python -c script`` per argument list, wait until each printed ``ready``,
    create the ``go`` file so that they all continue at once, return their JSON results."""
    children = [
        subprocess.Popen(
            python_command("-c", script, *args, str(go)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for args in args_per_child
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stderr is not None
            line = child.stdout.readline()
            if line.strip() != "ready":
                raise AssertionError(f"child not ready: {line!r} {child.stderr.read()}")
        go.touch()
        results = []
        for child in children:
            out, err = child.communicate(timeout=120)
            assert child.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


# ----------------------------------------------------------------------------- round trips


def test_every_journal_satisfies_the_protocol(any_journal: Journal) -> None:
    j: Journal = any_journal  # mypy checks the protocol in sql.py and memory.py; here the names
    for name in ("append", "append_many", "read_stream", "read_all", "head", "close"):
        assert callable(getattr(j, name))


def test_append_and_read_back(any_journal: Journal) -> None:
    new = any_journal.append(
        "schedule/nightly", 0, [ev("Created", task="t", n=1), ev("Paused", why="ünïcødé ✓")]
    )
    assert new == 2
    events = any_journal.read_stream("schedule/nightly")
    assert [(e.stream, e.version, e.type, e.data) for e in events] == [
        ("schedule/nightly", 1, "Created", {"task": "t", "n": 1}),
        ("schedule/nightly", 2, "Paused", {"why": "ünïcødé ✓"}),
    ]
    assert events[0].position < events[1].position
    assert any_journal.read_stream("schedule/other") == []


def test_read_streams_reads_several_streams_at_once_filtered_by_type(
    any_journal: Journal,
) -> None:
    journal: Any = any_journal  # read_streams: the stores' batched read, not the protocol's
    any_journal.append("run/a", 0, [ev("Started"), ev("Step"), ev("Finished", result=1)])
    any_journal.append("run/b", 0, [ev("Started")])
    any_journal.append("run/c", 0, [ev("Started"), ev("Parked"), ev("Faulted")])
    found = journal.read_streams(["run/a", "run/b", "run/c", "run/none", "run/a"])
    assert {s: versions(e) for s, e in found.items()} == {
        "run/a": [1, 2, 3],
        "run/b": [1],
        "run/c": [1, 2, 3],
    }
    assert found["run/a"] == any_journal.read_stream("run/a")
    ended = journal.read_streams(
        ["run/a", "run/b", "run/c"], types=["Finished", "Parked", "Faulted"]
    )
    assert {s: [(e.version, e.type) for e in ev_] for s, ev_ in ended.items()} == {
        "run/a": [(3, "Finished")],
        "run/c": [(2, "Parked"), (3, "Faulted")],
    }
    assert ended["run/a"][0].data == {"result": 1}
    assert journal.read_streams([]) == {}
    many = [f"run/m{i}" for i in range(1100)]
    any_journal.append_many(
        [
            Append(stream=s, expected_version=0, events=[ev("Finished", i=i)])
            for i, s in enumerate(many)
        ]
    )
    assert [e[0].data["i"] for e in journal.read_streams(many, types=["Finished"]).values()] == (
        list(range(1100))
    )


def test_versions_continue_and_read_after_version(any_journal: Journal) -> None:
    assert any_journal.append("run/x", 0, [ev()]) == 1
    assert any_journal.append("run/x", 1, [ev(), ev(), ev()]) == 4
    assert versions(any_journal.read_stream("run/x")) == [1, 2, 3, 4]
    assert versions(any_journal.read_stream("run/x", after_version=2)) == [3, 4]
    assert any_journal.read_stream("run/x", after_version=4) == []


def test_recorded_at_is_aware_utc(any_journal: Journal) -> None:
    before = datetime.now(timezone.utc)
    any_journal.append("run/t", 0, [ev()])
    after = datetime.now(timezone.utc)
    (stored,) = any_journal.read_stream("run/t")
    assert stored.recorded_at.tzinfo is not None
    assert stored.recorded_at.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=1) <= stored.recorded_at <= after + timedelta(seconds=1)
    assert any_journal.read_all(0)[0].recorded_at == stored.recorded_at


def test_data_is_stored_as_compact_json(journal: SqlJournal) -> None:
    journal.append("run/j", 0, [ev(b=[1, 2.5, None, True], a={"é": "ü"})])
    with journal.engine.connect() as conn:
        text = conn.execute(sa.select(schema.events.c.data)).scalar_one()
    assert text == '{"b":[1,2.5,null,true],"a":{"é":"ü"}}'


# ----------------------------------------------------------------------------- conflicts (A8)


def test_stale_expected_version_conflicts_and_stores_nothing(any_journal: Journal) -> None:
    any_journal.append("schedule/s", 0, [ev(), ev()])
    head = any_journal.head()
    for stale in (0, 1):
        with pytest.raises(AppendConflict) as info:
            any_journal.append("schedule/s", stale, [ev("Late"), ev("Later")])
        assert info.value.stream == "schedule/s"
        assert info.value.expected_version == stale
        assert info.value.actual_version == 2
        assert isinstance(info.value, DurableError)
    assert versions(any_journal.read_stream("schedule/s")) == [1, 2]
    assert any_journal.head() == head


def test_expected_version_beyond_the_end_is_refused(any_journal: Journal) -> None:
    any_journal.append("schedule/s", 0, [ev(), ev()])
    for beyond in (3, 5):
        with pytest.raises(AppendConflict) as info:
            any_journal.append("schedule/s", beyond, [ev(), ev()])
        assert info.value.stream == "schedule/s"
        assert info.value.actual_version == 2
    with pytest.raises(AppendConflict):
        any_journal.append("schedule/new", 1, [ev()])  # a stream that does not exist is at 0
    assert versions(any_journal.read_stream("schedule/s")) == [1, 2]
    assert any_journal.read_stream("schedule/new") == []
    assert any_journal.append("schedule/s", 2, [ev()]) == 3  # the right version still works


def test_many_events_beyond_the_end_are_refused(any_journal: Journal) -> None:
    """An append of more events than run as prepared statements one by one (an executemany)
    is refused past the end too: on SQLite the previous version is looked up before the
    insert (``Database.probes_apart``), in the same transaction."""
    any_journal.append("run/s", 0, [ev(), ev()])
    with pytest.raises(AppendConflict) as info:
        any_journal.append("run/s", 3, [ev() for _ in range(5)])
    assert info.value.actual_version == 2
    assert versions(any_journal.read_stream("run/s")) == [1, 2]
    assert any_journal.append("run/s", 2, [ev() for _ in range(5)]) == 7


def test_append_many_stores_all_streams_in_one_transaction(any_journal: Journal) -> None:
    any_journal.append("schedule/a", 0, [ev()])
    any_journal.append_many(
        [
            Append(stream="schedule/a", expected_version=1, events=[ev("A2")]),
            Append(stream="run/b", expected_version=0, events=[ev("B1"), ev("B2")]),
            Append(stream="run/b", expected_version=2, events=[ev("B3")]),  # same batch, later
        ]
    )
    assert versions(any_journal.read_stream("schedule/a")) == [1, 2]
    assert versions(any_journal.read_stream("run/b")) == [1, 2, 3]
    # Positions follow the order of the appends.
    assert [e.type for e in any_journal.read_all(1)] == ["A2", "B1", "B2", "B3"]
    any_journal.append_many([])  # nothing to do, no error


@pytest.mark.parametrize("bad", ["stale", "beyond", "duplicate-in-batch"])
def test_append_many_with_one_conflict_stores_nothing(
    any_journal: Journal, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    any_journal.append("schedule/a", 0, [ev()])
    any_journal.append("schedule/c", 0, [ev(), ev()])
    head = any_journal.head()
    conflicting = {
        "stale": [Append(stream="schedule/c", expected_version=1, events=[ev()])],
        "beyond": [Append(stream="schedule/c", expected_version=7, events=[ev()])],
        "duplicate-in-batch": [
            Append(stream="schedule/c", expected_version=2, events=[ev()]),
            Append(stream="schedule/c", expected_version=2, events=[ev()]),
        ],
    }[bad]
    appends = [
        Append(stream="schedule/a", expected_version=1, events=[ev()]),
        Append(stream="run/new", expected_version=0, events=[ev(), ev()]),
        *conflicting,
        Append(stream="run/after", expected_version=0, events=[ev()]),
    ]
    with pytest.raises(AppendConflict) as info:
        any_journal.append_many(appends)
    assert info.value.stream == "schedule/c"
    assert any_journal.head() == head
    assert versions(any_journal.read_stream("schedule/a")) == [1]
    assert any_journal.read_stream("run/new") == []
    assert any_journal.read_stream("run/after") == []
    # MySQL: explaining the conflict never waits for the failed transaction's own lock row
    # (it did, until innodb_lock_wait_timeout, then logged this).
    assert "could not check the category lock rows" not in caplog.text


def test_append_many_in_large_batches(any_journal: Journal) -> None:
    batch = [Append(stream=f"run/{i}", expected_version=0, events=[ev(i=i)]) for i in range(1200)]
    any_journal.append_many(batch)
    assert any_journal.head("run") > 0
    assert len(any_journal.read_all(0, limit=5000)) == 1200
    # A conflict at the end of a big batch is still attributed to its stream.
    again = [Append(stream=f"run/{i}", expected_version=1, events=[ev()]) for i in range(1199)]
    again.append(Append(stream="run/1199", expected_version=0, events=[ev()]))
    with pytest.raises(AppendConflict) as info:
        any_journal.append_many(again)
    assert info.value.stream == "run/1199"
    assert len(any_journal.read_all(0, limit=5000)) == 1200


# ----------------------------------------------------------------------------- reading


def test_read_all_in_position_order_with_category_after_and_limit(any_journal: Journal) -> None:
    any_journal.append("schedule/a", 0, [ev("s1")])
    any_journal.append("run/x", 0, [ev("r1"), ev("r2")])
    any_journal.append("schedule/b", 0, [ev("s2")])
    any_journal.append("schedule/a", 1, [ev("s3")])
    everything = any_journal.read_all(0)
    assert [e.type for e in everything] == ["s1", "r1", "r2", "s2", "s3"]
    positions = [e.position for e in everything]
    assert positions == sorted(positions)
    assert len(set(positions)) == 5

    assert [e.type for e in any_journal.read_all(0, category="schedule")] == ["s1", "s2", "s3"]
    assert [e.type for e in any_journal.read_all(0, category="run")] == ["r1", "r2"]
    assert any_journal.read_all(0, category="nothing") == []
    assert [e.type for e in any_journal.read_all(positions[1])] == ["r2", "s2", "s3"]
    assert [e.type for e in any_journal.read_all(positions[1], category="schedule")] == ["s2", "s3"]
    assert [e.type for e in any_journal.read_all(0, limit=2)] == ["s1", "r1"]
    assert [e.type for e in any_journal.read_all(0, category="schedule", limit=2)] == ["s1", "s2"]
    assert any_journal.read_all(positions[-1]) == []
    with pytest.raises(ValueError):
        any_journal.read_all(0, limit=0)
    with pytest.raises(ValueError):
        any_journal.read_all(-1)


def test_head(any_journal: Journal) -> None:
    assert any_journal.head() == 0
    assert any_journal.head("schedule") == 0
    any_journal.append("schedule/a", 0, [ev()])
    any_journal.append("run/x", 0, [ev(), ev()])
    events = any_journal.read_all(0)
    assert any_journal.head() == events[-1].position
    assert any_journal.head("schedule") == events[0].position
    assert any_journal.head("run") == events[-1].position
    assert any_journal.head("other") == 0


def test_read_all_by_category_uses_the_category_index(sqlite_url: str) -> None:
    j = SqlJournal(sqlite_url)
    try:
        j.ensure_ready()
        query = read_all_query(10, category="schedule", limit=100)
        compiled = query.compile(dialect=j.engine.dialect, compile_kwargs={"literal_binds": True})
        with j.engine.connect() as conn:
            plan = " ".join(
                str(row[-1]) for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}")
            )
        assert "ix_celery_durable_events_category_position" in plan
        assert "TEMP B-TREE" not in plan  # no sort: the index gives the order
    finally:
        j.close()


def test_a_bulk_appends_guard_reads_the_stream_index_not_the_whole_table_on_postgres(
    pg_url: str,
) -> None:
    """The dispatcher's append of a thousand streams at once first reads their versions (A8).
    On PostgreSQL that read must probe the ``(stream, version)`` index per stream: a scan of
    the events table would cost every burst round time that grows with the journal."""
    j = SqlJournal(pg_url)
    try:
        j.ensure_ready()
        for batch in range(4):  # 20,000 streams of one event each
            j.append_many(
                [
                    Append(stream=f"schedule/s{batch}-{i:04d}", expected_version=0, events=[ev()])
                    for i in range(5000)
                ]
            )
        with j.engine.connect() as conn:
            conn.exec_driver_sql("ANALYZE celery_durable_events")
            conn.commit()
        seen: list[tuple[str, Any]] = []

        def capture(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
            if "max(" in statement.lower() and not executemany:
                seen.append((statement, parameters))

        # On this journal's engine only: a listener on the Engine class would stay behind
        # (SQLAlchemy marks the class as listened to for good).
        sa.event.listen(j._core, "before_cursor_execute", capture)
        try:
            j.append_many(
                [
                    Append(stream=f"schedule/s1-{i:04d}", expected_version=1, events=[ev()])
                    for i in range(1000)
                ]
            )
        finally:
            sa.event.remove(j._core, "before_cursor_execute", capture)
        assert len(seen) == 1, seen
        statement, parameters = seen[0]
        with j.engine.connect() as conn:
            plan = "\n".join(
                str(row[0]) for row in conn.exec_driver_sql("EXPLAIN " + statement, parameters)
            )
        assert "Seq Scan on celery_durable_events" not in plan, plan
        assert "uq_celery_durable_events" in plan or "Index" in plan, plan
    finally:
        j.close()


# ----------------------------------------------------------------------------- bad input


BAD_APPENDS: list[tuple[str, Any, int, Any]] = [
    ("nan", "run/x", 0, [NewEvent(type="T", data={"x": math.nan})]),
    ("infinity", "run/x", 0, [NewEvent(type="T", data={"x": [1, math.inf]})]),
    ("int key", "run/x", 0, [NewEvent(type="T", data={"x": {1: "one"}})]),
    ("object", "run/x", 0, [NewEvent(type="T", data={"x": object()})]),
    ("datetime", "run/x", 0, [NewEvent(type="T", data={"at": datetime.now(timezone.utc)})]),
    ("tuple", "run/x", 0, [NewEvent(type="T", data={"x": (1, 2)})]),
    ("surrogate", "run/x", 0, [NewEvent(type="T", data={"x": "\udc80"})]),
    ("data not a dict", "run/x", 0, [NewEvent(type="T", data=[1])]),  # type: ignore[arg-type]
    ("empty type", "run/x", 0, [NewEvent(type="", data={})]),
    ("long type", "run/x", 0, [NewEvent(type="T" * 129, data={})]),
    ("empty stream", "", 0, [NewEvent(type="T")]),
    ("long stream", "run/" + "x" * 252, 0, [NewEvent(type="T")]),
    ("long category", "c" * 65 + "/x", 0, [NewEvent(type="T")]),
    ("NUL in stream", "run/\x00", 0, [NewEvent(type="T")]),
    ("stream not str", b"run/x", 0, [NewEvent(type="T")]),
    ("no events", "run/x", 0, []),
    ("not a NewEvent", "run/x", 0, [{"type": "T", "data": {}}]),
    ("negative version", "run/x", -1, [NewEvent(type="T")]),
    ("bool version", "run/x", True, [NewEvent(type="T")]),
]


@pytest.mark.parametrize(
    ("stream", "expected", "events"),
    [case[1:] for case in BAD_APPENDS],
    ids=[case[0] for case in BAD_APPENDS],
)
def test_bad_input_is_refused_before_anything_is_stored(
    any_journal: Journal, stream: Any, expected: Any, events: Any
) -> None:
    with pytest.raises((ValueError, TypeError)):
        any_journal.append(stream, expected, events)
    good = Append(stream="run/good", expected_version=0, events=[ev()])
    with pytest.raises((ValueError, TypeError)):
        any_journal.append_many(
            [good, Append(stream=stream, expected_version=expected, events=events)]
        )
    assert any_journal.head() == 0


def test_a_stream_of_255_characters_is_accepted(any_journal: Journal) -> None:
    stream = "run/" + "x" * 251
    assert any_journal.append(stream, 0, [NewEvent(type="T" * 128)]) == 1
    assert any_journal.read_stream(stream)[0].type == "T" * 128


JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=40)
@given(data=st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=5))
def test_any_json_data_round_trips(any_journal: Journal, data: dict[str, Any]) -> None:
    stream = f"run/{uuid.uuid4().hex}"
    any_journal.append(stream, 0, [NewEvent(type="T", data=data)])
    assert any_journal.read_stream(stream)[0].data == data


# ----------------------------------------------------------------------------- caller's transaction


def test_append_in_a_callers_transaction_commits_with_the_callers_rows(
    journal: SqlJournal,
) -> None:
    with journal.transaction() as conn:
        assert journal.append_in(
            conn,
            [
                Append(stream="schedule/a", expected_version=0, events=[ev(), ev()]),
                Append(stream="run/b", expected_version=0, events=[ev()]),
            ],
        ) == [2, 1]
        conn.execute(sa.insert(schema.progress).values(name="index", position=3))
        # The transaction sees its own appends.
        assert journal.append_in(
            conn, [Append(stream="schedule/a", expected_version=2, events=[ev()])]
        ) == [3]
    assert versions(journal.read_stream("schedule/a")) == [1, 2, 3]
    with journal.engine.connect() as c:
        assert c.execute(sa.select(schema.progress.c.position)).scalar_one() == 3


def test_an_exception_rolls_back_appends_and_the_callers_rows(journal: SqlJournal) -> None:
    with pytest.raises(RuntimeError), journal.transaction() as conn:
        journal.append_in(conn, [Append(stream="schedule/a", expected_version=0, events=[ev()])])
        conn.execute(sa.insert(schema.progress).values(name="index", position=3))
        raise RuntimeError("boom")
    assert journal.head() == 0
    with journal.engine.connect() as c:
        assert c.execute(sa.select(sa.func.count()).select_from(schema.progress)).scalar() == 0


def test_a_swallowed_conflict_rolls_the_transaction_back(journal: SqlJournal) -> None:
    journal.append("schedule/c", 0, [ev()])
    with pytest.raises(JournalError, match="rolled back"), journal.transaction() as conn:
        journal.append_in(conn, [Append(stream="schedule/a", expected_version=0, events=[ev()])])
        with pytest.raises(AppendConflict):
            journal.append_in(
                conn,
                [
                    Append(stream="run/x", expected_version=0, events=[ev()]),
                    Append(stream="schedule/c", expected_version=0, events=[ev()]),
                ],
            )
    assert [e.stream for e in journal.read_all(0)] == ["schedule/c"]


def test_append_in_needs_a_journal_transaction(journal: SqlJournal) -> None:
    journal.ensure_ready()
    with journal.engine.begin() as conn, pytest.raises(JournalError, match="transaction"):
        journal.append_in(conn, [Append(stream="run/x", expected_version=0, events=[ev()])])


def test_nested_writes_in_one_thread_are_refused_instead_of_hanging(journal: SqlJournal) -> None:
    with journal.transaction() as conn:
        journal.append_in(conn, [Append(stream="schedule/a", expected_version=0, events=[ev()])])
        with pytest.raises(JournalError, match="already open"):
            journal.append("schedule/b", 0, [ev()])
        with pytest.raises(JournalError, match="already open"):
            journal.append_many([Append(stream="run/c", expected_version=0, events=[ev()])])
        with pytest.raises(JournalError, match="already open"), journal.transaction():
            pass
        assert journal.read_stream("schedule/a") == []  # not committed yet
    assert [e.stream for e in journal.read_all(0)] == ["schedule/a"]
    assert journal.append("schedule/b", 0, [ev()]) == 1  # usable again after the block


# ----------------------------------------------------------------------------- life cycle, schema


def test_construction_connects_to_nothing_and_first_use_fails_clearly() -> None:
    url = f"postgresql://user:secret@127.0.0.1:{closed_port()}/nowhere"
    j = SqlJournal(url)  # must not raise: nothing listens there
    with pytest.raises(ValueError):  # input is checked before any connection is attempted
        j.append("run/x", 0, [NewEvent(type="T", data={"x": math.nan})])
    with pytest.raises(JournalError) as info:
        j.head()
    assert "127.0.0.1" in str(info.value)
    assert "secret" not in str(info.value)
    j.close()
    j.close()


def test_sqlite_file_and_directories_are_created_on_first_use(tmp_path: Path) -> None:
    path = tmp_path / "not" / "yet" / "journal.db"
    j = SqlJournal(f"sqlite:///{path}")
    assert not path.parent.exists()  # construction touches nothing
    assert j.head() == 0
    assert path.exists()
    assert set(schema.metadata.tables) <= set(sa.inspect(j.engine).get_table_names())
    with j.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    j.close()
    normal = SqlJournal(f"sqlite:///{path}", sqlite_synchronous="normal")
    with normal.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1
    normal.close()


def test_a_new_sqlite_journal_has_small_pages_and_an_older_file_keeps_its_own(
    tmp_path: Path,
) -> None:
    """A new file gets 2 KiB pages (a step's commit syncs fewer bytes, sqlite.PAGE_SIZE); a
    file created before, with SQLite's 4 KiB pages, is opened and written as it is."""
    new = SqlJournal(f"sqlite:///{tmp_path / 'new.db'}")
    new.append("run/a", 0, [NewEvent(type="One")])
    with new.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA page_size").scalar() == 2048
        assert conn.exec_driver_sql("PRAGMA auto_vacuum").scalar() == 2  # INCREMENTAL
    new.close()
    older = tmp_path / "older.db"
    with sqlite3.connect(older) as raw:
        raw.execute("PRAGMA page_size = 4096")
        raw.execute("CREATE TABLE before_the_journal (x INTEGER)")
    j = SqlJournal(f"sqlite:///{older}")
    assert j.append("run/a", 0, [NewEvent(type="One"), NewEvent(type="Two")]) == 2
    with pytest.raises(AppendConflict):
        j.append("run/a", 3, [NewEvent(type="Gap")])
    with j.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA page_size").scalar() == 4096
    assert [e.type for e in j.read_stream("run/a")] == ["One", "Two"]
    j.close()


def test_relative_sqlite_path_is_resolved_when_the_journal_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    j = SqlJournal("sqlite:///data/j.db")
    monkeypatch.chdir("/")
    j.append("run/x", 0, [ev()])
    assert (tmp_path / "data" / "j.db").exists()
    j.close()


def test_tables_and_schema_row_are_created_on_first_use(journal: SqlJournal) -> None:
    assert journal.head() == 0
    tables = set(sa.inspect(journal.engine).get_table_names())
    assert {
        "celery_durable_events",
        "celery_durable_schema",
        "celery_durable_schedule_index",
        "celery_durable_progress",
    } <= tables
    assert schema_rows(journal) == dict(schema.SCHEMA_VERSIONS)
    # A second journal on the same database finds everything in place.
    other = SqlJournal(journal.engine.url.render_as_string(hide_password=False))
    assert other.head() == 0
    assert schema_rows(other) == dict(schema.SCHEMA_VERSIONS)
    other.close()


def test_a_newer_schema_version_is_refused(journal_url: str) -> None:
    first = SqlJournal(journal_url)
    first.ensure_ready()
    with first.engine.begin() as conn:
        conn.execute(sa.update(schema.schema_versions).values(version=999))
    first.close()
    newer = SqlJournal(journal_url)
    with pytest.raises(JournalError) as info:
        newer.read_all(0)
    current = schema.SCHEMA_VERSIONS["journal"]
    assert "999" in str(info.value) and f"version {current}" in str(info.value)
    assert info.value.stored_version == 999
    assert info.value.code_version == current
    newer.close()


def test_an_older_schema_version_is_migrated(
    journal_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = SqlJournal(journal_url)
    first.append("run/x", 0, [ev()])
    first.close()
    ran: list[int] = []

    def to_2(conn: sa.Connection) -> None:
        ran.append(conn.execute(sa.select(sa.func.count()).select_from(schema.events)).scalar())

    current = schema.SCHEMA_VERSIONS["journal"]
    monkeypatch.setitem(schema.SCHEMA_VERSIONS, "journal", current + 1)
    monkeypatch.setitem(schema._MIGRATIONS, ("journal", current + 1), to_2)
    upgraded = SqlJournal(journal_url)
    assert upgraded.head() > 0
    assert ran == [1]
    assert schema_rows(upgraded) == {"journal": current + 1}
    upgraded.close()

    # no migration to current + 2 registered
    monkeypatch.setitem(schema.SCHEMA_VERSIONS, "journal", current + 2)
    with pytest.raises(JournalError, match="no migration"):
        SqlJournal(journal_url).ensure_ready()


def test_ddl_creates_what_the_journal_expects(journal_url: str) -> None:
    # Without a connection the DDL follows the URL's dialect: MariaDB's collation names need
    # a mariadb:// URL (the test server is MariaDB; docs/howto-mysql.md).
    sql = schema.ddl(journal_url.replace("mysql+pymysql://", "mariadb+pymysql://"))
    assert "CREATE TABLE celery_durable_events" in sql
    assert "CREATE INDEX ix_celery_durable_events_category_position" in sql
    assert "INSERT INTO celery_durable_schema" in sql
    engine = sa.create_engine(SqlJournal(journal_url).engine.url)
    with engine.begin() as conn:
        for statement in filter(None, (s.strip() for s in sql.split(";\n"))):
            conn.exec_driver_sql(statement)
    engine.dispose()
    j = SqlJournal(journal_url)
    assert j.append("run/x", 0, [ev()]) == 1
    assert schema_rows(j) == dict(schema.SCHEMA_VERSIONS)
    j.close()


def test_close_is_idempotent_and_final(any_journal: Journal) -> None:
    any_journal.append("run/x", 0, [ev()])
    any_journal.close()
    any_journal.close()
    with pytest.raises(JournalError, match="closed"):
        any_journal.read_stream("run/x")


# ----------------------------------------------------------------------------- URLs


def test_urls_are_normalised() -> None:
    for url in ("postgres://u@h/db", "postgresql://u@h/db", "postgresql+psycopg://u@h/db"):
        assert SqlJournal(url).engine.url.drivername == "postgresql+psycopg"
    assert open_journal("sqlite:///x.db").engine.url.database == os.path.abspath("x.db")


def test_mysql_urls_are_normalised() -> None:
    default = "mysqldb" if importlib.util.find_spec("MySQLdb") else "pymysql"
    cases = {
        "mysql://u@h/db": f"mysql+{default}",
        "mariadb://u@h/db": f"mariadb+{default}",
        "mysql+pymysql://u@h/db": "mysql+pymysql",
        "mariadb+pymysql://u@h/db?charset=utf8mb4": "mariadb+pymysql",
    }
    for url, driver in cases.items():
        engine_url = SqlJournal(url).engine.url
        assert engine_url.drivername == driver
        assert engine_url.query["charset"] == "utf8mb4"  # 4-byte UTF-8 on the wire


@pytest.mark.parametrize(
    "url",
    ["sqlite://", "sqlite:///:memory:", "sqlite:///file.db?mode=memory", "sqlite+pysqlite://"],
)
def test_memory_databases_are_refused(url: str) -> None:
    with pytest.raises(JournalError, match="memory database cannot be shared"):
        SqlJournal(url)


@pytest.mark.parametrize(
    "url",
    [
        "mysql+mysqlconnector://u@h/db",
        "postgresql+psycopg2://u@h/db",
        "sqlite+aiosqlite:///x.db",
        "x",
    ],
)
def test_unsupported_urls_are_refused(url: str) -> None:
    with pytest.raises(JournalError, match=r"unsupported|cannot be parsed"):
        SqlJournal(url)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("mysql+pymysql://u@h/db?charset=utf8", "utf8mb4 character set"),
        ("mysql+pymysql://u@h/db?charset=latin1", "utf8mb4 character set"),
        ("mariadb+pymysql://u@h", "needs a database name"),
    ],
)
def test_mysql_urls_that_cannot_hold_the_journal_are_refused(url: str, words: str) -> None:
    with pytest.raises(JournalError, match=words):
        SqlJournal(url)


def test_passwords_never_show(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    j = SqlJournal(f"postgresql://user:secret@127.0.0.1:{closed_port()}/db?sslpassword=hush")
    assert j.url.startswith("postgresql+psycopg://user:***@127.0.0.1:")
    for text in (j.url, repr(j), str(j), repr(j.engine)):
        assert "secret" not in text and "hush" not in text
    with pytest.raises(JournalError) as info:
        j.ensure_ready()
    logging.getLogger("celery_durable").info("journal is %s", j.url)
    for text in (str(info.value), repr(info.value), caplog.text):
        assert "secret" not in text and "hush" not in text
    with pytest.raises(JournalError) as bad:
        SqlJournal("postgresql//user:secret@host/db")
    assert "secret" not in str(bad.value)
    assert bad.value.__context__ is None or "secret" not in str(bad.value.__context__)


# ----------------------------------------------------------------------------- processes (A8)

RACER = textwrap.dedent(
    """
    import json, os, sys, time
    from celery_durable.errors import AppendConflict
    from celery_durable.core.journal import NewEvent
    from celery_durable.store.journal.sql import SqlJournal

    url, stream, name, rounds, go = sys.argv[1:6]
    journal = SqlJournal(url)
    journal.ensure_ready()
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.0005)
    tries = []
    for k in range(int(rounds)):
        expected = 1
        while True:
            try:
                event = NewEvent(type="Decided", data={"by": name, "k": k})
                journal.append(stream, expected, [event])
                tries.append("won")
                break
            except AppendConflict:
                tries.append("conflict")
                expected = journal.read_stream(stream)[-1].version
    print(json.dumps({"name": name, "tries": tries}))
    journal.close()
    """
)


def test_two_processes_appending_at_the_same_version(journal_url: str, tmp_path: Path) -> None:
    """A8: both start from version 1 at the same moment; one wins, the other conflicts, re-reads
    and succeeds; the stream holds both decisions, numbered without gaps."""
    j = SqlJournal(journal_url)
    j.append("schedule/race", 0, [ev("Created")])
    results = run_children(
        RACER, [[journal_url, "schedule/race", name, "1"] for name in ("p1", "p2")], tmp_path / "go"
    )
    outcomes = sorted(tuple(r["tries"]) for r in results)
    assert outcomes == [("conflict", "won"), ("won",)]
    stored = j.read_stream("schedule/race")
    assert versions(stored) == [1, 2, 3]
    assert sorted(e.data["by"] for e in stored[1:]) == ["p1", "p2"]
    j.close()


def test_many_processes_contending_for_one_stream(journal_url: str, tmp_path: Path) -> None:
    j = SqlJournal(journal_url)
    j.append("run/hot", 0, [ev("Started")])
    names = [f"p{i}" for i in range(4)]
    rounds = 15
    results = run_children(
        RACER, [[journal_url, "run/hot", name, str(rounds)] for name in names], tmp_path / "go"
    )
    assert all(r["tries"].count("won") == rounds for r in results)
    stored = j.read_stream("run/hot")
    assert versions(stored) == list(range(1, 2 + len(names) * rounds))
    written = sorted((e.data["by"], e.data["k"]) for e in stored[1:])
    assert written == sorted((name, k) for name in names for k in range(rounds))
    j.close()


STARTER = textwrap.dedent(
    """
    import json, os, sys, time
    from celery_durable.core.journal import NewEvent
    from celery_durable.store.journal.sql import SqlJournal

    url, name, go = sys.argv[1:4]
    journal = SqlJournal(url)
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.0005)
    version = journal.append("run/" + name, 0, [NewEvent(type="Hello")])
    print(json.dumps({"version": version}))
    journal.close()
    """
)


def test_processes_starting_together_on_a_new_database(journal_url: str, tmp_path: Path) -> None:
    """Table creation races: every process creates the tables (or finds them) and works."""
    names = [f"p{i}" for i in range(4)]
    results = run_children(STARTER, [[journal_url, name] for name in names], tmp_path / "go")
    assert [r["version"] for r in results] == [1] * len(names)
    j = SqlJournal(journal_url)
    assert len(j.read_all(0)) == len(names)
    assert schema_rows(j) == dict(schema.SCHEMA_VERSIONS)
    j.close()


# ----------------------------------------------------------------------------- ordering (D2)


class HeldAppend:
    """Append in a transaction that stays open until :meth:`commit` (another thread)."""

    def __init__(self, journal: SqlJournal, stream: str) -> None:
        self.appended = threading.Event()
        self._release = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(journal, stream), daemon=True)
        self._thread.start()
        assert self.appended.wait(10), "the held append did not happen"

    def _run(self, journal: SqlJournal, stream: str) -> None:
        try:
            with journal.transaction() as conn:
                journal.append_in(conn, [Append(stream=stream, expected_version=0, events=[ev()])])
                self.appended.set()
                self._release.wait(30)
        except BaseException as exc:  # reported by commit()
            self._error = exc
            self.appended.set()

    def commit(self) -> None:
        self._release.set()
        self._thread.join(30)
        if self._error is not None:
            raise self._error


def append_in_thread(journal: SqlJournal, stream: str) -> threading.Event:
    done = threading.Event()

    def run() -> None:
        journal.append(stream, 0, [ev()])
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


@pytest.fixture(params=["postgres", "mysql"])
def server_url(request: pytest.FixtureRequest) -> str:
    """A database server that draws positions at INSERT (sequence, AUTO_INCREMENT), not at
    COMMIT: where commit order can differ from position order without the category lock."""
    fixture = {"postgres": "pg_url", "mysql": "mysql_url"}[request.param]
    return str(request.getfixturevalue(fixture))


def test_ordered_category_commits_in_position_order(server_url: str) -> None:
    """D2: while A's transaction (holding a ``schedule`` event) is open, B's ``schedule`` append
    waits, so a reader never sees B's event (higher position) before A's."""
    journal = SqlJournal(server_url)
    journal.ensure_ready()
    try:
        a = HeldAppend(journal, "schedule/a")
        b_done = append_in_thread(journal, "schedule/b")
        assert not b_done.wait(1.0), "B committed while A (lower position) was still open"
        assert journal.read_all(0, category="schedule") == []
        # Unordered categories do not queue behind A.
        assert append_in_thread(journal, "run/c").wait(10)
        a.commit()
        assert b_done.wait(10)
        seen = journal.read_all(0, category="schedule")
        assert [e.stream for e in seen] == ["schedule/a", "schedule/b"]
        assert seen[0].position < seen[1].position
        # B drew its position only once it held the lock, after C (which did not wait): with
        # two waiters, positions drawn before the lock could commit in the wrong order.
        (c,) = journal.read_stream("run/c")
        assert c.position < seen[1].position
    finally:
        journal.close()


def test_without_the_lock_a_position_reader_can_skip_events(server_url: str) -> None:
    """Control for the test above: with no ordered category, B commits a higher position
    while A is open, and a reader resuming after B's position would never see A."""
    journal = SqlJournal(server_url, ordered_categories=())
    journal.ensure_ready()
    try:
        a = HeldAppend(journal, "schedule/a")
        assert append_in_thread(journal, "schedule/b").wait(10)
        (b,) = journal.read_all(0, category="schedule")
        a.commit()
        (a_event,) = journal.read_stream("schedule/a")
        assert a_event.position < b.position
        assert journal.read_all(b.position, category="schedule") == []  # A is skipped
    finally:
        journal.close()


def test_several_ordered_categories_in_one_transaction(journal_url: str) -> None:
    journal = SqlJournal(journal_url, ordered_categories=("schedule", "timer"))
    journal.ensure_ready()
    try:
        held = HeldAppend(journal, "timer/t")
        done = threading.Event()

        def both() -> None:
            journal.append_many(
                [
                    Append(stream="schedule/s", expected_version=0, events=[ev()]),
                    Append(stream="timer/u", expected_version=0, events=[ev()]),
                ]
            )
            done.set()

        threading.Thread(target=both, daemon=True).start()
        # Waits: for the timer lock (PostgreSQL, MySQL), for the write lock (SQLite).
        assert not done.wait(0.5)
        held.commit()
        assert done.wait(10)
        streams = [e.stream for e in journal.read_all(0)]
        assert streams == ["timer/t", "schedule/s", "timer/u"]
    finally:
        journal.close()


def test_sqlite_write_transactions_take_the_write_lock_at_begin(sqlite_url: str) -> None:
    """BEGIN IMMEDIATE: a write transaction owns the write lock before its first statement, so
    two writers queue instead of both reading and then deadlocking on the upgrade."""
    import sqlite3

    journal = SqlJournal(sqlite_url)
    journal.ensure_ready()
    path = sa.engine.make_url(sqlite_url).database
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        writer = journal.engine.execution_options(celery_durable_write=True)
        for opener in (journal.transaction, writer.begin):
            with opener(), pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
            other.execute("BEGIN IMMEDIATE")
            other.execute("ROLLBACK")
        # A plain transaction on the public engine is a real (deferred) one.
        with journal.engine.begin() as conn:
            assert conn.connection.driver_connection.in_transaction  # type: ignore[union-attr]
            other.execute("BEGIN IMMEDIATE")  # deferred: no lock yet
            other.execute("ROLLBACK")
    finally:
        other.close()
        journal.close()


def test_a_position_following_reader_misses_nothing(journal_url: str) -> None:
    """Writers hold their transactions open for a random moment while a reader follows
    ``read_all(last position seen, category="schedule")``: it must see every event."""
    journal = SqlJournal(journal_url)
    journal.ensure_ready()
    writers, per_writer = 4, 15
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            for k in range(per_writer):
                with journal.transaction() as conn:
                    journal.append_in(
                        conn, [Append(stream=f"schedule/w{w}", expected_version=k, events=[ev()])]
                    )
                    time.sleep(0.002 * ((w + k) % 3))
        except BaseException as exc:
            errors.append(exc)

    def read() -> None:
        last = 0
        while True:
            finished = stop.is_set()
            for event_ in journal.read_all(last, category="schedule"):
                seen.append(event_.position)
                last = event_.position
            if finished:
                return

    reader = threading.Thread(target=read)
    reader.start()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stop.set()
    reader.join(60)
    journal.close()
    assert not errors
    assert len(seen) == writers * per_writer
    assert seen == sorted(seen)


# ----------------------------------------------------------------------------- fork


def _child_after_fork(journal: SqlJournal, parent_pid: int | None, queue: Any) -> None:
    try:
        journal.append("run/child", 0, [ev()])
        pid = None
        if journal.engine.dialect.name == "postgresql":
            with journal.engine.connect() as conn:
                pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
        queue.put(("ok", pid != parent_pid if parent_pid else True))
    except BaseException as exc:
        queue.put(("error", repr(exc)))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_forked_child_does_not_reuse_the_parents_connections(journal: SqlJournal) -> None:
    journal.append("run/parent", 0, [ev()])
    parent_pid = None
    if journal.engine.dialect.name == "postgresql":
        with journal.engine.connect() as conn:
            parent_pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_after_fork, args=(journal, parent_pid, queue))
    child.start()
    status, detail = queue.get(timeout=60)
    child.join(60)
    assert (status, detail) == ("ok", True)
    # The parent's pooled connection still works.
    assert journal.append("run/parent", 1, [ev()]) == 2
    assert {e.stream for e in journal.read_all(0)} == {"run/parent", "run/child"}


# -- the bulk path (many streams in one append_many, as the dispatcher writes) --------------


def _ev(n: int) -> NewEvent:
    return NewEvent(type="Tested", data={"n": n})


def test_bulk_append_many_streams(journal: SqlJournal) -> None:
    streams = [f"schedule/bulk-{i}" for i in range(100)]
    journal.append_many([Append(stream=s, expected_version=0, events=[_ev(0)]) for s in streams])
    journal.append_many(
        [Append(stream=s, expected_version=1, events=[_ev(1), _ev(2)]) for s in streams]
    )
    assert [e.version for e in journal.read_stream(streams[42])] == [1, 2, 3]
    assert journal.head("schedule") == 300


@pytest.mark.parametrize("expected", [0, 2], ids=["stale", "beyond-the-end"])
def test_bulk_append_with_one_wrong_version_stores_nothing(
    journal: SqlJournal, expected: int
) -> None:
    streams = [f"schedule/bulk-{i}" for i in range(100)]
    journal.append_many([Append(stream=s, expected_version=0, events=[_ev(0)]) for s in streams])
    head = journal.head()
    appends = [Append(stream=s, expected_version=1, events=[_ev(1)]) for s in streams]
    appends[57] = Append(stream=streams[57], expected_version=expected, events=[_ev(1)])
    with pytest.raises(AppendConflict) as info:
        journal.append_many(appends)
    assert info.value.stream == streams[57]
    assert journal.head() == head


def test_bulk_append_loses_a_race_it_could_not_see_coming(server_url: str) -> None:
    """A writer commits a version after the bulk path's version check: COPY (PostgreSQL) or the
    multi-row INSERT (MySQL) refuses the row.

    ``run`` streams take no ordering lock, so the check and the insert can be overtaken.
    """
    journal = SqlJournal(server_url)
    streams = [f"run/bulk-{i}" for i in range(100)]
    journal.append_many([Append(stream=s, expected_version=0, events=[_ev(0)]) for s in streams])
    inserted, release = threading.Event(), threading.Event()

    def other_writer() -> None:
        with journal.transaction() as conn:
            journal.append_in(
                conn, [Append(stream=streams[57], expected_version=1, events=[_ev(9)])]
            )
            inserted.set()
            release.wait(10)

    other = threading.Thread(target=other_writer)
    other.start()
    assert inserted.wait(10)
    outcome: list[BaseException | None] = []

    def bulk() -> None:
        try:
            journal.append_many(
                [Append(stream=s, expected_version=1, events=[_ev(1)]) for s in streams]
            )
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    bulk_thread = threading.Thread(target=bulk)
    bulk_thread.start()
    time.sleep(0.5)  # the check has passed; the COPY waits for the other writer's row
    assert not outcome
    release.set()
    other.join(10)
    bulk_thread.join(10)
    journal.close()
    assert isinstance(outcome[0], AppendConflict)
    assert outcome[0].stream == streams[57]
    again = SqlJournal(server_url)
    assert [e.data["n"] for e in again.read_stream(streams[57])] == [0, 9]
    assert [e.version for e in again.read_stream(streams[3])] == [1]
    again.close()


def test_version_2_adds_the_index_origin_column_on_every_database(journal_url: str) -> None:
    """Journal schema 2 (2026-12-04, D13): a version-1 index table (no ``origin`` column, no
    index on it) gains both at the next start, with the origin of the rows that have one."""
    first = SqlJournal(journal_url)
    first.ensure_ready()
    index_name = "ix_celery_durable_schedule_index_origin"
    beat = {"content": {"options": {"beat_entry": "nightly"}}}
    with first.engine.begin() as conn:
        for sid, state in (("nightly", beat), ("api", {"content": {"options": {}}})):
            conn.execute(sa.insert(schema.schedule_index).values(
                schedule_id=sid, version=1, format=1, state=json.dumps(state),
                updated_at=datetime.now(timezone.utc), origin=None,
            ))  # fmt: skip
        table = "celery_durable_schedule_index"
        if conn.dialect.name in schema.MYSQL_DIALECTS:
            conn.exec_driver_sql(f"DROP INDEX {index_name} ON {table}")
        else:
            conn.exec_driver_sql(f"DROP INDEX {index_name}")
        conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN origin")
        conn.execute(sa.update(schema.schema_versions).values(version=1))
    first.close()
    upgraded = SqlJournal(journal_url)
    upgraded.ensure_ready()
    assert schema_rows(upgraded) == dict(schema.SCHEMA_VERSIONS)
    found = sa.inspect(upgraded.engine)
    assert index_name in {i["name"] for i in found.get_indexes("celery_durable_schedule_index")}
    with upgraded.engine.connect() as conn:
        rows = conn.execute(
            sa.select(schema.schedule_index.c.schedule_id, schema.schedule_index.c.origin)
        )
        assert dict(rows.all()) == {"nightly": "beat_schedule", "api": None}
    upgraded.close()


@pytest.mark.parametrize(
    "instant",
    [
        datetime(2026, 12, 6, 10, 0, 0, 123456, tzinfo=timezone.utc),
        datetime(2026, 12, 6, 10, 0, 0, tzinfo=timezone.utc),  # no microseconds: still 6 digits
        datetime(5, 1, 2, 3, 4, 5, 6, tzinfo=timezone.utc),  # a year of one digit
        datetime(2026, 12, 6, 12, 0, 0, 7, tzinfo=timezone(timedelta(hours=2))),  # not UTC
    ],
)
def test_sqlite_instants_are_stored_as_sqlalchemy_writes_them(instant: datetime) -> None:
    """The fast path of ``UtcDateTime`` on SQLite writes the same text as SQLAlchemy's own
    processor (text that sorts in time order, read back by the result processor)."""
    from sqlalchemy.dialects import sqlite

    dialect = sqlite.dialect()
    fast = schema.UtcDateTime().dialect_impl(dialect).bind_processor(dialect)
    slow = sa.DateTime().dialect_impl(dialect).bind_processor(dialect)
    assert fast is not None and slow is not None
    expected = slow(instant.astimezone(timezone.utc).replace(tzinfo=None))
    assert fast(instant) == expected
    assert len(expected) == 26
    read = schema.UtcDateTime().dialect_impl(dialect).result_processor(dialect, None)
    assert read is not None and read(expected) == instant
    with pytest.raises(ValueError, match="naive"):
        fast(instant.replace(tzinfo=None))
