"""The SQL journal: SQLAlchemy Core over SQLite (a file), PostgreSQL (psycopg 3) or MySQL/MariaDB.

This module holds what the three share; what differs lives in one module per database
(:mod:`.sqlite`, :mod:`.postgres`, :mod:`.mysql`, behind :class:`.database.Database`).
Three decisions shape the journal; docs/journal.md gives the measurements behind them.

* **No read before write.** An append is one ``INSERT … SELECT … WHERE`` statement per event.
  The unique ``(stream, version)`` constraint catches a writer that got there first; the
  ``WHERE`` refuses an event whose previous version does not exist, so an expected version
  beyond the end of the stream cannot leave a gap. Both checks run inside the statement that
  stores the event, so the normal path costs no extra round trip. On SQLite, where such an
  ``INSERT … SELECT`` goes through a temporary table, a trigger of the events table refuses
  the gap instead, and a plain ``INSERT … VALUES`` stores the event
  (``Database.refuses_gaps``, journal schema version 5).
* **SQLite writers queue instead of deadlocking** (``BEGIN IMMEDIATE``, :mod:`.sqlite`).
* **Commit order equals position order for ordered categories** on PostgreSQL and MySQL: a
  per-category lock taken before a position is drawn (:mod:`.postgres`, :mod:`.mysql`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table, bindparam, create_engine, func, select
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
    SQLAlchemyError,
)
from sqlalchemy.sql import ClauseElement, Select

from celery_durable.core.journal import Append, Journal, NewEvent, StoredEvent
from celery_durable.errors import AppendConflict, JournalError, JournalUnavailable
from celery_durable.store.journal import schema
from celery_durable.store.journal.database import (
    PLAIN_INSERT,
    VALUES_INSERT,
    Database,
    stream_insert_statement,
    stream_insert_values,
)
from celery_durable.store.journal.direct import DirectConnections
from celery_durable.store.journal.encoding import (
    _check_int,
    _rows,
    _stored,
    encode_data,
    first_misfit,
    stored_events,
)
from celery_durable.store.journal.errors import as_journal_error, one_line, translated
from celery_durable.store.journal.postgres import PostgresDatabase, advisory_key, copy_rows
from celery_durable.store.journal.prepared import Prepared
from celery_durable.store.journal.urls import (
    is_mysql,
    is_sqlite,
    normalize_url,
    redact,
    split_secrets,
)

__all__ = [
    "EngineOptionsRefused",
    "SqlJournal",
    "advisory_key",
    "copy_rows",
    "encode_data",
    "open_journal",
    "read_all_query",
]

log = logging.getLogger("celery_durable.journal.sql")

# Key in Connection.info while a journal.transaction() is open on that connection.
_TX_KEY = "celery_durable_tx"
_events = schema.events


_DRIVER_EXTRAS = {"psycopg": "postgres", "psycopg_binary": "postgres", "psycopg_c": "postgres"}


class EngineOptionsRefused(ValueError):
    """``create_engine`` refused the engine options (an unknown keyword, a wrong type)."""


def _create_engine(url: Any, options: dict[str, Any], shown: str) -> Engine:
    """``create_engine``, with a missing database driver named with the extra that installs it."""
    try:
        return create_engine(url, **options)
    except (ArgumentError, TypeError) as exc:  # an option create_engine or the pool refuses
        raise EngineOptionsRefused(f"engine options of {shown} refused: {one_line(exc)}") from exc
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


_BULK_ROWS = 64
"""From this many rows over distinct streams, appends take the bulk path (one guard query)."""

_EVENT_COLUMNS = (
    _events.c.position,
    _events.c.stream,
    _events.c.version,
    _events.c.type,
    _events.c.data,
    _events.c.recorded_at,
)

_READ_STREAM = (
    select(*_EVENT_COLUMNS)
    .where(_events.c.stream == bindparam("stream"), _events.c.version > bindparam("after"))
    .order_by(_events.c.version)
)
"""A stream's events after a version (built once: a delivery reads its run's stream)."""


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

    What differs by database (engine defaults, connection set-up, locks, bulk inserts) is the
    :class:`~.database.Database` of the URL (:func:`database_for`); ``engine_options``
    overrides the defaults.

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
        if isinstance(ordered_categories, str):
            raise TypeError("ordered_categories must be a collection of names, not a str")
        self.ordered_categories = frozenset(ordered_categories)
        engine_url, secrets = split_secrets(self._sa_url)
        self.database = database_for(engine_url, self.url, sqlite_synchronous=sqlite_synchronous)
        # Each server database replaces at checkout a pooled connection the server dropped
        # while it sat idle (restart, failover, idle_session_timeout, a proxy's cut), before a
        # statement fails on it: PostgreSQL and PyMySQL by a look at its socket
        # (:func:`.database.refuse_if_closed`), mysqlclient by pool_pre_ping. SQLite has no
        # server to drop a connection to a file, and no check (docs/journal.md, "Engine options").
        options = self.database.engine_options({"echo": echo}, engine_options)
        connect_args: dict[str, Any] = {**self.database.connect_args(), **secrets}
        options["connect_args"] = {**connect_args, **options.get("connect_args", {})}
        # ``_core`` serves the journal's own statements; ``engine`` is what everyone else gets
        # (the same pool; on SQLite with the begin-event recipe, :mod:`.sqlite`).
        self._core: Engine = _create_engine(engine_url, options, self.url)
        self.engine: Engine = self.database.listen(self._core, engine_options)
        self.metadata = schema.metadata
        self._init_lock = threading.Lock()
        self._local = threading.local()  # .open: a transaction() is open in this thread
        self._prepared: dict[Any, Prepared] = {}  # statement (or its key) -> rendered form
        # SQLite: a step's INSERT and a delivery's read on the driver's own connections (.direct)
        self._direct = (
            DirectConnections(self._core)
            if self.database.direct_statements and DirectConnections.suits(self._core)
            else None
        )
        self._recorded_at: Callable[[Any], Any] | None = None  # (its result processor)
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
        self.database.prepare()
        attempts = 3
        for attempt in range(1, attempts + 1):
            try:
                self.database.create_schema(
                    self._core, self._write_connection, sorted(self.ordered_categories)
                )
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
                    f"cannot open the journal at {self.url}: {one_line(exc.orig)}"
                ) from exc
            except DBAPIError as exc:
                raise JournalError(
                    f"cannot open the journal at {self.url}: {one_line(exc.orig)}"
                ) from exc

    def close(self) -> None:
        """Dispose of the engine's connections. Calling it twice is harmless."""
        with self._init_lock:
            if self._closed:
                return
            self._closed = True
            self._ready = False
        if self._direct is not None:
            self._direct.close()
        self._core.dispose()

    def _after_fork_in_child(self) -> None:
        # SQLAlchemy's recipe for pools and os.fork(): forget the parent's connections without
        # closing them (they still belong to the parent). A fresh lock too: a thread of the
        # parent may have held the old one at the instant of the fork.
        self._core.dispose(close=False)
        if self._direct is not None:
            self._direct.forget()
        self._init_lock = threading.Lock()

    # -- writing -----------------------------------------------------------------------------

    def transaction(self) -> AbstractContextManager[Connection]:
        """A write transaction for appends and the caller's own tables, committed at the end.

        On SQLite it starts with ``BEGIN IMMEDIATE`` (waits up to 30 s for other writers).
        An exception rolls everything back. If an :meth:`append_in` inside failed and the
        caller swallowed the error, the transaction is rolled back and :class:`JournalError`
        raised: part of the appends may have reached the database before the failure.

        The store's own modules use it; the database layer's errors leave it as they are
        (:meth:`writing` is the same transaction with them translated, :mod:`.errors`).

        Inside the block, write only through ``conn`` (:meth:`append_in`): :meth:`append`,
        :meth:`append_many` or a second :meth:`transaction` in the same thread would wait for
        this one's locks forever, so they raise :class:`JournalError` instead. Reads through
        the journal's other methods work but do not see this transaction's uncommitted rows.
        """
        return self._transaction(None)

    @contextmanager
    def _transaction(self, doing: str | None) -> Iterator[Connection]:
        """:meth:`transaction`, and :meth:`writing` when ``doing`` names what to say in its
        translated errors: one generator for both, as every durable step opens one."""
        try:
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
                    # On a connection the server dropped even reading `info` raises: keep
                    # the original error, not that one.
                    with contextlib.suppress(SQLAlchemyError):
                        conn.info.pop(_TX_KEY, None)
        except SQLAlchemyError as exc:
            if doing is None:
                raise
            raise as_journal_error(exc, self.url, doing) from exc

    def in_transaction(self) -> bool:
        """Whether a :meth:`transaction` is open in this thread (a signal handler running
        while it is, for example, must not start another one)."""
        return bool(getattr(self._local, "open", False))

    def _refuse_nesting(self) -> None:
        if self.in_transaction():
            raise JournalError(
                "a journal transaction is already open in this thread: it holds the write lock "
                "this call would wait for; append through append_in(conn, ...) instead"
            )

    @contextmanager
    def _write_connection(self) -> Iterator[Connection]:
        with self._core.connect() as conn:
            with conn.begin():
                self.database.begin_write(conn)
                yield conn
            self.database.committed(conn)

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
        if (
            len(rows) == 1
            and self.database.autocommits_one_row
            and rows[0]["category"] not in self.ordered_categories
        ):
            self._append_alone(appends, rows)
            return versions[0]
        with self.writing() as conn:
            self._append_rows(conn, appends, rows)
        return versions[0]

    def _append_alone(self, appends: Sequence[Append], rows: list[dict[str, Any]]) -> None:
        """One event of an unordered category (a durable step's result, W2): one INSERT in
        autocommit mode, which is its own transaction (``Database.autocommits_one_row``)."""
        self._refuse_nesting()
        self.ensure_ready()
        direct = self._direct
        if direct is not None and direct.usable():
            self._append_direct(direct, appends, rows[0])
            return
        try:
            with self._core.connect() as conn:
                self.database.autocommit(conn)
                conn.info[_TX_KEY] = _TxState()
                try:
                    self._append_rows(conn, appends, rows)
                finally:
                    with contextlib.suppress(SQLAlchemyError):
                        conn.info.pop(_TX_KEY, None)
                conn.commit()  # nothing to send in autocommit mode; SQLAlchemy's bookkeeping
        except SQLAlchemyError as exc:
            raise as_journal_error(exc, self.url, "write to") from exc

    def _append_direct(
        self, direct: DirectConnections, appends: Sequence[Append], row: dict[str, Any]
    ) -> None:
        """:meth:`_append_alone` on SQLite, on the driver's own connection (:mod:`.direct`):
        the same statement (the database refuses a gap, :attr:`Database.refuses_gaps`) and
        the same errors."""
        row["recorded_at"] = datetime.now(timezone.utc)
        prepared = self._prepared.get(VALUES_INSERT)
        if prepared is None:
            prepared = self._prepared[VALUES_INSERT] = Prepared(VALUES_INSERT, self._core.dialect)
        try:
            count = direct.run(prepared.sql, prepared.parameters(row))
        except (IntegrityError, OperationalError) as exc:
            if not self.database.is_version_conflict(exc):
                raise as_journal_error(exc, self.url, "write to") from exc
            raise self._conflict(appends) from None
        except SQLAlchemyError as exc:
            raise as_journal_error(exc, self.url, "write to") from exc
        if count != 1:  # pragma: no cover - the trigger raises instead
            raise self._conflict(appends)

    def append_in_one(
        self,
        append: Append,
        key: Any,
        build: Callable[[], ClauseElement],
        params: Mapping[str, Any],
    ) -> tuple[int, Any]:
        """Append one stream's events with the caller's writes in one statement that answers
        one row (``build()``, rendered once under ``key``: the events bound as by
        :func:`~.database.stream_insert_statement`, ``params`` for the rest, ``rows`` their
        count, and an ``added`` column that says how many went in), in autocommit mode: the
        statement is its own transaction. Returns the stream's new version and the row.
        Raises :class:`AppendConflict` when the expected version is not the stream's (nothing
        of the statement is stored then)."""
        rows, versions = _rows([append])
        now = datetime.now(timezone.utc)
        for row in rows:
            row["recorded_at"] = now
        values = {**stream_insert_values(rows), **params, "rows": len(rows)}
        self._refuse_nesting()
        self.ensure_ready()
        try:
            with self._core.connect() as conn:
                self.database.autocommit(conn)
                statement = self.prepared(key, build, conn)
                try:
                    answer = statement.execute(conn, values).one()
                except (IntegrityError, OperationalError) as exc:
                    if not self.database.is_version_conflict(exc):
                        raise
                    raise self._conflict([append]) from None
                conn.commit()  # nothing to send in autocommit mode; SQLAlchemy's bookkeeping
        except SQLAlchemyError as exc:
            raise as_journal_error(exc, self.url, "write to") from exc
        if answer.added != len(rows):
            # Refused by the WHERE clause: the previous version does not exist.
            raise self._conflict([append])
        return versions[0], answer

    def append_many(self, appends: Sequence[Append]) -> None:
        """Append to several streams in one transaction: all are stored or none.

        Raises :class:`AppendConflict` with ``stream`` set to the first conflicting stream
        (``None`` in the rare case it cannot be told).
        """
        rows, _ = _rows(appends, allow_empty=True)
        if not rows:
            return
        with self.writing() as conn:
            self._append_rows(conn, appends, rows)

    def writing(self) -> AbstractContextManager[Connection]:
        """A :meth:`transaction` whose database errors leave as the library's own
        (:mod:`.errors`): what the store's units of work and the public appends use."""
        return self._transaction("write to")

    def _append_rows(
        self, conn: Connection, appends: Sequence[Append], rows: list[dict[str, Any]]
    ) -> None:
        state = conn.info.get(_TX_KEY)
        if not isinstance(state, _TxState):
            raise JournalError("append_in needs a connection from journal.transaction()")
        statement = PLAIN_INSERT
        now = datetime.now(timezone.utc)
        for row in rows:
            row["recorded_at"] = now
        if len(rows) >= _BULK_ROWS and len({a.stream for a in appends}) == len(appends):
            self._append_bulk(conn, state, appends, rows)
            return
        database = self.database
        if not database.serialises_writers:
            needed = sorted(
                ({row["category"] for row in rows} & self.ordered_categories) - state.locked
            )
            if len(needed) == 1:
                statement = database.locked_insert(needed[0], rows)
            else:
                self._take_locks(conn, needed)
            state.locked.update(needed)
        if statement is PLAIN_INSERT and database.refuses_gaps:
            statement = VALUES_INSERT
        try:
            if 1 < len(rows) <= _PREPARED_ROWS and statement is PLAIN_INSERT and len(appends) == 1:
                # A claim (RunStarted, RunClaimed), an end with its lease renewal: one
                # statement for the stream's few rows, one round trip (.prepared).
                size = len(rows)
                multi = self.prepared(
                    ("stream_insert", size), lambda: stream_insert_statement(size), conn
                )
                count = multi.execute(conn, stream_insert_values(rows)).rowcount
            elif len(rows) <= _PREPARED_ROWS:
                # A step's result, a claim, an end: the statement as rendered once (.prepared),
                # row by row (cheaper than an executemany's set-up for so few).
                prepared = self.prepared(statement, lambda: statement, conn)
                count = 0
                for row in rows:
                    count += prepared.execute(conn, row).rowcount
            else:
                count = conn.execute(statement, rows).rowcount
        except (IntegrityError, OperationalError) as exc:
            state.failed = True
            if not database.is_version_conflict(exc):
                raise
            raise self._conflict(appends) from None
        if count != len(rows):
            # A row was refused by the WHERE clause: its previous version does not exist.
            state.failed = True
            if statement is not PLAIN_INSERT and statement is not VALUES_INSERT:
                # or the category's lock row was deleted
                database.refused_insert(self._core, self.ordered_categories)
            raise self._conflict(appends)

    def prepared(self, key: Any, build: Callable[[], ClauseElement], conn: Connection) -> Prepared:
        """The statement ``build()`` makes, rendered once for this journal's database and kept
        under ``key`` (:mod:`.prepared`): the hot paths of a durable run (its claim, its end, a
        child waking its parent) skip SQLAlchemy's per-execution cache-key walk."""
        found = self._prepared.get(key)
        if found is None:
            found = self._prepared[key] = Prepared(build(), conn.dialect)
        return found

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
        if not self.database.serialises_writers:
            needed = sorted(
                ({r["category"] for r in rows} & self.ordered_categories) - state.locked
            )
            self._take_locks(conn, needed)  # before any position is drawn
            state.locked.update(needed)
        names = [a.stream for a in appends]
        current: dict[str, int] = {}
        for start in range(0, len(names), 1000):
            current.update(self.database.stream_heads(conn, names[start : start + 1000]))
        conflict = first_misfit(appends, lambda stream: current.get(stream, 0))
        if conflict is not None:
            state.failed = True
            raise conflict
        try:
            # On MySQL the drivers turn the executemany into multi-row INSERTs (PyMySQL:
            # statements of up to ~1 MB); PostgreSQL copies (:func:`.postgres.copy_rows`).
            self.database.insert_many(conn, rows)
        except (IntegrityError, OperationalError) as exc:
            state.failed = True
            if not self.database.is_version_conflict(exc):
                raise
            raise self._conflict(appends) from None

    def _take_locks(self, conn: Connection, categories: Sequence[str]) -> None:
        """Lock the (sorted) categories for this transaction: two transactions that need the
        same locks take them in the same order."""
        for category in categories:
            self.database.take_lock(conn, category)

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
                    heads.update(self.database.stream_heads(reader, streams[start : start + 500]))
        except DBAPIError:
            log.warning("could not read stream heads to explain an append conflict", exc_info=True)
            return AppendConflict("append conflict", stream=None, expected_version=None)
        return first_misfit(appends, lambda stream: heads.get(stream, 0)) or AppendConflict(
            "append conflict with a concurrent writer", stream=None, expected_version=None
        )

    # -- reading -----------------------------------------------------------------------------

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        """A connection for the public reads; a refused or lost connection leaves as
        :class:`JournalUnavailable` (one line, password masked), so that a web view can answer
        "try again later" by catching one exception (docs/flask.md)."""
        self.ensure_ready()
        # On SQLite each read is one SELECT in autocommit mode: a statement is its own snapshot.
        with translated(self.url, "read"), self._core.connect() as conn:
            yield conn

    def read_stream(self, stream: str, after_version: int = 0) -> list[StoredEvent]:
        """Events of one stream with version > ``after_version``, oldest first."""
        _check_int("after_version", after_version)
        direct = self._direct
        if direct is not None and direct.usable():
            return self._read_stream_direct(direct, stream, after_version)
        with self._reading() as conn:
            rows = conn.execute(_READ_STREAM, {"stream": stream, "after": after_version}).all()
        return [_stored(row) for row in rows]

    def _read_stream_direct(
        self, direct: DirectConnections, stream: str, after_version: int
    ) -> list[StoredEvent]:
        """:meth:`read_stream` on SQLite, on the driver's own connection (:mod:`.direct`):
        the same statement, the instants read by the column type's own result processor."""
        self.ensure_ready()
        dialect = self._core.dialect
        prepared = self._prepared.get(_READ_STREAM)
        if prepared is None:
            prepared = self._prepared[_READ_STREAM] = Prepared(_READ_STREAM, dialect)
        recorded_at = self._recorded_at
        if recorded_at is None:
            column_type = _events.c.recorded_at.type.dialect_impl(dialect)
            processor = column_type.result_processor(dialect, None)
            recorded_at = self._recorded_at = processor or _same
        parameters = prepared.parameters({"stream": stream, "after": after_version})
        try:
            rows = direct.run(prepared.sql, parameters, _fetch_all)
        except SQLAlchemyError as exc:
            raise as_journal_error(exc, self.url, "read") from exc
        return stored_events(rows, recorded_at)

    def read_streams(
        self, streams: Sequence[str], *, types: Collection[str] | None = None
    ) -> dict[str, list[StoredEvent]]:
        """The events of several streams (only those of ``types`` when given), oldest first,
        by stream; a stream without such events is left out.

        One statement per 500 streams, through the ``(stream, version)`` key: a page showing
        many runs reads their endings at once, not one stream per run, and a parent reads the
        ends of its children in flight in one query (W11).
        """
        wanted = list(dict.fromkeys(streams))
        found: dict[str, list[StoredEvent]] = {}
        if not wanted or (types is not None and not types):
            return found
        with self._reading() as conn:
            for start in range(0, len(wanted), 500):
                query = select(*_EVENT_COLUMNS).where(
                    self.database.one_of(_events.c.stream, wanted[start : start + 500])
                )
                if types is not None:
                    query = query.where(_events.c.type.in_(sorted(types)))
                for row in conn.execute(query.order_by(_events.c.position)):
                    event = _stored(row)
                    found.setdefault(event.stream, []).append(event)
        return found

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
                    .where(self.database.one_of(_events.c.position, chunk))
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


_PREPARED_ROWS = 3
"""Appends of at most this many rows run the prepared statement row by row."""


def _fetch_all(cursor: Any) -> list[Any]:
    rows: list[Any] = cursor.fetchall()
    return rows


def _same(value: Any) -> Any:
    return value


def database_for(url: URL, shown: str, *, sqlite_synchronous: str = "FULL") -> Database:
    """The :class:`~.database.Database` of a (normalised) journal URL.

    Each database's module (and SQLAlchemy's dialect behind it) is imported for its own URLs
    only: a beat on PostgreSQL loads neither MySQL's nor SQLite's (D13, 2026-12-06).
    """
    if is_sqlite(url):
        from celery_durable.store.journal.sqlite import SqliteDatabase

        return SqliteDatabase(url, shown, synchronous=sqlite_synchronous)
    if is_mysql(url):
        from celery_durable.store.journal.mysql import MysqlDatabase

        return MysqlDatabase(url, shown)
    return PostgresDatabase(url, shown)


def open_journal(url: str, **options: Any) -> SqlJournal:
    """Build a :class:`SqlJournal` (nothing connects until it is first used)."""
    return SqlJournal(url, **options)


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
