"""A step's append and a run's read on SQLite skip SQLAlchemy when nobody listens to it
(celery_durable/store/journal/direct.py, 2026-12-06): the same rows, the same events, the same
errors as through SQLAlchemy (W2, A8), and SQLAlchemy's path whenever something would see it."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from celery_durable.core.journal import NewEvent, StoredEvent
from celery_durable.errors import AppendConflict, JournalError
from celery_durable.store.journal import direct, schema
from celery_durable.store.journal.encoding import _stored, decode_data, decode_many, stored_events
from celery_durable.store.journal.sql import SqlJournal


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[SqlJournal]:
    j = SqlJournal(f"sqlite:///{tmp_path / 'journal.db'}")
    try:
        yield j
    finally:
        j.close()


def _listened(journal: SqlJournal) -> list[str]:
    """Make SQLAlchemy's statement events heard on the journal's engine; the statements."""
    seen: list[str] = []
    sa.event.listen(journal._core, "before_cursor_execute", lambda *a: seen.append(a[2]))
    return seen


def _event(i: int, **extra: Any) -> NewEvent:
    return NewEvent(type="StepCompleted", data={"v": 1, "position": i, "result": i, **extra})


def test_a_steps_append_and_a_runs_read_take_the_direct_path(journal: SqlJournal) -> None:
    journal.append("run/a", 0, [_event(0)])
    assert journal._direct is not None and journal._direct.usable()
    assert len(journal._direct._spare) == 1  # the connection went back to the free list
    events = journal.read_stream("run/a")
    assert [(e.version, e.type, e.data) for e in events] == [(1, "StepCompleted", _event(0).data)]
    assert len(journal._direct._spare) == 1  # and is used again


def test_the_direct_read_equals_sqlalchemys(journal: SqlJournal) -> None:
    datas = [
        {"v": 1, "result": 10**20},  # beyond 64 bits: read by json, not orjson
        {"v": 1, "result": -(2**63)},
        {"v": 1, "result": 1.5, "text": "é\u2028😀", "nested": {"a": [1, None, True]}},
        {"v": 1, "result": "1234567890123456789 digits in a string"},
        {},
    ]
    for version, data in enumerate(datas):
        journal.append("run/b", version, [NewEvent(type=f"T{version}", data=data)])
    direct_all = journal.read_stream("run/b")
    direct_tail = journal.read_stream("run/b", 2)
    _listened(journal)
    assert not journal._direct.usable()  # type: ignore[union-attr]
    assert journal.read_stream("run/b") == direct_all
    assert journal.read_stream("run/b", 2) == direct_tail
    assert [e.data for e in direct_all] == datas
    assert type(direct_all[0].data["result"]) is int
    for event in direct_all:
        assert type(event) is StoredEvent
        assert event.recorded_at.tzinfo is timezone.utc
        with pytest.raises(AttributeError):
            event.version = 7  # type: ignore[misc]


def test_stale_and_gapped_direct_appends_conflict_and_store_nothing(journal: SqlJournal) -> None:
    journal.append("run/c", 0, [_event(0)])
    with pytest.raises(AppendConflict) as stale:
        journal.append("run/c", 0, [_event(1)])
    assert stale.value.actual_version == 1
    with pytest.raises(AppendConflict) as gap:
        journal.append("run/c", 5, [_event(1)])  # the trigger refuses a gap (A8)
    assert gap.value.actual_version == 1
    assert [e.version for e in journal.read_stream("run/c")] == [1]
    assert journal.append("run/c", 1, [_event(1)]) == 2


def test_a_listener_of_sqlalchemys_events_sees_every_statement(journal: SqlJournal) -> None:
    journal.append("run/d", 0, [_event(0)])
    seen = _listened(journal)
    journal.append("run/d", 1, [_event(1)])
    journal.read_stream("run/d")
    assert any(s.startswith("INSERT INTO celery_durable_events") for s in seen)
    assert any(s.startswith("SELECT") and "celery_durable_events" in s for s in seen)


def test_sql_logging_takes_sqlalchemys_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = SqlJournal(f"sqlite:///{tmp_path / 'echo.db'}", echo=True)
    try:
        journal.ensure_ready()
        assert journal._direct is not None and not journal._direct.usable()
        with caplog.at_level(logging.INFO, logger="sqlalchemy.engine"):
            journal.append("run/e", 0, [_event(0)])
        assert any("INSERT INTO celery_durable_events" in r.getMessage() for r in caplog.records)
    finally:
        journal.close()


def test_a_pool_checkout_listener_takes_sqlalchemys_path(journal: SqlJournal) -> None:
    checkouts: list[Any] = []
    sa.event.listen(journal.engine, "checkout", lambda *a: checkouts.append(a))
    journal.append("run/f", 0, [_event(0)])
    journal.read_stream("run/f")
    assert len(checkouts) >= 2


def test_a_dead_connection_is_not_used_again(journal: SqlJournal) -> None:
    journal.append("run/g", 0, [_event(0)])
    dead = journal._direct._spare[0]  # type: ignore[union-attr]
    dead.close()
    with pytest.raises(JournalError) as failed:
        journal.append("run/g", 1, [_event(1)])
    assert isinstance(failed.value.__cause__, sa.exc.DBAPIError)
    assert failed.value.__cause__.connection_invalidated
    assert isinstance(failed.value.__cause__.orig, sqlite3.ProgrammingError)
    assert dead not in journal._direct._spare  # type: ignore[union-attr]
    assert journal.append("run/g", 1, [_event(1)]) == 2
    assert [e.version for e in journal.read_stream("run/g")] == [1, 2]


def test_an_error_of_the_read_leaves_as_the_journals(journal: SqlJournal) -> None:
    journal.append("run/h", 0, [_event(0)])
    with journal._core.begin() as conn:
        conn.execute(
            sa.insert(schema.events).values(
                stream="run/h", version=2, category="run", type="Bad", data="{not json",
                recorded_at=datetime.now(timezone.utc),
            )
        )  # fmt: skip
    with pytest.raises(JournalError, match="is not JSON") as direct_error:
        journal.read_stream("run/h")
    _listened(journal)
    with pytest.raises(JournalError, match="is not JSON") as sa_error:
        journal.read_stream("run/h")
    assert str(direct_error.value) == str(sa_error.value)


def test_close_closes_the_free_connections(journal: SqlJournal) -> None:
    journal.append("run/i", 0, [_event(0)])
    conn = journal._direct._spare[0]  # type: ignore[union-attr]
    journal.close()
    assert journal._direct._spare == []  # type: ignore[union-attr]
    with pytest.raises(sqlite3.ProgrammingError):
        conn.execute("SELECT 1")
    with pytest.raises(JournalError, match="closed"):
        journal.append("run/i", 1, [_event(1)])


def test_a_forked_child_leaves_the_parents_connections_alone(journal: SqlJournal) -> None:
    journal.append("run/j", 0, [_event(0)])
    inherited = journal._direct._spare[0]  # type: ignore[union-attr]
    journal._after_fork_in_child()  # what os.register_at_fork runs in a child
    assert journal._direct._spare == []  # type: ignore[union-attr]
    assert inherited in direct._FORKED_AWAY  # never closed, never used
    inherited.execute("SELECT 1")  # still open
    assert journal.append("run/j", 1, [_event(1)]) == 2
    assert journal._direct._spare[0] is not inherited  # type: ignore[union-attr]


def test_threads_take_their_own_connections(journal: SqlJournal) -> None:
    import threading

    journal.append("run/k", 0, [_event(0)])
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(20):
                journal.append(f"run/k{n}", i, [_event(i)])
                assert len(journal.read_stream(f"run/k{n}")) == i + 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert 1 <= len(journal._direct._spare) <= 4  # type: ignore[union-attr]


def test_decode_many_reads_as_decode_data_does() -> None:
    texts = ['{"a":1}', '{"b":[1.5,"x"]}', '{"c":123456789012345678901}', '{"d":"\\ud800"}']
    assert decode_many(texts, [1, 2, 3, 4]) == [decode_data(t, i) for i, t in enumerate(texts)]
    assert type(decode_many(texts, [1, 2, 3, 4])[2]["c"]) is int
    with pytest.raises(JournalError, match="position 8"):
        decode_many(['{"a":1}', "{"], [7, 8])
    assert decode_many([], []) == []


def test_stored_events_equal_those_of_sqlalchemys_rows() -> None:
    at = datetime(2026, 12, 6, 14, 0, 0, 123456, tzinfo=timezone.utc)
    rows = [(5, "run/x", 1, "T", '{"v":1}', at), (6, "run/x", 2, "U", '{"w":[]}', at)]
    assert stored_events(rows, lambda value: value) == [_stored(row) for row in rows]
