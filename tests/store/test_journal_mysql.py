"""What only MySQL/MariaDB need proving (the shared contract runs in test_journal.py).

utf8mb4 and an exact (binary, no-pad) collation on every table, JSON text stored byte for
byte (beyond the 64 KiB of a ``TEXT``), READ COMMITTED sessions, and connections that the
server closed (``wait_timeout``) or lost (a restart, cut here with a TCP proxy because the
server is shared) being replaced without an error reaching the caller. Real MariaDB, no mocks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from celery_durable.errors import AppendConflict, JournalUnavailable
from celery_durable.store.journal import Append, NewEvent, SqlJournal, schema
from celery_durable.store.journal.encoding import encode_data
from tests.support.tcpproxy import TcpProxy

OUR_TABLES = sorted([*schema.metadata.tables, schema.category_locks.name])


@pytest.fixture
def journal(mysql_url: str) -> Iterator[SqlJournal]:
    j = SqlJournal(mysql_url)
    j.ensure_ready()
    try:
        yield j
    finally:
        j.close()


def _scalar(journal: SqlJournal, sql: str, **params: Any) -> Any:
    with journal.engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def test_every_table_is_innodb_utf8mb4_with_an_exact_collation(journal: SqlJournal) -> None:
    with journal.engine.connect() as conn:
        tables = dict(
            conn.execute(
                sa.text(
                    "SELECT table_name, CONCAT(engine, ' ', table_collation) "
                    "FROM information_schema.tables WHERE table_schema = DATABASE()"
                )
            ).all()
        )
        columns = conn.execute(
            sa.text(
                "SELECT table_name, column_name, character_set_name, collation_name "
                "FROM information_schema.columns WHERE table_schema = DATABASE() "
                "AND character_set_name IS NOT NULL"
            )
        ).all()
    assert sorted(tables) == OUR_TABLES
    assert set(tables.values()) == {"InnoDB utf8mb4_nopad_bin"}
    assert columns  # every text column, keys and JSON alike
    assert {(c.character_set_name, c.collation_name) for c in columns} == {
        ("utf8mb4", "utf8mb4_nopad_bin")
    }


def test_sessions_are_read_committed_and_utf8mb4(journal: SqlJournal) -> None:
    assert _scalar(journal, "SELECT @@session.character_set_client") == "utf8mb4"
    with journal.engine.connect() as conn:
        assert conn.get_isolation_level() == "READ COMMITTED"
    with journal.transaction() as conn:
        assert conn.get_isolation_level() == "READ COMMITTED"


def test_ids_differing_only_in_case_accents_or_trailing_space_are_distinct_streams(
    journal: SqlJournal,
) -> None:
    """The server default (utf8mb4_general_ci, PAD SPACE) would make these one key."""
    streams = ["schedule/Nightly", "schedule/nightly", "schedule/nïghtly", "schedule/nightly "]
    for stream in streams:
        assert journal.append(stream, 0, [NewEvent(type="Created", data={"s": stream})]) == 1
    for stream in streams:
        (event,) = journal.read_stream(stream)
        assert event.data == {"s": stream}


def test_the_longest_names_in_four_byte_characters_fit(journal: SqlJournal) -> None:
    """255 characters of 4 bytes each: 1,020 bytes, inside InnoDB's 3,072-byte key limit."""
    stream = "run/" + "😀" * 251
    event_type = "𝔗" * 128
    journal.append(stream, 0, [NewEvent(type=event_type, data={"k": "😀"})])
    (event,) = journal.read_stream(stream)
    assert (event.stream, event.type) == (stream, event_type)


def test_json_text_comes_back_byte_for_byte_beyond_64_kib(journal: SqlJournal) -> None:
    data = {"text": "ünïcødé 😀 " * 20_000, "n": 1.5, "nested": {"z": [1, None, True]}}
    journal.append("run/big", 0, [NewEvent(type="Big", data=data)])
    raw = _scalar(journal, "SELECT data FROM celery_durable_events WHERE stream = 'run/big'")
    assert raw == encode_data(data)
    assert len(raw.encode()) > 65_535  # would not fit a TEXT column
    assert journal.read_stream("run/big")[0].data == data


def test_a_bulk_append_is_sent_as_multi_row_inserts(journal: SqlJournal) -> None:
    """The bulk path (dispatcher bursts) costs a few statements, not one per event."""
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO CELERY_DURABLE_EVENTS"):
            statements.append(statement)

    sa.event.listen(journal._core, "before_cursor_execute", count)
    try:
        journal.append_many(
            [
                Append(stream=f"run/b{i}", expected_version=0, events=[NewEvent(type="X")])
                for i in range(500)
            ]
        )
    finally:
        sa.event.remove(journal._core, "before_cursor_execute", count)
    assert len(statements) == 1  # one executemany; PyMySQL folds it into multi-row INSERTs
    assert "VALUES" in statements[0].upper()
    assert journal.head("run") >= 500
    assert len(journal.read_all(0, category="run", limit=1000)) == 500


# ----------------------------------------------------------------------------- lost connections


def _idle_connections_expire(url: str, **engine_options: Any) -> SqlJournal:
    """A journal whose sessions the server closes after one idle second (``wait_timeout``)."""
    connect_args = {"init_command": "SET SESSION wait_timeout = 1"}
    return SqlJournal(url, engine_options={"connect_args": connect_args, **engine_options})


def test_connections_closed_by_wait_timeout_are_replaced(mysql_url: str) -> None:
    journal = _idle_connections_expire(mysql_url)
    try:
        assert _scalar(journal, "SELECT @@session.wait_timeout") == 1
        journal.append("schedule/a", 0, [NewEvent(type="One")])
        time.sleep(2.5)  # the server closes the pooled connection
        journal.append("schedule/a", 1, [NewEvent(type="Two")])
        time.sleep(2.5)
        assert [e.type for e in journal.read_stream("schedule/a")] == ["One", "Two"]
    finally:
        journal.close()


def test_without_pre_ping_wait_timeout_surfaces(mysql_url: str) -> None:
    """Control for the test above: the default engine options are what makes it pass."""
    journal = _idle_connections_expire(mysql_url, pool_pre_ping=False)
    try:
        journal.append("schedule/a", 0, [NewEvent(type="One")])
        time.sleep(2.5)
        with pytest.raises(JournalUnavailable) as info:  # the driver's error is the cause
            journal.append("schedule/a", 1, [NewEvent(type="Two")])
        assert isinstance(info.value.__cause__, sa.exc.OperationalError)
    finally:
        journal.close()


def test_a_server_restart_between_appends_is_invisible(mysql_url: str) -> None:
    """Every connection is dropped (as by a restart) while the journal is idle: the next append
    and read work, and nothing written before is lost."""
    parsed = make_url(mysql_url)
    proxy = TcpProxy(parsed.host or "127.0.0.1", parsed.port or 3306)
    proxy.restore()
    journal = SqlJournal(parsed.set(host="127.0.0.1", port=proxy.port).render_as_string(False))
    try:
        for k in range(3):
            journal.append("schedule/r", k, [NewEvent(type="Before", data={"k": k})])
        proxy.cut()  # the server "goes down": every pooled connection dies
        proxy.restore()  # and comes back
        journal.append("schedule/r", 3, [NewEvent(type="After")])
        assert [e.version for e in journal.read_stream("schedule/r")] == [1, 2, 3, 4]
    finally:
        journal.close()
        proxy.cut()


def test_a_deleted_lock_row_costs_one_conflict_then_is_recreated(journal: SqlJournal) -> None:
    """Ordered appends read their category's row of celery_durable_locks FOR UPDATE: without
    it they would store nothing, for ever. The journal recreates it; a retry then works."""
    with journal.engine.begin() as conn:
        conn.execute(sa.delete(schema.category_locks))
    with pytest.raises(AppendConflict):
        journal.append("schedule/s", 0, [NewEvent(type="Created")])
    assert journal.append("schedule/s", 0, [NewEvent(type="Created")]) == 1
    assert [e.version for e in journal.read_stream("schedule/s")] == [1]


def test_an_append_costs_one_statement_and_a_commit(mysql_url: str) -> None:
    """The category lock is inside the INSERT, liveness is checked on the socket (no COM_PING)
    and a committed write skips the pool's ROLLBACK: INSERT + COMMIT, like the floor."""
    journal = SqlJournal(mysql_url, engine_options={"pool_size": 1, "max_overflow": 0})
    journal.ensure_ready()
    names = ("Com_insert_select", "Com_commit", "Com_rollback", "Com_select", "Com_admin_commands")

    def counters() -> dict[str, int]:
        with journal.engine.connect() as conn:
            rows = conn.execute(sa.text("SHOW SESSION STATUS")).all()
        return {name: int(value) for name, value in rows if name in names}

    try:
        idle = counters()
        reading = {name: value - idle[name] for name, value in counters().items()}
        before = counters()
        for k in range(10):
            journal.append("schedule/s", k, [NewEvent(type="T")])
            journal.append("run/r", k, [NewEvent(type="T")])
        after = counters()
    finally:
        journal.close()
    used = {name: after[name] - before[name] - reading[name] for name in names}
    assert used == {
        "Com_insert_select": 20,
        "Com_commit": 20,
        "Com_rollback": 0,
        "Com_select": 0,
        "Com_admin_commands": 0,  # COM_PING would count here
    }
