"""The journal on SQLite: a file, one writer at a time.

SQLite writers queue instead of deadlocking: write transactions start with ``BEGIN IMMEDIATE``,
so the write lock is taken before anything is read, and two processes never both hold a read
lock and wait for each other to upgrade it. A lone append of one event (a durable step's result)
is one ``INSERT`` in autocommit mode instead, which takes the write lock the same way. The file
runs in WAL mode (readers do not block the writer) with ``synchronous = FULL`` unless the caller
chose otherwise.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Table, event
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from celery_durable.errors import JournalError
from celery_durable.store.journal import schema
from celery_durable.store.journal.database import Database, WriteConnection
from celery_durable.store.journal.urls import sqlite_path

__all__ = ["SQLITE_BUSY_TIMEOUT_S", "SYNCHRONOUS_MODES", "WRITE_OPTION", "SqliteDatabase"]

log = logging.getLogger("celery_durable.journal.sql")

SQLITE_BUSY_TIMEOUT_S = 30.0
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
#: Execution option for ``journal.engine``: on SQLite, transactions of a connection carrying it
#: start with ``BEGIN IMMEDIATE`` (``journal.engine.execution_options(celery_durable_write=True)``).
WRITE_OPTION = "celery_durable_write"
VACUUM_PAGES = 2000
"""Pages :meth:`SqliteDatabase.return_space` hands back per transaction."""
PAGE_SIZE = 2048
"""Page size of a new journal file (bytes). A durable step's commit writes about four pages to
the WAL (the events table, its two indexes, ``sqlite_sequence``), each synced with
``synchronous = FULL``: with 2 KiB pages instead of SQLite's 4 KiB the commit writes half the
bytes and costs ~10 µs less (measured 2026-12-06, docs/durable-tasks.md). An existing file
keeps its page size."""


class SqliteDatabase(Database):
    """SQLite through the standard library's ``sqlite3``."""

    serialises_writers = True
    # PLAIN_INSERT's INSERT … SELECT reads the events table it writes, so SQLite runs the SELECT
    # into a temporary table first and inserts from there. The table's trigger refuses a gap
    # instead (schema.SQLITE_GAP_TRIGGER, journal version 5) and an event goes in with a plain
    # INSERT … VALUES. A step's result, that one statement, runs alone in autocommit mode: an
    # implicit transaction, committed (and with synchronous=FULL synced) by SQLite at its end.
    # It takes the write lock when it starts, waiting for other writers through the busy
    # handler like BEGIN IMMEDIATE, as it has read nothing before. Together ~25 µs less per
    # step (measured 2026-12-06, docs/durable-tasks.md).
    refuses_gaps = True
    autocommits_one_row = True
    # A step's INSERT and a delivery's read of its stream skip SQLAlchemy's connection and
    # execution set-up, ~30 µs per step (:mod:`.direct`, measured 2026-12-06).
    direct_statements = True

    def __init__(self, url: URL, shown: str, *, synchronous: str = "FULL") -> None:
        super().__init__(url, shown)
        schema.use_dialect_options("sqlite")  # the events' AUTOINCREMENT, before CREATE TABLE
        mode = str(synchronous).upper()
        if mode not in SYNCHRONOUS_MODES:
            raise ValueError(
                f"sqlite_synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}, "
                f"not {synchronous!r}"
            )
        self.synchronous = mode
        self.page_size = PAGE_SIZE

    def connect_args(self) -> dict[str, Any]:
        return {"timeout": SQLITE_BUSY_TIMEOUT_S}

    def listen(self, core: Engine, engine_options: Mapping[str, Any] | None) -> Engine:
        # Two views of one pool. The journal's own write transactions emit BEGIN IMMEDIATE
        # themselves (begin_write). ``journal.engine``, for everyone else, carries SQLAlchemy's
        # documented begin-event recipe, so that any transaction opened on it is a real one. The
        # hot path avoids the recipe only because a connection-event listener makes every
        # statement of its engine dispatch events, which costs ~20 µs per append (docs/journal.md).
        event.listen(core, "connect", self._on_connect)
        engine = core.execution_options()
        event.listen(engine, "begin", _on_begin)
        return engine

    def prepare(self) -> None:
        path = sqlite_path(self.url)
        if path is None:
            return
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        except OSError as exc:
            raise JournalError(f"cannot create the directory of {self.shown}: {exc}") from exc

    def create_schema(
        self, core: Engine, write_connection: WriteConnection, lock_categories: Sequence[str]
    ) -> None:
        with write_connection() as conn:  # BEGIN IMMEDIATE serialises the initialisers
            schema.ensure_schema(conn)

    def insert(self, table: Table) -> Any:
        return sqlite.insert(table)

    def return_space(
        self, engine: Engine, write_connection: WriteConnection, more: Callable[[], bool]
    ) -> None:
        """Hand freed pages back to the file system (``auto_vacuum = INCREMENTAL``), a few at
        a time, while ``more()``.

        A journal created before retention existed has ``auto_vacuum = NONE``; its freed pages
        stay in the file and are reused by new rows, so the file stops growing instead of
        shrinking (``VACUUM`` once converts it, docs/retention.md).
        """
        with engine.connect() as conn:
            mode = int(conn.exec_driver_sql("PRAGMA auto_vacuum").scalar() or 0)
        if mode != 2:
            return
        before = None
        while more():
            with write_connection() as conn:
                free = int(conn.exec_driver_sql("PRAGMA freelist_count").scalar() or 0)
                if free == 0 or free == before:
                    return
                conn.exec_driver_sql(f"PRAGMA incremental_vacuum({VACUUM_PAGES})")
            before = free

    def autocommit(self, conn: Connection) -> None:
        """Nothing to switch: the driver's connections never open a transaction by themselves
        (``isolation_level = None``, :meth:`_on_connect`), so a statement outside
        :meth:`begin_write` is its own transaction."""

    def is_version_conflict(self, exc: DBAPIError) -> bool:
        """A duplicate version (the unique constraint), or a row past the end of its stream
        refused by the events table's trigger (:data:`.schema.SQLITE_GAP_TRIGGER`)."""
        if isinstance(exc, IntegrityError) and schema.SQLITE_GAP_MESSAGE in str(exc.orig):
            return True
        return super().is_version_conflict(exc)

    def begin_write(self, conn: Connection) -> None:
        # isolation_level=None: sqlite3 sends no BEGIN of its own, and SQLAlchemy's begin()
        # sends none for SQLite; COMMIT/ROLLBACK still go through the driver.
        conn.connection.driver_connection.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]

    def _on_connect(self, dbapi_conn: Any, _record: Any) -> None:
        # Take BEGIN away from the sqlite3 module (it would start write transactions lazily as
        # DEFERRED, which deadlocks two writers that both read first): we emit it ourselves.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
            # A new, empty file only (on a used one it changes nothing and would wait for the
            # write lock): smaller pages (PAGE_SIZE), and retention then gives freed pages back
            # to the file system (O1, docs/retention.md); an older file keeps reusing them.
            if cursor.execute("PRAGMA page_count").fetchone()[0] == 0:
                cursor.execute(f"PRAGMA page_size = {int(self.page_size)}")
                cursor.execute("PRAGMA auto_vacuum = INCREMENTAL")
            mode = _set_wal(cursor)
            if str(mode).lower() != "wal":
                log.warning("SQLite journal %s runs in %s mode, not WAL", self.shown, mode)
            cursor.execute(f"PRAGMA synchronous = {self.synchronous}")
        finally:
            cursor.close()


def _set_wal(cursor: Any) -> str:
    """``PRAGMA journal_mode = WAL``, retried: on a new file several processes race for it, and
    SQLite may answer ``database is locked`` at once instead of waiting for the busy timeout."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            return str(cursor.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _on_begin(conn: Connection) -> None:
    # SQLAlchemy's recipe for pysqlite ("Serializable isolation / Savepoints / Transactional DDL").
    write = conn.get_execution_options().get(WRITE_OPTION, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
