"""The journal on MySQL and MariaDB (InnoDB; PyMySQL or mysqlclient).

``AUTO_INCREMENT`` hands out positions at INSERT, as PostgreSQL's sequence does; the lock that
makes commit order equal position order for an ordered category is the category's row of
``celery_durable_locks``, locked by an ``INSERT … ON DUPLICATE KEY UPDATE`` (an exclusive row
lock InnoDB holds until COMMIT or ROLLBACK, like PostgreSQL's advisory lock). The engine
defaults to ``READ COMMITTED`` (each statement sees the latest commits; InnoDB takes no gap
locks), a liveness check at checkout and a ``pool_recycle`` of 30 minutes, so that connections
the server closed after ``wait_timeout`` are replaced instead of failing (docs/howto-mysql.md).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import String, Table, bindparam, case, event, func, insert, select
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from celery_durable.errors import JournalError
from celery_durable.store.journal import schema
from celery_durable.store.journal.database import (
    VERSION_CONSTRAINT,
    Database,
    WriteConnection,
    insert_statement,
    refuse_if_closed,
)

__all__ = ["MYSQL_ENGINE_DEFAULTS", "MYSQL_SCHEMA_LOCK", "MysqlDatabase"]

log = logging.getLogger("celery_durable.journal.sql")

#: Engine options for MySQL/MariaDB (``engine_options`` overrides them). READ COMMITTED as on
#: PostgreSQL; pre-ping (with mysqlclient; PyMySQL checks its socket instead) and recycling so
#: that a connection the server closed (``wait_timeout``, a restart, a proxy's idle cut) is
#: replaced before use rather than failing a statement.
MYSQL_ENGINE_DEFAULTS: Mapping[str, Any] = {
    "isolation_level": "READ COMMITTED",
    "pool_reset_on_return": None,  # _reset does it
    "pool_pre_ping": True,
    "pool_recycle": 1800,
}
#: Server-side name of the MySQL/MariaDB session lock that serialises schema creation (DDL
#: commits implicitly, so no row lock can span it).
MYSQL_SCHEMA_LOCK = "celery_durable:schema"
_SCHEMA_LOCK_WAIT_S = 60
# MySQL error numbers: duplicate key, deadlock (InnoDB rolled the transaction back).
_ER_DUP_ENTRY = 1062
_ER_LOCK_DEADLOCK = 1213
# Key in the pool record's info: the last use of the connection was a committed write.
_COMMITTED_KEY = "celery_durable_committed"

# The category lock. ON DUPLICATE KEY UPDATE takes an exclusive lock on the existing row (and a
# new row is locked by its insertion); InnoDB keeps it until the end of the transaction and
# detects deadlocks with other row locks, as PostgreSQL does for advisory locks.
_LOCK_STMT = (
    mysql.insert(schema.category_locks)
    .values(name=bindparam("name", type_=String(64)))
    .on_duplicate_key_update(name=schema.category_locks.c.name)
)
# The same idea inside the insert: the category's row of celery_durable_locks, read FOR UPDATE
# in a derived table. The derived table is materialised (the row locked, or waited for) before
# the first row is written, hence before an AUTO_INCREMENT position is drawn -- and before
# InnoDB takes its AUTO-INC table lock for INSERT ... SELECT, so a writer waiting here does not
# hold up other tables' writers of the events table.
_INSERT_LOCKED_STMT = insert_statement(
    select(schema.category_locks.c.name)
    .where(schema.category_locks.c.name == bindparam("lock_name", type_=String(64)))
    .with_for_update()
    .subquery("category_lock")
)


class MysqlDatabase(Database):
    """MySQL and MariaDB: lock rows per ordered category, a session lock around DDL."""

    def __init__(self, url: URL, shown: str) -> None:
        super().__init__(url, shown)
        schema.use_dialect_options("mysql")  # InnoDB, utf8mb4: before any table is created

    def engine_options(
        self, options: dict[str, Any], engine_options: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        # PyMySQL exposes its socket: a closed connection is told without a round trip
        # (_closed_by_server) instead of pool_pre_ping's COM_PING (~60 µs per checkout).
        pymysql = self.url.get_driver_name() == "pymysql"
        merged = {**options, **MYSQL_ENGINE_DEFAULTS, "pool_pre_ping": not pymysql}
        return {**merged, **(engine_options or {})}

    def _local_check(self, engine_options: Mapping[str, Any]) -> bool:
        """Whether checkouts are checked on the socket (PyMySQL) rather than by a ping; the
        caller's own ``pool_pre_ping`` turns it off (the caller decides)."""
        return self.url.get_driver_name() == "pymysql" and "pool_pre_ping" not in engine_options

    def listen(self, core: Engine, engine_options: Mapping[str, Any] | None) -> Engine:
        if self._local_check(engine_options or {}):
            event.listen(core, "checkout", _closed_by_server)
        if "pool_reset_on_return" not in (engine_options or {}):
            event.listen(core, "reset", _reset)
        return core

    def create_schema(
        self, core: Engine, write_connection: WriteConnection, lock_categories: Sequence[str]
    ) -> None:
        """``ensure_schema`` under a named session lock (``GET_LOCK``), released at the end.

        DDL commits implicitly on MySQL, so a transaction's row lock could not cover it; a
        session lock does, and the server drops it if this connection dies.
        """
        with core.connect() as conn:
            got = conn.execute(
                select(func.get_lock(MYSQL_SCHEMA_LOCK, _SCHEMA_LOCK_WAIT_S))
            ).scalar()
            conn.commit()
            if got != 1:
                raise JournalError(
                    f"waited {_SCHEMA_LOCK_WAIT_S} s for another process creating the "
                    f"journal tables at {self.shown}"
                )
            try:
                with conn.begin():
                    schema.mysql_metadata.create_all(conn, checkfirst=True)  # the lock rows' table
                    schema.ensure_schema(conn)
                    # The lock rows exist before the first writer, which reads them FOR UPDATE.
                    _insert_lock_rows(conn, lock_categories)
            finally:
                with contextlib.suppress(SQLAlchemyError):
                    conn.execute(select(func.release_lock(MYSQL_SCHEMA_LOCK)))
                    conn.commit()

    def committed(self, conn: Connection) -> None:
        # Committed, nothing run since: the pool's ROLLBACK on return would be a round trip
        # for nothing (_reset).
        conn.connection.info[_COMMITTED_KEY] = True

    def take_lock(self, conn: Connection, category: str) -> None:
        conn.execute(_LOCK_STMT, {"name": category})

    def locked_insert(self, category: str, rows: Sequence[dict[str, Any]]) -> Any:
        for row in rows:
            row["lock_name"] = category
        return _INSERT_LOCKED_STMT

    def refused_insert(self, core: Engine, lock_categories: frozenset[str]) -> None:
        """Recreate missing rows of ``celery_durable_locks`` (someone deleted them): without
        its row, a category's locked inserts insert nothing. The caller's retry then works.

        Called while the failed transaction is still open and holds its lock rows: a plain
        read (InnoDB's consistent read takes no lock) decides first, so the usual case, every
        row present, never waits for that transaction's locks.
        """
        try:
            with core.begin() as conn:
                present = set(conn.execute(select(schema.category_locks.c.name)).scalars())
                if lock_categories <= present:
                    return
                missing = _insert_lock_rows(conn, sorted(lock_categories))
        except DBAPIError:
            log.warning("could not check the category lock rows", exc_info=True)
            return
        if missing:
            log.warning("recreated %d missing row(s) of celery_durable_locks", missing)

    def tables(self) -> list[Table]:
        """The library's tables and the lock rows' table (``celery_durable_locks``)."""
        return [*super().tables(), schema.category_locks]

    def ddl_notes(self) -> list[str]:
        if self.url.get_backend_name() == "mysql":
            return ["MySQL >= 8.0.17; for MariaDB >= 10.6 give a mariadb:// URL"]
        return []

    def insert(self, table: Table) -> Any:
        return mysql.insert(table)

    def insert_or_ignore(self, table: Table, key: str) -> Any:
        # No DO NOTHING on MySQL, and INSERT IGNORE would also hide other errors: the key is
        # set to itself. The row count then counts found rows too (CLIENT_FOUND_ROWS).
        return self.insert(table).on_duplicate_key_update({key: table.c[key]})

    def insert_or_update(self, table: Table, key: str, values: Mapping[str, Any]) -> Any:
        return self.insert(table).on_duplicate_key_update(**values)

    def insert_newer(self, table: Table, key: str, columns: Sequence[str], version: str) -> Any:
        """``ON DUPLICATE KEY UPDATE`` where each column takes the new value only when the new
        version is not lower. ``version`` comes last: MySQL applies the assignments left to
        right, and the others compare against the old version."""
        stmt = self.insert(table)
        newer = table.c[version] <= stmt.inserted[version]
        ordered = [c for c in columns if c != version] + [version]
        return stmt.on_duplicate_key_update(
            [(c, case((newer, stmt.inserted[c]), else_=table.c[c])) for c in ordered]
        )

    def insert_new(self, conn: Connection, table: Table, key: str, row: Mapping[str, Any]) -> bool:
        # The row count of insert_or_ignore cannot tell; a duplicate key rolls back only its
        # own statement (the savepoint), never the caller's transaction.
        try:
            with conn.begin_nested():
                conn.execute(insert(table).values(**row))
        except IntegrityError as exc:
            if getattr(exc.orig, "args", (None,))[0] != _ER_DUP_ENTRY:
                raise
            return False
        return True

    def is_version_conflict(self, exc: DBAPIError) -> bool:
        """A duplicate ``(stream, version)``, or a deadlock between two appends: InnoDB has
        rolled one of them back, and under READ COMMITTED (no gap locks) two appends can only
        deadlock on keys they both insert, i.e. versions of a stream they both write."""
        args = getattr(exc.orig, "args", ())
        if args and isinstance(args[0], int) and len(args) > 1:
            code, message = args[0], str(args[1])
            if code == _ER_LOCK_DEADLOCK:
                return True
            if code == _ER_DUP_ENTRY:
                return VERSION_CONSTRAINT in message
        return super().is_version_conflict(exc)


def _insert_lock_rows(conn: Connection, categories: Sequence[str]) -> int:
    """``INSERT IGNORE`` the lock row of every ordered category; how many were missing."""
    if not categories:
        return 0
    rows = [{"name": name} for name in sorted(categories)]
    statement = mysql.insert(schema.category_locks).prefix_with("IGNORE")
    return int(conn.execute(statement, rows).rowcount)


def _reset(dbapi_conn: Any, record: Any, state: Any) -> None:
    """Pool reset on return (SQLAlchemy's "reset event" recipe): ROLLBACK, except after a
    journal write transaction that committed, which leaves nothing to roll back. Saves one of
    the three round trips of an append (INSERT, COMMIT, ROLLBACK)."""
    if record is not None and record.info.pop(_COMMITTED_KEY, False):
        return
    dbapi_conn.rollback()


def _closed_by_server(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
    """Pool checkout on PyMySQL: refuse a connection the server has closed (``wait_timeout``,
    a restart, ``KILL``, a proxy's cut) by a look at its socket (:func:`refuse_if_closed`)."""
    refuse_if_closed(getattr(dbapi_conn, "_sock", None), "MySQL")
