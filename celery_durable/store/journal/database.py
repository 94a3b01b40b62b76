"""What the SQL journal does differently on each database, behind one interface.

:class:`~celery_durable.store.journal.sql.SqlJournal` holds the algorithm (one ``INSERT …
SELECT … WHERE`` per event, the bulk path, the conflict check, the reads); a :class:`Database`
holds what depends on the server: engine defaults and connection set-up, how a write
transaction begins, how the writers of an ordered category are serialised, how many rows go
in at once, and which driver error means "another writer stored this version first". There is
one module per database (:mod:`.sqlite`, :mod:`.postgres`, :mod:`.mysql`), as DBOS keeps one
system-database module per server. The other tables of the store (the run table, the schedule
index) write their rows through the same object: an insert that leaves an existing row alone,
an insert-or-update, an upsert that keeps the higher version, ``IN`` over many values.
"""

from __future__ import annotations

import select as io_select
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import (
    Integer,
    String,
    Table,
    Text,
    and_,
    bindparam,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    union_all,
)
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError, DisconnectionError, IntegrityError
from sqlalchemy.sql import ColumnElement, Insert, Subquery

from celery_durable.store.journal import schema
from celery_durable.store.journal.encoding import (
    MAX_CATEGORY_LENGTH,
    MAX_STREAM_LENGTH,
    MAX_TYPE_LENGTH,
)

WriteConnection = Callable[[], AbstractContextManager[Connection]]
"""Opens a write transaction of the journal (``BEGIN IMMEDIATE`` on SQLite)."""

VERSION_CONSTRAINT = "uq_celery_durable_events_stream_version"
"""The unique ``(stream, version)`` constraint whose violation is an append conflict (A8)."""

_events = schema.events
_prev = _events.alias("prev")


def _follows_previous(stream: str, prev: str) -> ColumnElement[bool]:
    """The append's guard (A8): the event of version ``:prev + 1`` of ``:stream`` goes in only
    when version ``:prev`` exists, or it is the stream's first."""
    return or_(
        bindparam(prev, type_=Integer) == literal(0, Integer),
        exists().where(
            and_(
                _prev.c.stream == bindparam(stream, type_=String(MAX_STREAM_LENGTH)),
                _prev.c.version == bindparam(prev, type_=Integer),
            )
        ),
    )


def insert_statement(lock: Subquery | None = None) -> Insert:
    """One statement that stores one event.

    The WHERE clause lets the row in only when the stream's previous version exists (or the
    event is version 1); a concurrent writer of the same version is stopped by the unique
    constraint. ``lock`` is a one-row subquery the row is selected from, which takes the
    category's lock before the row's position is drawn. ``preserve_rowcount`` because the count
    of inserted rows is how a refused row shows up.
    """
    rows = select(
        bindparam("stream", type_=String(MAX_STREAM_LENGTH)),
        bindparam("version", type_=Integer),
        bindparam("category", type_=String(MAX_CATEGORY_LENGTH)),
        bindparam("type", type_=String(MAX_TYPE_LENGTH)),
        bindparam("data", type_=Text),
        bindparam("recorded_at", type_=schema.UtcDateTime),
    ).where(_follows_previous("stream", "prev"))
    if lock is not None:
        rows = rows.select_from(lock)
    columns = ["stream", "version", "category", "type", "data", "recorded_at"]
    return insert(_events).from_select(columns, rows).execution_options(preserve_rowcount=True)


PLAIN_INSERT = insert_statement()


def stream_insert_statement(count: int) -> Insert:
    """One statement that stores ``count`` consecutive events of one stream (a claim's
    ``RunStarted`` and ``RunClaimed``, an end with its lease renewal): one round trip instead
    of one per event (W11's fan-out, 2026-12-06).

    The rows' values are bound as ``<name>_<i>`` (``stream_0``, ``version_1`` …). As in
    :func:`insert_statement`, the ``WHERE`` lets the rows in only when the first one's
    previous version exists (or it is version 1): the later rows follow it in the same
    statement, and the unique constraint stops a concurrent writer of any of the versions.
    The count of inserted rows is ``count`` or 0. (One row: the same statement as
    :func:`insert_statement`'s, with its parameters named as here, for a caller that builds
    on it, :func:`~celery_durable.store.runs.run_write_statement`.)"""
    if count < 1:
        raise ValueError("a stream insert stores at least one event")
    parts = [
        select(
            bindparam(f"stream_{i}", type_=String(MAX_STREAM_LENGTH)).label("stream"),
            bindparam(f"version_{i}", type_=Integer).label("version"),
            bindparam(f"category_{i}", type_=String(MAX_CATEGORY_LENGTH)).label("category"),
            bindparam(f"type_{i}", type_=String(MAX_TYPE_LENGTH)).label("type"),
            bindparam(f"data_{i}", type_=Text).label("data"),
            bindparam(f"recorded_at_{i}", type_=schema.UtcDateTime).label("recorded_at"),
        )
        for i in range(count)
    ]
    given = (parts[0] if count == 1 else union_all(*parts)).subquery("given")
    rows = select(
        given.c.stream,
        given.c.version,
        given.c.category,
        given.c.type,
        given.c.data,
        given.c.recorded_at,
    ).where(_follows_previous("stream_0", "prev_0"))
    columns = ["stream", "version", "category", "type", "data", "recorded_at"]
    return insert(_events).from_select(columns, rows).execution_options(preserve_rowcount=True)


def stream_insert_values(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The parameters of :func:`stream_insert_statement` for ``rows`` (one stream's rows, in
    version order, as the journal builds them)."""
    values: dict[str, Any] = {"prev_0": rows[0]["prev"]}
    for i, row in enumerate(rows):
        for name in ("stream", "version", "category", "type", "data", "recorded_at"):
            values[f"{name}_{i}"] = row[name]
    return values


VALUES_INSERT = (
    insert(_events)
    .values(
        stream=bindparam("stream", type_=String(MAX_STREAM_LENGTH)),
        version=bindparam("version", type_=Integer),
        category=bindparam("category", type_=String(MAX_CATEGORY_LENGTH)),
        type=bindparam("type", type_=String(MAX_TYPE_LENGTH)),
        data=bindparam("data", type_=Text),
        recorded_at=bindparam("recorded_at", type_=schema.UtcDateTime),
    )
    .execution_options(preserve_rowcount=True)
)
"""The event's row alone, for a database whose events table refuses a gap itself
(:attr:`Database.refuses_gaps`); a concurrent writer of the same version is still stopped by
the unique constraint."""


class Database:
    """The journal's behaviour on one kind of database server (the base: what they share)."""

    #: Whether the database lets one writer in at a time (SQLite): no category locks needed.
    serialises_writers = False
    #: Whether an append of one event runs as one statement in autocommit mode (its own
    #: transaction, no ``BEGIN`` and ``COMMIT`` round trips): :meth:`autocommit`.
    autocommits_one_row = False
    #: Whether the events table itself refuses a row whose previous version is missing
    #: (SQLite: a trigger, :data:`.schema.SQLITE_GAP_TRIGGER`): appends then store events with
    #: a plain :data:`VALUES_INSERT` instead of :data:`PLAIN_INSERT`'s ``WHERE`` clause, and
    #: :meth:`is_version_conflict` knows the table's refusal.
    refuses_gaps = False
    #: Whether a step's append and a run's read go to the driver's own connections when
    #: nothing listens to SQLAlchemy's (SQLite: :mod:`.direct`).
    direct_statements = False
    #: Whether an ``UPDATE … RETURNING`` gives the updated row back (PostgreSQL): a child's
    #: end then counts down or wakes its parent's row in one statement
    #: (:func:`~celery_durable.store.runs.wake_row`) instead of a locking read and a write.
    updates_returning = False
    #: Whether a run's events, its row and its parent's wake-up can be written by one
    #: statement in autocommit mode (PostgreSQL: data-modifying ``WITH``, ``ON CONFLICT``):
    #: :func:`~celery_durable.store.runs.write_run`, one round trip for a child's claim or end.
    writes_in_one_statement = False

    def __init__(self, url: URL, shown: str) -> None:
        self.url = url
        self.shown = shown
        """The journal's URL with the password masked, for messages."""

    # -- engine ----------------------------------------------------------------------------------

    def connect_args(self) -> dict[str, Any]:
        """Driver connect arguments the library sets (the caller's ``connect_args`` win)."""
        return {}

    def engine_options(
        self, options: dict[str, Any], engine_options: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        """The engine options: the library's defaults for this database, then the caller's."""
        return {**options, **(engine_options or {})}

    def listen(self, core: Engine, engine_options: Mapping[str, Any] | None) -> Engine:
        """Install the connection-set-up listeners on ``core``; return the engine the journal
        lends to everyone else (``journal.engine``)."""
        return core

    # -- schema ------------------------------------------------------------------------------------

    def prepare(self) -> None:
        """What must exist before the first connection (SQLite: the file's directory)."""

    def create_schema(
        self, core: Engine, write_connection: WriteConnection, lock_categories: Sequence[str]
    ) -> None:
        """Create the missing tables and check the schema version, serialised against other
        processes doing the same."""
        with write_connection() as conn:
            schema.ensure_schema(conn)

    def tables(self) -> list[Table]:
        """Every table of the library on this database (:func:`.schema.ddl` writes them)."""
        return list(schema.metadata.sorted_tables)

    def ddl_notes(self) -> list[str]:
        """What a DBA should know about the DDL for this database (one line each)."""
        return []

    # -- writing -----------------------------------------------------------------------------------

    def begin_write(self, conn: Connection) -> None:
        """Run right after a write transaction began (SQLite takes its write lock here)."""

    def autocommit(self, conn: Connection) -> None:
        """Put a fresh connection in autocommit mode until it goes back to the pool (only
        called when :attr:`autocommits_one_row`)."""
        raise NotImplementedError

    def committed(self, conn: Connection) -> None:
        """Run after a write transaction committed, before its connection goes back."""

    def take_lock(self, conn: Connection, category: str) -> None:
        """Lock an ordered category until the end of the transaction (commit order equals
        position order for its readers)."""

    def locked_insert(self, category: str, rows: Sequence[dict[str, Any]]) -> Insert:
        """The insert statement that also takes ``category``'s lock (one round trip fewer);
        adds the lock's parameter to ``rows``."""
        raise NotImplementedError

    def refused_insert(self, core: Engine, lock_categories: frozenset[str]) -> None:
        """Run when the insert let in fewer rows than asked (before the conflict is raised)."""

    def insert_many(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """Insert rows already checked by the bulk path's guard query."""
        plain = [{k: v for k, v in row.items() if k != "prev"} for row in rows]
        conn.execute(insert(_events), plain)

    def is_version_conflict(self, exc: DBAPIError) -> bool:
        """Whether an append failed because another writer stored one of its versions first
        (SQLite names the constraint's columns in its message)."""
        if not isinstance(exc, IntegrityError):
            return False
        message = str(exc.orig)
        return (
            "celery_durable_events.stream" in message and "celery_durable_events.version" in message
        )

    # -- rows of the library's other tables --------------------------------------------------------

    def insert(self, table: Table) -> Any:
        """The dialect's ``INSERT`` (the one with its conflict clauses)."""
        raise NotImplementedError

    def insert_or_ignore(self, table: Table, key: str) -> Any:
        """An ``INSERT`` that leaves a row whose ``key`` exists alone, for many rows at once.

        Its row count is not the number of rows inserted on every database: ask
        :meth:`insert_new` for one row when that matters.
        """
        return self.insert(table).on_conflict_do_nothing(index_elements=[key])

    def insert_or_update(self, table: Table, key: str, values: Mapping[str, Any]) -> Any:
        """An ``INSERT`` whose row, when ``key`` exists, sets ``values`` on the existing one."""
        return self.insert(table).on_conflict_do_update(index_elements=[key], set_=dict(values))

    def insert_newer(self, table: Table, key: str, columns: Sequence[str], version: str) -> Any:
        """An upsert on ``key`` that takes the new ``columns`` only when the new ``version`` is
        not lower than the stored one (a projection's rows never go back)."""
        stmt = self.insert(table)
        return stmt.on_conflict_do_update(
            index_elements=[table.c[key]],
            set_={c: stmt.excluded[c] for c in columns},
            where=table.c[version] <= stmt.excluded[version],
        )

    def insert_new(self, conn: Connection, table: Table, key: str, row: Mapping[str, Any]) -> bool:
        """Insert one row unless ``key`` exists; whether it was inserted."""
        # preserve_rowcount: without it psycopg's INSERT reports -1, which reads as inserted.
        statement = self.insert_or_ignore(table, key).values(**row)
        return bool(conn.execute(statement.execution_options(preserve_rowcount=True)).rowcount)

    def one_of(self, column: ColumnElement[Any], values: Sequence[Any]) -> ColumnElement[bool]:
        """``column IN values``."""
        return column.in_(values)

    def stream_heads(self, conn: Connection, streams: Sequence[str]) -> dict[str, int]:
        """The current version of each of these streams that has events (a bulk append's
        guard, A8): ``max(version)`` per stream, read through the ``(stream, version)`` index."""
        events = schema.events
        query = (
            select(events.c.stream, func.max(events.c.version))
            .where(self.one_of(events.c.stream, streams))
            .group_by(events.c.stream)
        )
        return {stream: int(version) for stream, version in conn.execute(query)}

    def return_space(
        self, engine: Engine, write_connection: WriteConnection, more: Callable[[], bool]
    ) -> None:
        """Hand the pages freed by deletes back to the file system, while ``more()`` (SQLite);
        the servers reuse them by themselves."""


def refuse_if_closed(sock: Any, server: str) -> None:
    """Pool checkout: refuse a connection its server has closed, at no round trip.

    An idle connection has nothing to read. When the server closes it (an idle timeout, a
    restart, a terminated session, a proxy's cut) its socket turns readable: end of file, or
    the error message the server sends first. ``DisconnectionError`` makes the pool discard it
    and hand out a fresh connection (SQLAlchemy's "custom pessimistic ping" recipe). Anything
    else the server might send to an idle session (a setting changed by a reload) costs one
    reconnection, never a wrong answer. ``sock``: a socket or a file descriptor; ``None`` when
    the driver knows the connection is closed.
    """
    if sock is None:
        raise DisconnectionError(f"the {server} connection is closed")
    try:
        readable, _, _ = io_select.select([sock], [], [], 0)
    except (OSError, ValueError):
        raise DisconnectionError(f"the {server} connection's socket is unusable") from None
    if readable:
        raise DisconnectionError(f"the {server} server closed the connection")
