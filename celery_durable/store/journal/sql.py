"""The SQL journal: SQLAlchemy Core over SQLite (a file), PostgreSQL (psycopg 3) or MySQL/MariaDB.

Three decisions shape this module; docs/journal.md gives the measurements behind them.

* **No read before write.** An append is one ``INSERT … SELECT … WHERE`` statement per event.
  The unique ``(stream, version)`` constraint catches a writer that got there first; the
  ``WHERE`` refuses an event whose previous version does not exist, so an expected version
  beyond the end of the stream cannot leave a gap. Both checks run inside the statement that
  stores the event, so the normal path costs no extra round trip.
* **SQLite writers queue instead of deadlocking.** Write transactions start with
  ``BEGIN IMMEDIATE``: the write lock is taken before anything is read, so two processes never
  both hold a read lock and wait for each other to upgrade it.
* **PostgreSQL commit order equals position order for ordered categories.** Positions come
  from a sequence and are handed out at INSERT, not at COMMIT; a transaction-scoped advisory lock
  per ordered category makes writers of that category insert and commit one after another.
  MySQL/MariaDB hand out ``AUTO_INCREMENT`` positions at INSERT too; there the lock is the
  category's row of ``celery_durable_locks``, locked by an ``INSERT … ON DUPLICATE KEY UPDATE``
  (an exclusive row lock that InnoDB holds until COMMIT or ROLLBACK, like the advisory lock).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import select as io_select
import sqlite3
import threading
import time
import weakref
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Integer,
    String,
    Table,
    Text,
    and_,
    any_,
    bindparam,
    create_engine,
    event,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    PendingRollbackError,
    ProgrammingError,
    SQLAlchemyError,
)
from sqlalchemy.sql import ColumnElement, Insert, Select

from celery_durable.core.journal import Append, Journal, NewEvent, StoredEvent
from celery_durable.errors import AppendConflict, JournalError, JournalUnavailable
from celery_durable.store.journal import schema
from celery_durable.store.journal.encoding import (
    MAX_CATEGORY_LENGTH,
    MAX_STREAM_LENGTH,
    MAX_TYPE_LENGTH,
    _check_int,
    _rows,
    _stored,
    encode_data,
    first_misfit,
)
from celery_durable.store.journal.urls import (
    is_mysql,
    is_sqlite,
    normalize_url,
    redact,
    split_secrets,
    sqlite_path,
)

__all__ = [
    "EngineOptionsRefused",
    "SqlJournal",
    "advisory_key",
    "connection_lost",
    "copy_rows",
    "encode_data",
    "one_of",
    "open_journal",
    "read_all_query",
]

log = logging.getLogger("celery_durable.journal.sql")

SQLITE_BUSY_TIMEOUT_S = 30.0
_SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
#: Execution option for ``journal.engine``: on SQLite, transactions of a connection carrying it
#: start with ``BEGIN IMMEDIATE`` (``journal.engine.execution_options(celery_durable_write=True)``).
WRITE_OPTION = "celery_durable_write"
# Key in Connection.info while a journal.transaction() is open on that connection.
_TX_KEY = "celery_durable_tx"
# Key in the pool record's info: the last use of the connection was a committed write.
_COMMITTED_KEY = "celery_durable_committed"
_VERSION_CONSTRAINT = "uq_celery_durable_events_stream_version"

_events = schema.events


_DRIVER_EXTRAS = {"psycopg": "postgres", "psycopg_binary": "postgres", "psycopg_c": "postgres"}


JOURNAL_AWAY: tuple[type[Exception], ...] = (
    OperationalError,
    InterfaceError,
    PendingRollbackError,
    DisconnectionError,
)
"""The database layer's errors that mean the journal cannot be reached right now (the server is
down, refused or dropped the connection): what beat and workers wait out instead of failing."""

DatabaseError = SQLAlchemyError
"""Any error of the database layer (for callers that must not import it themselves)."""

Transaction = Connection
"""The connection of a write transaction from :meth:`SqlJournal.transaction`: what a caller
hands to the store's ``…_in(conn, …)`` writes so that they commit together."""


@contextmanager
def journal_errors() -> Iterator[None]:
    """Turn a lost journal connection in the library's own reads and writes into
    :class:`JournalUnavailable`, so it is never mistaken for a failure of the task body."""
    try:
        yield
    except JOURNAL_AWAY as exc:
        raise JournalUnavailable(f"journal unavailable: {type(exc).__name__}: {exc}") from exc


def connection_lost(error: BaseException | None) -> bool:
    """Whether ``error`` says the database connection itself died (the server closed it, the
    network dropped it): the statement may be tried once more on a fresh connection."""
    if isinstance(error, DisconnectionError):
        return True
    return isinstance(error, DBAPIError) and bool(error.connection_invalidated)


class EngineOptionsRefused(ValueError):
    """``create_engine`` refused the engine options (an unknown keyword, a wrong type)."""


def _create_engine(url: Any, options: dict[str, Any], shown: str) -> Engine:
    """``create_engine``, with a missing database driver named with the extra that installs it."""
    try:
        return create_engine(url, **options)
    except (ArgumentError, TypeError) as exc:  # an option create_engine or the pool refuses
        raise EngineOptionsRefused(f"engine options of {shown} refused: {_one_line(exc)}") from exc
    except ModuleNotFoundError as exc:
        module = (exc.name or "").partition(".")[0]
        extra = _DRIVER_EXTRAS.get(module)
        if extra is None:
            raise
        raise JournalError(
            f"the journal {shown} needs the {module} driver, which is not installed: "
            f"pip install 'celery-durable[{extra}]'",
            missing_module=module,
        ) from exc


def _one_line(error: BaseException | None) -> str:
    """A driver's error message on one line (libpq adds a tab-indented hint line)."""
    return " ".join(str(error).split())


def advisory_key(name: str) -> int:
    """The PostgreSQL advisory-lock key (signed 64 bits) this library uses for ``name``.

    Category locks use ``"category:<name>"``; start-up uses ``"schema"``. The keys are fixed
    (a hash, not Python's randomised ``hash()``) so that every process agrees on them.
    """
    digest = hashlib.blake2b(f"celery_durable:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


_SCHEMA_LOCK_KEY = advisory_key("schema")
_LOCK_STMT = select(func.pg_advisory_xact_lock(bindparam("key", type_=BigInteger)))

# MySQL/MariaDB: the category lock. ON DUPLICATE KEY UPDATE takes an exclusive lock on the
# existing row (and a new row is locked by its insertion); InnoDB keeps it until the end of the
# transaction and detects deadlocks with other row locks, as PostgreSQL does for advisory locks.
_MYSQL_LOCK_STMT = (
    mysql.insert(schema.category_locks)
    .values(name=bindparam("name", type_=String(64)))
    .on_duplicate_key_update(name=schema.category_locks.c.name)
)
#: Server-side name of the MySQL/MariaDB session lock that serialises schema creation (DDL
#: commits implicitly, so no row lock can span it).
MYSQL_SCHEMA_LOCK = "celery_durable:schema"
_MYSQL_SCHEMA_LOCK_WAIT_S = 60
# MySQL error numbers: duplicate key, deadlock (InnoDB rolled the transaction back).
_ER_DUP_ENTRY = 1062
_ER_LOCK_DEADLOCK = 1213

# One statement stores one event. The WHERE clause lets the row in only when the stream's
# previous version exists (or the event is version 1); a concurrent writer of the same version
# is stopped by the unique constraint. ``preserve_rowcount`` because the count of inserted rows
# is how a refused row shows up.
_prev = _events.alias("prev")


def _insert_statement(*, with_lock: bool, mysql_lock: bool = False) -> Insert:
    rows = select(
        bindparam("stream", type_=String(MAX_STREAM_LENGTH)),
        bindparam("version", type_=Integer),
        bindparam("category", type_=String(MAX_CATEGORY_LENGTH)),
        bindparam("type", type_=String(MAX_TYPE_LENGTH)),
        bindparam("data", type_=Text),
        bindparam("recorded_at", type_=schema.UtcDateTime),
    ).where(
        or_(
            bindparam("prev", type_=Integer) == literal(0, Integer),
            exists().where(
                and_(
                    _prev.c.stream == bindparam("stream", type_=String(MAX_STREAM_LENGTH)),
                    _prev.c.version == bindparam("prev", type_=Integer),
                )
            ),
        )
    )
    if mysql_lock:
        # MySQL/MariaDB: the same idea with the category's row of celery_durable_locks, read
        # FOR UPDATE in a derived table. The derived table is materialised (the row locked, or
        # waited for) before the first row is written, hence before an AUTO_INCREMENT position
        # is drawn -- and before InnoDB takes its AUTO-INC table lock for INSERT ... SELECT, so
        # a writer waiting here does not hold up other tables' writers of the events table.
        lock_row = (
            select(schema.category_locks.c.name)
            .where(schema.category_locks.c.name == bindparam("lock_name", type_=String(64)))
            .with_for_update()
            .subquery("category_lock")
        )
        rows = rows.select_from(lock_row)
    elif with_lock:
        # PostgreSQL only: the row is produced by scanning a one-row subquery that takes the
        # category's advisory lock, so the lock is held before the row's position is drawn
        # (nextval() is evaluated when the row is projected). Saves the round trip of a
        # separate SELECT pg_advisory_xact_lock(); taking it again per row is a no-op.
        lock = select(
            func.pg_advisory_xact_lock(bindparam("lock_key", type_=BigInteger)).label("locked")
        ).subquery("category_lock")
        rows = rows.select_from(lock)
    columns = ["stream", "version", "category", "type", "data", "recorded_at"]
    return insert(_events).from_select(columns, rows).execution_options(preserve_rowcount=True)


_BULK_ROWS = 64
"""From this many rows over distinct streams, appends take the bulk path (one guard query)."""

_INSERT_STMT = _insert_statement(with_lock=False)
_INSERT_LOCKED_STMT = _insert_statement(with_lock=True)
_INSERT_MYSQL_LOCKED_STMT = _insert_statement(with_lock=False, mysql_lock=True)

_EVENT_COLUMNS = (
    _events.c.position,
    _events.c.stream,
    _events.c.version,
    _events.c.type,
    _events.c.data,
    _events.c.recorded_at,
)


@dataclass(slots=True)
class _TxState:
    """What one open ``journal.transaction()`` has done so far."""

    locked: set[str] = field(default_factory=set)
    failed: bool = False


class SqlJournal:
    """The :class:`~celery_durable.core.journal.Journal` on SQLite, PostgreSQL or MySQL/MariaDB.

    Construction only parses the URL and builds the engine; the first call connects, creates
    missing tables and checks the schema version (:class:`JournalError` when the database was
    written by a newer celery_durable, or cannot be reached). Safe to share between threads;
    safe across ``fork()`` (children drop the parent's pooled connections).

    ``ordered_categories``: categories whose readers follow positions (the schedule index);
    on PostgreSQL and MySQL their writers are serialised so that commit order equals position
    order.

    On MySQL/MariaDB the engine defaults to ``READ COMMITTED`` (as PostgreSQL: each statement
    sees the latest commits, and InnoDB takes no gap locks), a liveness check at checkout
    (PyMySQL: the socket, no round trip; mysqlclient: ``pool_pre_ping``) and a ``pool_recycle``
    of 30 minutes, so that connections the server closed after ``wait_timeout`` are replaced
    instead of failing (docs/howto-mysql.md); ``engine_options`` overrides them.

    Example::

        journal = SqlJournal("sqlite:///celery_durable.db")
        version = journal.append("schedule/nightly", 0, [NewEvent(type="Created", data={})])
        events = journal.read_stream("schedule/nightly")
    """

    def __init__(
        self,
        url: str,
        *,
        sqlite_synchronous: str = "FULL",
        ordered_categories: Collection[str] = ("schedule",),
        echo: bool = False,
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._sa_url = normalize_url(url)
        self.url = redact(self._sa_url)
        self._sqlite = is_sqlite(self._sa_url)
        self._mysql = is_mysql(self._sa_url)
        synchronous = str(sqlite_synchronous).upper()
        if synchronous not in _SYNCHRONOUS_MODES:
            raise ValueError(
                f"sqlite_synchronous must be one of {', '.join(_SYNCHRONOUS_MODES)}, "
                f"not {sqlite_synchronous!r}"
            )
        self._synchronous = synchronous
        if isinstance(ordered_categories, str):
            raise TypeError("ordered_categories must be a collection of names, not a str")
        self.ordered_categories = frozenset(ordered_categories)
        self._lock_keys = {name: advisory_key(f"category:{name}") for name in ordered_categories}
        engine_url, secrets = split_secrets(self._sa_url)
        connect_args: dict[str, Any] = dict(secrets)
        if self._sqlite:
            connect_args["timeout"] = SQLITE_BUSY_TIMEOUT_S
        # Every database: a pooled connection the server dropped while it sat idle (restart,
        # failover, idle_session_timeout, a proxy's cut) is replaced at checkout, before a
        # statement fails on it (docs/journal.md, "Engine options").
        options: dict[str, Any] = {"echo": echo, **ENGINE_DEFAULTS}
        # PyMySQL exposes its socket: a closed connection is told without a round trip
        # (_closed_by_server) instead of pool_pre_ping's COM_PING (~60 µs per checkout).
        local_check = self._mysql and engine_url.get_driver_name() == "pymysql"
        if self._mysql:
            options.update(MYSQL_ENGINE_DEFAULTS, pool_pre_ping=not local_check)
        if engine_options and "pool_pre_ping" in engine_options:
            local_check = False  # the caller decides how connections are checked
        options.update(engine_options or {})
        options["connect_args"] = {**connect_args, **options.get("connect_args", {})}
        # Two views of one pool. ``_core`` serves the journal's own statements; on SQLite its
        # write transactions emit BEGIN IMMEDIATE themselves (_write_connection). ``engine``, for
        # everyone else, carries SQLAlchemy's documented begin-event recipe, so that any
        # transaction opened on it is a real one. The hot path avoids the recipe only because a
        # connection-event listener makes every statement of its engine dispatch events, which
        # costs ~20 µs per append (docs/journal.md, "Cost").
        self._core: Engine = _create_engine(engine_url, options, self.url)
        self.engine: Engine = self._core
        if local_check:
            event.listen(self._core, "checkout", _closed_by_server)
        if self._mysql and "pool_reset_on_return" not in (engine_options or {}):
            event.listen(self._core, "reset", _reset_mysql)
        if self._sqlite:
            event.listen(self._core, "connect", self._on_sqlite_connect)
            self.engine = self._core.execution_options()
            event.listen(self.engine, "begin", _on_sqlite_begin)
        self.metadata = schema.metadata
        self._init_lock = threading.Lock()
        self._local = threading.local()  # .open: a transaction() is open in this thread
        self._ready = False
        self._closed = False
        _track_for_fork(self)

    def __repr__(self) -> str:
        return f"SqlJournal({self.url!r})"

    @property
    def tables(self) -> Mapping[str, Table]:
        """Every table of the library by name (the one schema, :mod:`.schema`)."""
        return self.metadata.tables

    # -- life cycle ---------------------------------------------------------------------

    def ensure_ready(self) -> None:
        """Connect, create missing tables, check the schema version. Idempotent.

        Every other method calls it; call it directly to fail fast at start-up.
        """
        if self._ready:
            return
        with self._init_lock:
            if self._closed:
                raise JournalError(f"the journal {self.url} is closed")
            if not self._ready:
                self._initialise()
                self._ready = True

    def _initialise(self) -> None:
        path = sqlite_path(self._sa_url)
        if path is not None:
            try:
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            except OSError as exc:
                raise JournalError(f"cannot create the directory of {self.url}: {exc}") from exc
        attempts = 3
        for attempt in range(1, attempts + 1):
            try:
                if self._mysql:
                    self._initialise_mysql()
                    return
                with self._write_connection() as conn:
                    if not self._sqlite:
                        # Serialises initialisers; SQLite's BEGIN IMMEDIATE already has.
                        conn.execute(_LOCK_STMT, {"key": _SCHEMA_LOCK_KEY})
                    schema.ensure_schema(conn)
                log.debug("journal ready at %s", self.url)
                return
            except (ProgrammingError, IntegrityError) as exc:
                # Another process created a table between our check and our CREATE (possible
                # only if it does not take the same lock, e.g. an older version): check again.
                if attempt == attempts:
                    raise JournalError(
                        f"cannot create the journal tables at {self.url}: {exc.orig}"
                    ) from exc
                log.info("journal tables created concurrently at %s; checking again", self.url)
            except (OperationalError, InterfaceError) as exc:
                # Connection refused, server down, database locked: it may come back.
                raise JournalUnavailable(
                    f"cannot open the journal at {self.url}: {_one_line(exc.orig)}"
                ) from exc
            except DBAPIError as exc:
                raise JournalError(
                    f"cannot open the journal at {self.url}: {_one_line(exc.orig)}"
                ) from exc

    def _initialise_mysql(self) -> None:
        """``ensure_schema`` under a named session lock (``GET_LOCK``), released at the end.

        DDL commits implicitly on MySQL, so a transaction's row lock could not cover it; a
        session lock does, and the server drops it if this connection dies.
        """
        with self._core.connect() as conn:
            got = conn.execute(
                select(func.get_lock(MYSQL_SCHEMA_LOCK, _MYSQL_SCHEMA_LOCK_WAIT_S))
            ).scalar()
            conn.commit()
            if got != 1:
                raise JournalError(
                    f"waited {_MYSQL_SCHEMA_LOCK_WAIT_S} s for another process creating the "
                    f"journal tables at {self.url}"
                )
            try:
                with conn.begin():
                    schema.ensure_schema(conn)
                    # The lock rows exist before the first writer, which reads them FOR UPDATE.
                    self._insert_lock_rows(conn)
            finally:
                with contextlib.suppress(SQLAlchemyError):
                    conn.execute(select(func.release_lock(MYSQL_SCHEMA_LOCK)))
                    conn.commit()

    def _insert_lock_rows(self, conn: Connection) -> int:
        """``INSERT IGNORE`` the lock row of every ordered category; how many were missing."""
        if not self.ordered_categories:
            return 0
        rows = [{"name": name} for name in sorted(self.ordered_categories)]
        statement = mysql.insert(schema.category_locks).prefix_with("IGNORE")
        return int(conn.execute(statement, rows).rowcount)

    def _restore_lock_rows(self) -> None:
        """Recreate missing rows of ``celery_durable_locks`` (someone deleted them): without
        its row, a category's appends would insert nothing. The caller's retry then works.

        Called while the failed transaction is still open and holds its lock rows: a plain
        read (InnoDB's consistent read takes no lock) decides first, so the usual case, every
        row present, never waits for that transaction's locks.
        """
        try:
            with self._core.begin() as conn:
                present = set(conn.execute(select(schema.category_locks.c.name)).scalars())
                if self.ordered_categories <= present:
                    return
                missing = self._insert_lock_rows(conn)
        except DBAPIError:
            log.warning("could not check the category lock rows", exc_info=True)
            return
        if missing:
            log.warning("recreated %d missing row(s) of celery_durable_locks", missing)

    def close(self) -> None:
        """Dispose of the engine's connections. Calling it twice is harmless."""
        with self._init_lock:
            if self._closed:
                return
            self._closed = True
            self._ready = False
        self._core.dispose()

    def _after_fork_in_child(self) -> None:
        # SQLAlchemy's recipe for pools and os.fork(): forget the parent's connections without
        # closing them (they still belong to the parent). A fresh lock too: a thread of the
        # parent may have held the old one at the instant of the fork.
        self._core.dispose(close=False)
        self._init_lock = threading.Lock()

    # -- SQLite connection set-up ----------------------------------------------------------

    def _on_sqlite_connect(self, dbapi_conn: Any, _record: Any) -> None:
        # Take BEGIN away from the sqlite3 module (it would start write transactions lazily as
        # DEFERRED, which deadlocks two writers that both read first): we emit it ourselves.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
            # A new, empty file only (on a used one it changes nothing and would wait for the
            # write lock): retention then gives freed pages back to the file system (O1,
            # docs/retention.md); an older file keeps reusing them.
            if cursor.execute("PRAGMA page_count").fetchone()[0] == 0:
                cursor.execute("PRAGMA auto_vacuum = INCREMENTAL")
            mode = _set_wal(cursor)
            if str(mode).lower() != "wal":
                log.warning("SQLite journal %s runs in %s mode, not WAL", self.url, mode)
            cursor.execute(f"PRAGMA synchronous = {self._synchronous}")
        finally:
            cursor.close()

    # -- writing -----------------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A write transaction for appends and the caller's own tables, committed at the end.

        On SQLite it starts with ``BEGIN IMMEDIATE`` (waits up to 30 s for other writers).
        An exception rolls everything back. If an :meth:`append_in` inside failed and the
        caller swallowed the error, the transaction is rolled back and :class:`JournalError`
        raised: part of the appends may have reached the database before the failure.

        Inside the block, write only through ``conn`` (:meth:`append_in`): :meth:`append`,
        :meth:`append_many` or a second :meth:`transaction` in the same thread would wait for
        this one's locks forever, so they raise :class:`JournalError` instead. Reads through
        the journal's other methods work but do not see this transaction's uncommitted rows.
        """
        self._refuse_nesting()
        self.ensure_ready()
        with self._write_connection() as conn:
            state = _TxState()
            conn.info[_TX_KEY] = state
            self._local.open = True
            try:
                yield conn
                if state.failed:
                    raise JournalError(
                        "an append in this transaction failed; the transaction was rolled back"
                    )
            finally:
                self._local.open = False
                # On a connection the server dropped even reading `info` raises: keep the
                # original error, not that one.
                with contextlib.suppress(SQLAlchemyError):
                    conn.info.pop(_TX_KEY, None)

    def _refuse_nesting(self) -> None:
        if getattr(self._local, "open", False):
            raise JournalError(
                "a journal transaction is already open in this thread: it holds the write lock "
                "this call would wait for; append through append_in(conn, ...) instead"
            )

    @contextmanager
    def _write_connection(self) -> Iterator[Connection]:
        with self._core.connect() as conn:
            with conn.begin():
                if self._sqlite:
                    # isolation_level=None: sqlite3 sends no BEGIN of its own, and SQLAlchemy's
                    # begin() sends none for SQLite; COMMIT/ROLLBACK still go through the driver.
                    conn.connection.driver_connection.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]
                yield conn
            if self._mysql:
                # Committed, nothing run since: the pool's ROLLBACK on return would be a
                # round trip for nothing on MySQL (_reset_mysql).
                conn.connection.info[_COMMITTED_KEY] = True

    def append_in(self, conn: Connection, appends: Sequence[Append]) -> list[int]:
        """Append inside a :meth:`transaction`; return each stream's new version.

        Raises :class:`AppendConflict` when an expected version is not the stream's current
        version; the transaction must then be rolled back (leaving the ``with`` block by the
        exception does that). Bad input raises ``ValueError``/``TypeError`` before any SQL.
        """
        rows, versions = _rows(appends)
        self._append_rows(conn, appends, rows)
        return versions

    def append(self, stream: str, expected_version: int, events: Sequence[NewEvent]) -> int:
        """Append events to one stream in their own transaction; return its new version."""
        appends = [Append(stream=stream, expected_version=expected_version, events=events)]
        rows, versions = _rows(appends)
        with self.transaction() as conn:
            self._append_rows(conn, appends, rows)
        return versions[0]

    def append_many(self, appends: Sequence[Append]) -> None:
        """Append to several streams in one transaction: all are stored or none.

        Raises :class:`AppendConflict` with ``stream`` set to the first conflicting stream
        (``None`` in the rare case it cannot be told).
        """
        rows, _ = _rows(appends, allow_empty=True)
        if not rows:
            return
        with self.transaction() as conn:
            self._append_rows(conn, appends, rows)

    def _append_rows(
        self, conn: Connection, appends: Sequence[Append], rows: list[dict[str, Any]]
    ) -> None:
        state = conn.info.get(_TX_KEY)
        if not isinstance(state, _TxState):
            raise JournalError("append_in needs a connection from journal.transaction()")
        statement = _INSERT_STMT
        now = datetime.now(timezone.utc)
        for row in rows:
            row["recorded_at"] = now
        streams = {a.stream for a in appends}
        if len(rows) >= _BULK_ROWS and len(streams) == len(appends):
            self._append_bulk(conn, state, appends, rows)
            return
        if not self._sqlite:
            needed = sorted(
                ({row["category"] for row in rows} & self.ordered_categories) - state.locked
            )
            if len(needed) == 1 and self._mysql:
                statement = _INSERT_MYSQL_LOCKED_STMT
                for row in rows:
                    row["lock_name"] = needed[0]
            elif len(needed) == 1:
                statement = _INSERT_LOCKED_STMT
                for row in rows:
                    row["lock_key"] = self._lock_keys[needed[0]]
            else:
                self._take_locks(conn, needed)
            state.locked.update(needed)
        try:
            result = conn.execute(statement, rows if len(rows) > 1 else rows[0])
        except (IntegrityError, OperationalError) as exc:
            state.failed = True
            if not _is_version_conflict(exc):
                raise
            raise self._conflict(appends) from None
        if result.rowcount != len(rows):
            # A row was refused by the WHERE clause: its previous version does not exist.
            state.failed = True
            if statement is _INSERT_MYSQL_LOCKED_STMT:
                self._restore_lock_rows()  # or the category's lock row was deleted
            raise self._conflict(appends)

    def _append_bulk(
        self,
        conn: Connection,
        state: _TxState,
        appends: Sequence[Append],
        rows: list[dict[str, Any]],
    ) -> None:
        """Many streams at once (the dispatcher): one guard query, then a plain executemany.

        The per-row guard of the normal path (an ``EXISTS`` per row) is replaced by reading
        every stream's current version once. Versions only grow, so a stream found at its
        expected version can at worst have moved on by the time of the INSERT, which the
        unique constraint then refuses: no gap can be written.
        """
        if not self._sqlite:
            needed = sorted(
                ({r["category"] for r in rows} & self.ordered_categories) - state.locked
            )
            self._take_locks(conn, needed)  # before any position is drawn
            state.locked.update(needed)
        names = [a.stream for a in appends]
        current: dict[str, int] = {}
        for start in range(0, len(names), 1000):
            query = (
                select(_events.c.stream, func.max(_events.c.version))
                .where(one_of(conn, _events.c.stream, names[start : start + 1000]))
                .group_by(_events.c.stream)
            )
            current.update((stream, int(version)) for stream, version in conn.execute(query))
        conflict = first_misfit(appends, lambda stream: current.get(stream, 0))
        if conflict is not None:
            state.failed = True
            raise conflict
        try:
            if self._sqlite or self._mysql:
                # On MySQL the drivers turn an executemany of INSERT … VALUES into multi-row
                # INSERTs (PyMySQL: statements of up to ~1 MB, under max_allowed_packet).
                plain = [{k: v for k, v in row.items() if k != "prev"} for row in rows]
                conn.execute(insert(_events), plain)
            else:
                copy_rows(
                    conn, _events, _COPY_COLUMNS, (tuple(r[c] for c in _COPY_COLUMNS) for r in rows)
                )
        except (IntegrityError, OperationalError) as exc:
            state.failed = True
            if not _is_version_conflict(exc):
                raise
            raise self._conflict(appends) from None

    def _take_locks(self, conn: Connection, categories: Sequence[str]) -> None:
        """Lock the (sorted) categories for this transaction: two transactions that need the
        same locks take them in the same order."""
        for category in categories:
            if self._mysql:
                conn.execute(_MYSQL_LOCK_STMT, {"name": category})
            else:
                conn.execute(_LOCK_STMT, {"key": self._lock_keys[category]})

    def _conflict(self, appends: Sequence[Append]) -> AppendConflict:
        """Tell which append does not fit the committed state of its stream.

        Reads through another connection: the failed transaction may hold part of its own rows
        (SQLite) or be unusable (PostgreSQL).
        """
        streams = list(dict.fromkeys(a.stream for a in appends))
        heads: dict[str, int] = {}
        try:
            with self._core.connect() as reader:
                for start in range(0, len(streams), 500):
                    chunk = streams[start : start + 500]
                    query = (
                        select(_events.c.stream, func.max(_events.c.version))
                        .where(one_of(reader, _events.c.stream, chunk))
                        .group_by(_events.c.stream)
                    )
                    heads.update({s: int(v) for s, v in reader.execute(query).all()})
        except DBAPIError:
            log.warning("could not read stream heads to explain an append conflict", exc_info=True)
            return AppendConflict("append conflict", stream=None, expected_version=None)
        return first_misfit(appends, lambda stream: heads.get(stream, 0)) or AppendConflict(
            "append conflict with a concurrent writer", stream=None, expected_version=None
        )

    # -- reading -----------------------------------------------------------------------------

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        self.ensure_ready()
        # On SQLite each read is one SELECT in autocommit mode: a statement is its own snapshot.
        with self._core.connect() as conn:
            yield conn

    @contextmanager
    def unavailable_when_away(self) -> Iterator[None]:
        """Inside, a refused or lost connection raises :class:`JournalUnavailable` (one line,
        password masked) instead of the driver's error.

        The first use of a journal already fails that way (:meth:`ensure_ready`); the public
        reads of run state use this so that they fail the same way after it, and a web view
        can answer "try again later" by catching one exception (docs/flask.md). The library's
        own loops keep the driver's error: they retry or translate it themselves.
        """
        try:
            yield
        except (OperationalError, InterfaceError) as exc:
            raise JournalUnavailable(
                f"cannot read the journal at {self.url}: {_one_line(exc.orig)}"
            ) from exc

    def read_stream(self, stream: str, after_version: int = 0) -> list[StoredEvent]:
        """Events of one stream with version > ``after_version``, oldest first."""
        _check_int("after_version", after_version)
        query = (
            select(*_EVENT_COLUMNS)
            .where(_events.c.stream == stream, _events.c.version > after_version)
            .order_by(_events.c.version)
        )
        with self._reading() as conn:
            return [_stored(row) for row in conn.execute(query)]

    def read_all(
        self, after_position: int, *, category: str | None = None, limit: int = 1000
    ) -> list[StoredEvent]:
        """Up to ``limit`` events with position > ``after_position``, in position order.

        With ``category``, only that category's events (through the ``(category, position)``
        index). On PostgreSQL only ordered categories are guaranteed gap-free for a reader that
        resumes from the last position it saw; see docs/journal.md.
        """
        query = read_all_query(after_position, category=category, limit=limit)
        with self._reading() as conn:
            return [_stored(row) for row in conn.execute(query)]

    def read_positions(self, positions: Sequence[int]) -> list[StoredEvent]:
        """The events still stored at ``positions``, in position order (a removed one is left out).

        Through the primary key, 1,000 positions per statement: retention (O1) reads the late
        records it remembers this way instead of scanning for them again.
        """
        found: list[StoredEvent] = []
        wanted = sorted(set(positions))
        with self._reading() as conn:
            for start in range(0, len(wanted), 1000):
                chunk = wanted[start : start + 1000]
                query = (
                    select(*_EVENT_COLUMNS)
                    .where(one_of(conn, _events.c.position, chunk))
                    .order_by(_events.c.position)
                )
                found.extend(_stored(row) for row in conn.execute(query))
        return found

    def head(self, category: str | None = None) -> int:
        """The highest stored position (of the category), 0 when there is none."""
        query = select(func.max(_events.c.position))
        if category is not None:
            query = query.where(_events.c.category == category)
        with self._reading() as conn:
            return int(conn.execute(query).scalar() or 0)


def read_all_query(after_position: int, *, category: str | None, limit: int) -> Select[Any]:
    """The SELECT behind :meth:`SqlJournal.read_all` (with a category it can use the
    ``(category, position)`` index: equality on the first column, range and order on the second)."""
    _check_int("after_position", after_position)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"limit must be a positive int, not {limit!r}")
    query = select(*_EVENT_COLUMNS).where(_events.c.position > after_position)
    if category is not None:
        query = query.where(_events.c.category == category)
    return query.order_by(_events.c.position).limit(limit)


def open_journal(url: str, **options: Any) -> SqlJournal:
    """Build a :class:`SqlJournal` (nothing connects until it is first used)."""
    return SqlJournal(url, **options)


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


def _on_sqlite_begin(conn: Connection) -> None:
    # SQLAlchemy's recipe for pysqlite ("Serializable isolation / Savepoints / Transactional DDL").
    write = conn.get_execution_options().get(WRITE_OPTION, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _reset_mysql(dbapi_conn: Any, record: Any, state: Any) -> None:
    """Pool reset on return (SQLAlchemy's "reset event" recipe): ROLLBACK, except after a
    journal write transaction that committed, which leaves nothing to roll back. Saves one of
    the three round trips of an append (INSERT, COMMIT, ROLLBACK)."""
    if record is not None and record.info.pop(_COMMITTED_KEY, False):
        return
    dbapi_conn.rollback()


def _closed_by_server(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
    """Pool checkout on PyMySQL: refuse a connection the server has closed, at no round trip.

    An idle MySQL connection has nothing to read. When the server closes it (``wait_timeout``,
    a restart, ``KILL``, a proxy's cut) the socket turns readable: end of file, or the error
    packet MySQL sends first. ``DisconnectionError`` makes the pool discard it and hand out a
    fresh connection (SQLAlchemy's "custom pessimistic ping" recipe).
    """
    sock = getattr(dbapi_conn, "_sock", None)
    if sock is None:
        raise DisconnectionError("the MySQL connection is closed")
    try:
        readable, _, _ = io_select.select([sock], [], [], 0)
    except (OSError, ValueError):
        raise DisconnectionError("the MySQL connection's socket is unusable") from None
    if readable:
        raise DisconnectionError("the MySQL server closed the connection")


#: Engine options for every database (``engine_options`` overrides them): a connection is
#: checked when it leaves the pool (one ``SELECT 1`` round trip on PostgreSQL, a few µs on
#: SQLite's in-process file), so that one the server closed is replaced instead of failing.
ENGINE_DEFAULTS: Mapping[str, Any] = {"pool_pre_ping": True}

#: Engine options for MySQL/MariaDB (``engine_options`` overrides them). READ COMMITTED as on
#: PostgreSQL; pre-ping (with mysqlclient; PyMySQL checks its socket instead) and recycling so
#: that a connection the server closed (``wait_timeout``, a restart, a proxy's idle cut) is
#: replaced before use rather than failing a statement.
MYSQL_ENGINE_DEFAULTS: Mapping[str, Any] = {
    "isolation_level": "READ COMMITTED",
    "pool_reset_on_return": None,  # _reset_mysql does it
    "pool_pre_ping": True,
    "pool_recycle": 1800,
}

_COPY_COLUMNS = ("stream", "version", "category", "type", "data", "recorded_at")


def one_of(
    conn: Connection, column: ColumnElement[Any], values: Sequence[Any]
) -> ColumnElement[bool]:
    """``column IN values``; on PostgreSQL one array parameter (``column = ANY(:values)``).

    The statement text then stays the same whatever the number of values: neither SQLAlchemy
    nor psycopg renders and parses a placeholder per value (measurable with 1,000 of them).
    """
    if conn.dialect.name == "postgresql":
        return column == any_(literal(list(values), type_=ARRAY(column.type)))
    return column.in_(values)


def copy_rows(
    conn: Connection, table: Table, columns: Sequence[str], rows: Iterable[Sequence[Any]]
) -> None:
    """PostgreSQL ``COPY … FROM STDIN`` inside the connection's open transaction.

    The bulk paths use it: per row it costs a fraction of an ``executemany`` (the rows are
    encoded by psycopg's C code and parsed once by the server). Errors come out as SQLAlchemy's
    exceptions, like those of ``conn.execute`` (a unique violation is an ``IntegrityError``),
    and a dropped connection is invalidated so that the pool does not hand it out again.
    """
    import psycopg

    statement = f"COPY {table.name} ({', '.join(columns)}) FROM STDIN"
    driver = conn.connection.driver_connection
    try:
        with driver.cursor() as cursor, cursor.copy(statement) as copy:  # type: ignore[union-attr]
            for row in rows:
                copy.write_row(row)
    except psycopg.Error as exc:
        lost = conn.dialect.is_disconnect(exc, conn.connection.dbapi_connection, None)  # type: ignore[arg-type]
        if lost:
            conn.invalidate(exc)
        raise DBAPIError.instance(
            statement, None, exc, psycopg.Error, connection_invalidated=lost, dialect=conn.dialect
        ) from exc


def _is_version_conflict(exc: DBAPIError) -> bool:
    """Whether an append failed because another writer stored one of its versions first.

    On MySQL/MariaDB a deadlock between two appends counts too: InnoDB has rolled one of
    them back, and under READ COMMITTED (no gap locks) two appends can only deadlock on keys
    they both insert, i.e. versions of a stream they both write.
    """
    args = getattr(exc.orig, "args", ())
    if args and isinstance(args[0], int) and len(args) > 1:
        code, message = args[0], str(args[1])
        if code == _ER_LOCK_DEADLOCK:
            return True
        if code == _ER_DUP_ENTRY:
            return _VERSION_CONSTRAINT in message
    if not isinstance(exc, IntegrityError):
        return False
    diag = getattr(exc.orig, "diag", None)
    if diag is not None:
        return getattr(diag, "constraint_name", None) == _VERSION_CONSTRAINT
    message = str(exc.orig)
    return "celery_durable_events.stream" in message and "celery_durable_events.version" in message


# -- fork safety ---------------------------------------------------------------------------------

_live_journals: weakref.WeakSet[SqlJournal] = weakref.WeakSet()
_fork_hook_lock = threading.Lock()
_fork_hook_installed = False


def _track_for_fork(journal: SqlJournal) -> None:
    global _fork_hook_installed
    with _fork_hook_lock:
        if not _fork_hook_installed and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hook_installed = True
        _live_journals.add(journal)


def _after_fork_in_child() -> None:
    for journal in list(_live_journals):
        journal._after_fork_in_child()


if TYPE_CHECKING:
    # mypy proves here that SqlJournal implements the Journal protocol.
    _implements_journal: type[Journal] = SqlJournal
