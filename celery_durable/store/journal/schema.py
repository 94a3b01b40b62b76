"""The one schema definition of celery_durable: every table, its version, its migrations.

Table and column names are persistent contracts (SPEC §9). To add a table, declare it on
:data:`metadata` below: :func:`ensure_schema` creates missing tables of an existing database on the
next start. To change an existing table, bump the component's entry in :data:`SCHEMA_VERSIONS`,
register a migration with :func:`migration`, and add a test that opens a database written by the
previous version.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    DDL,
    BigInteger,
    Column,
    DateTime,
    Dialect,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    bindparam,
    event,
    insert,
    inspect,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateColumn, CreateIndex, CreateTable
from sqlalchemy.sql.compiler import DDLCompiler
from sqlalchemy.types import TypeEngine

from celery_durable.errors import JournalError
from celery_durable.message import BEAT_ENTRY, IMPORTED, origin_of
from celery_durable.store.journal.urls import normalize_url

__all__ = [
    "MYSQL_DIALECTS",
    "SCHEMA_VERSIONS",
    "SQLITE_GAP_DDL",
    "SQLITE_GAP_MESSAGE",
    "SQLITE_GAP_TRIGGER",
    "UtcDateTime",
    "category_locks",
    "ddl",
    "ddl_notes",
    "ensure_schema",
    "events",
    "heartbeats",
    "leases",
    "metadata",
    "migration",
    "progress",
    "schedule_index",
    "schema_versions",
    "settings",
    "snapshots",
    "use_dialect_options",
]

log = logging.getLogger("celery_durable.journal.schema")

#: SQLAlchemy's names of the MySQL family (a ``mysql://`` URL may still reach a MariaDB server).
MYSQL_DIALECTS = frozenset({"mysql", "mariadb"})


class UtcDateTime(TypeDecorator[datetime]):
    """An instant: aware UTC in Python, ``TIMESTAMP WITH TIME ZONE`` on PostgreSQL.

    SQLite has no date type; SQLAlchemy stores ``YYYY-MM-DD HH:MM:SS.ffffff`` text, which drops
    any offset. We therefore store UTC without an offset there: fixed-width text that sorts in
    time order, so an index on it works for "next due" queries. MySQL/MariaDB get
    ``DATETIME(6)`` holding UTC (``TIMESTAMP`` would depend on the session time zone and end in
    2038; a plain ``DATETIME`` would drop the microseconds). Naive datetimes are refused on the
    way in (an instant without a zone is a bug), and every value read back is aware UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name in MYSQL_DIALECTS:
            from sqlalchemy.dialects.mysql import DATETIME  # loaded for MySQL only

            return dialect.type_descriptor(DATETIME(fsp=6))
        return dialect.type_descriptor(self.impl)

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r} where an aware instant is needed")
        value = value.astimezone(timezone.utc)
        if dialect.name == "sqlite" or dialect.name in MYSQL_DIALECTS:
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any] | None:
        slow = super().bind_processor(dialect)
        if dialect.name != "sqlite" or slow is None:
            return slow
        utc = timezone.utc

        def process(value: Any) -> Any:
            # An instant in UTC (every append's recorded_at) as the text SQLAlchemy writes
            # (``YYYY-MM-DD HH:MM:SS.ffffff``) in one C call instead of its %-formatting of
            # seven fields: ~3 µs of a durable step (2026-12-06).
            if type(value) is datetime and value.tzinfo is utc:
                return value.replace(tzinfo=None).isoformat(" ", "microseconds")
            return slow(value)

        return process

    def result_processor(self, dialect: Dialect, coltype: Any) -> Callable[[Any], Any] | None:
        slow = super().result_processor(dialect, coltype)
        if dialect.name != "sqlite" or slow is None:
            return slow
        fromisoformat = datetime.fromisoformat

        def process(value: Any) -> Any:
            # The text SQLAlchemy writes (``YYYY-MM-DD HH:MM:SS.ffffff``), read in one C call
            # instead of its regular expression: a replay reads a row per step (W2). Read with
            # the offset appended, the instant comes back aware (``timezone.utc`` itself)
            # without the slower ``replace`` (2026-12-06: ~0.8 µs a row).
            if type(value) is str and len(value) == 26 and value[10] == " ":
                try:
                    return fromisoformat(value + "+00:00")
                except ValueError:
                    pass
            return slow(value)

        return process


class JsonText(TypeDecorator[str]):
    """JSON text: ``TEXT`` on SQLite/PostgreSQL; ``LONGTEXT`` on MySQL/MariaDB, whose ``TEXT``
    stops at 64 KiB (the data must come back byte for byte, never truncated).

    Chosen per dialect when a statement is compiled, rather than declared as a variant of
    ``Text``: a variant names its type, and ``mysql.LONGTEXT`` loads SQLAlchemy's MySQL
    dialect into every process, a beat on PostgreSQL included (≈ 15 ms of its launch,
    2026-12-06, D13).
    """

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name in MYSQL_DIALECTS:
            from sqlalchemy.dialects.mysql import LONGTEXT  # loaded for MySQL only

            return LONGTEXT()
        return self.impl_instance


#: Table options for MySQL/MariaDB: InnoDB (transactions, row locks) and 4-byte UTF-8. The
#: collation is added by :func:`_create_table_mysql`, because its name depends on the server.
#: Given to the tables by :func:`use_dialect_options` when a MySQL journal is opened, not where
#: the tables are declared: an option named after a dialect loads that dialect (SQLAlchemy
#: checks its name), and a beat on PostgreSQL has no use for MySQL's or SQLite's (D13).
_MYSQL_TABLE: dict[str, Any] = {
    f"{dialect}_{option}": value
    for dialect in ("mysql", "mariadb")
    for option, value in (("engine", "InnoDB"), ("charset", "utf8mb4"))
}

# Constraint names are fixed here so that migrations and error handling can refer to them.
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
    }
)

events = Table(
    "celery_durable_events",
    metadata,
    # SQLite: INTEGER PRIMARY KEY (the rowid) with AUTOINCREMENT, so a position is never
    # handed out twice, even if the newest rows were ever deleted. PostgreSQL: BIGSERIAL.
    Column(
        "position",
        BigInteger().with_variant(Integer, "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    Column("stream", String(255), nullable=False),
    Column("version", Integer, nullable=False),
    Column("category", String(64), nullable=False),
    Column("type", String(128), nullable=False),
    Column("data", JsonText(), nullable=False),
    Column("recorded_at", UtcDateTime, nullable=False),
    # The optimistic-concurrency guard (A8): two writers can never both store version n.
    UniqueConstraint("stream", "version"),
    Index(None, "category", "position"),
)

#: SQLite only (journal schema version 5, 2026-12-06): the events table itself refuses a row
#: whose stream lacks the previous version, so that an expected version beyond the end of a
#: stream cannot leave a gap (A8). A step's append is then one plain ``INSERT … VALUES``, its
#: own transaction in autocommit mode, instead of an ``INSERT … SELECT … WHERE EXISTS`` that
#: reads the table it writes (which SQLite runs through a temporary table) inside ``BEGIN
#: IMMEDIATE`` … ``COMMIT`` (docs/journal.md). The other databases keep that statement.
SQLITE_GAP_TRIGGER = "celery_durable_events_no_gap"
SQLITE_GAP_MESSAGE = "celery_durable: the previous version of the stream is missing"
SQLITE_GAP_DDL = (
    f"CREATE TRIGGER IF NOT EXISTS {SQLITE_GAP_TRIGGER} BEFORE INSERT ON celery_durable_events "
    "WHEN NEW.version > 1 AND NOT EXISTS (SELECT 1 FROM celery_durable_events "
    "WHERE stream = NEW.stream AND version = NEW.version - 1) "
    f"BEGIN SELECT RAISE(ABORT, '{SQLITE_GAP_MESSAGE}'); END"
)
event.listen(events, "after_create", DDL(SQLITE_GAP_DDL).execute_if(dialect="sqlite"))

schema_versions = Table(
    "celery_durable_schema",
    metadata,
    Column("component", String(64), primary_key=True),
    Column("version", Integer, nullable=False),
)

schedule_index = Table(
    "celery_durable_schedule_index",
    metadata,
    Column("schedule_id", String(255), primary_key=True),
    Column("version", Integer, nullable=False),
    Column("format", Integer, nullable=False),
    Column("next_due", UtcDateTime, nullable=True, index=True),
    Column("state", JsonText(), nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    # Where the schedule came from (message.origin_of): "beat_schedule", an importer's source,
    # NULL for the API's. Beat's start-up reads the rows of its imports by it (D13). Journal
    # schema version 2 (2026-12-04).
    Column("origin", String(64), nullable=True, index=True),
    # The schedule ID's stable hash (core.partitions.slot_of): a beat reads the rows of its
    # partitions by ``slot % N`` (D10). Journal schema version 3 (2026-12-04).
    Column("slot", Integer, nullable=False, server_default="0"),
)

#: Settings of the journal itself, shared by every process that uses it: ``partitions`` (D10),
#: its value as JSON. A table of its own, so older journals gain it on their next start.
settings = Table(
    "celery_durable_settings",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", JsonText(), nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
)

progress = Table(
    "celery_durable_progress",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("position", BigInteger, nullable=False),
)

leases = Table(
    "celery_durable_leases",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("owner", String(255), nullable=False),
    Column("expires_at", UtcDateTime, nullable=False),
)

#: The lease holder's heartbeat (O3), beside its lease row: when it took the lease and when it
#: last completed a tick. Written on taking the lease, after its first tick and with each
#: renewal, never more often; read by ``celery durable health`` and the health gauges. A table of
#: its own, so journals written before it gain it on their next start (no migration).
heartbeats = Table(
    "celery_durable_heartbeats",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("owner", String(255), nullable=False),
    Column("taken_at", UtcDateTime, nullable=False),
    Column("ticked_at", UtcDateTime, nullable=True),
)

#: The latest snapshot of a schedule stream (O2): its folded state (JSON, the index entry format)
#: at ``version``. Retention (O1) deletes run events of the stream below that version; readers
#: that find a gap in a stream start from this row. ``pruned_through``: the latest due time whose
#: records were removed (a backfill decides nothing at or before it, A6).
snapshots = Table(
    "celery_durable_snapshots",
    metadata,
    Column("stream", String(255), primary_key=True),
    Column("version", Integer, nullable=False),
    Column("format", Integer, nullable=False),
    Column("state", JsonText(), nullable=False),
    Column("pruned_through", UtcDateTime, nullable=True),
    Column("taken_at", UtcDateTime, nullable=False),
)

#: MySQL/MariaDB only: one row per ordered category, locked ``FOR UPDATE`` by the writers of the
#: category (the equivalent of PostgreSQL's transaction-scoped advisory lock, see
#: :mod:`celery_durable.store.journal.sql`). Kept out of :data:`metadata` because the other
#: databases have no use for it; the MySQL ``Database`` creates it and lists it for :func:`ddl`.
mysql_metadata = MetaData(naming_convention=metadata.naming_convention)
category_locks = Table(
    "celery_durable_locks",
    mysql_metadata,
    Column("name", String(64), primary_key=True),
)


_SQLITE_TABLE: dict[str, dict[str, Any]] = {"celery_durable_events": {"sqlite_autoincrement": True}}
"""SQLite's table options: the events table's ``AUTOINCREMENT``, so that a position is never
handed out twice, even if the newest rows were ever deleted."""


def use_dialect_options(dialect: str) -> None:
    """Give every table of the library its options for ``dialect`` (``mysql``: InnoDB and
    utf8mb4 for both names of the family; ``sqlite``: the events' ``AUTOINCREMENT``).

    The MySQL and SQLite databases call this when they are built, before any table is
    created or compiled for them; options of one dialect are ignored by the others, so a
    process that opens journals on several databases compiles the same SQL for each.
    """
    tables = [*metadata.tables.values(), *mysql_metadata.tables.values()]
    for table in tables:
        options = _MYSQL_TABLE if dialect in MYSQL_DIALECTS else _SQLITE_TABLE.get(table.name, {})
        for key, value in options.items():
            if table.dialect_kwargs.get(key) != value:
                table.dialect_kwargs[key] = value


@compiles(CreateTable, "mysql")
@compiles(CreateTable, "mariadb")
def _create_table_mysql(element: CreateTable, compiler: DDLCompiler, **kw: Any) -> str:
    """``CREATE TABLE`` of this library's tables with a binary, no-pad collation.

    The server's default (``utf8mb4_general_ci``) would make ``schedule/A`` and ``schedule/a``,
    or ``x`` and ``x `` (trailing space), the same key: the unique ``(stream, version)`` and the
    primary keys must compare IDs exactly as Python does. MariaDB calls that collation
    ``utf8mb4_nopad_bin``, MySQL 8.0 ``utf8mb4_0900_bin``.
    """
    text = compiler.visit_create_table(element, **kw)
    if not element.element.name.startswith("celery_durable_"):
        return text
    collation = "utf8mb4_nopad_bin" if compiler.dialect.is_mariadb else "utf8mb4_0900_bin"  # type: ignore[attr-defined]
    return f"{text.rstrip()} COLLATE={collation}\n\n"


#: The schema version this code writes, per component (rows of ``celery_durable_schema``).
SCHEMA_VERSIONS: dict[str, int] = {"journal": 5}

Migration = Callable[[Connection], None]
# (component, version it produces) → function that upgrades from version - 1, in the caller's
# transaction.
_MIGRATIONS: dict[tuple[str, int], Migration] = {}


def migration(component: str, to_version: int) -> Callable[[Migration], Migration]:
    """Register the function that upgrades ``component`` from ``to_version - 1``."""

    def register(func: Migration) -> Migration:
        key = (component, to_version)
        if key in _MIGRATIONS:
            raise ValueError(f"two migrations for {component} version {to_version}")
        _MIGRATIONS[key] = func
        return func

    return register


@migration("journal", 2)
def _add_schedule_origin(conn: Connection) -> None:
    """Journal version 2 (2026-12-04): the schedule index's ``origin`` column and its index,
    filled from each row's stored options, so that beat's start-up reads only the schedules
    it imported (D13). Safe to run on a table that has them already."""
    table = schedule_index
    column = table.c.origin
    found = inspect(conn)
    if column.name not in {c["name"] for c in found.get_columns(table.name)}:
        spec = CreateColumn(column).compile(dialect=conn.dialect)
        conn.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {spec}"))
    (index,) = [i for i in table.indexes if list(i.columns) == [column]]
    if index.name not in {i["name"] for i in inspect(conn).get_indexes(table.name)}:
        conn.execute(CreateIndex(index))
    # Only rows whose JSON names a marker option can have an origin: the rest stay NULL.
    marked = or_(table.c.state.like(f'%"{BEAT_ENTRY}"%'), table.c.state.like(f'%"{IMPORTED}"%'))
    rows = conn.execute(select(table.c.schedule_id, table.c.state).where(marked)).all()
    for sid, state in rows:
        content = json.loads(state).get("content") or {}
        origin = origin_of(content.get("options") or {})
        if origin is not None:
            conn.execute(update(table).where(table.c.schedule_id == sid).values(origin=origin))


@migration("journal", 3)
def _add_schedule_slot(conn: Connection) -> None:
    """Journal version 3 (2026-12-04): the schedule index's ``slot`` column, each row's stable
    hash of its schedule ID, so that a beat reads only its partitions' rows (D10). Safe to run
    on a table that has it already."""
    from celery_durable.core.partitions import slot_of

    table = schedule_index
    column = table.c.slot
    if column.name not in {c["name"] for c in inspect(conn).get_columns(table.name)}:
        spec = CreateColumn(column).compile(dialect=conn.dialect)
        conn.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {spec}"))
    ids = list(conn.execute(select(table.c.schedule_id)).scalars())
    stmt = update(table).where(table.c.schedule_id == bindparam("sid")).values(slot=bindparam("s"))
    for start in range(0, len(ids), 1000):
        rows = [{"sid": sid, "s": slot_of(sid)} for sid in ids[start : start + 1000]]
        conn.execute(stmt, rows)


@migration("journal", 4)
def _add_run_wake_after(conn: Connection) -> None:
    """Journal version 4 (2026-12-06): the run table's ``wake_after`` column, the countdown of
    child ends that wakes a suspended parent (W11). Rows written before have none: their
    parents are woken by the first child that ends, as before. Safe to run on a table that
    has it already."""
    table = runs
    column = table.c.wake_after
    if column.name not in {c["name"] for c in inspect(conn).get_columns(table.name)}:
        spec = CreateColumn(column).compile(dialect=conn.dialect)
        conn.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {spec}"))


@migration("journal", 5)
def _add_sqlite_gap_trigger(conn: Connection) -> None:
    """Journal version 5 (2026-12-06): on SQLite the events table's trigger that refuses a row
    whose previous version is missing (:data:`SQLITE_GAP_TRIGGER`); nothing on the other
    databases. The rows stored before were checked by the statement that stored them. Safe
    to run on a table that has it already."""
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql(SQLITE_GAP_DDL)


def ensure_schema(conn: Connection) -> None:
    """Create missing tables, then check and upgrade the stored schema versions.

    Runs inside the caller's write transaction, which must already exclude other initialisers
    (``BEGIN IMMEDIATE`` on SQLite, an advisory lock on PostgreSQL). Raises
    :class:`JournalError` when the database was written by a newer version of this library.
    """
    metadata.create_all(conn, checkfirst=True)
    stored = dict(
        conn.execute(select(schema_versions.c.component, schema_versions.c.version)).all()
    )
    for component, current in SCHEMA_VERSIONS.items():
        found = stored.get(component)
        if found is None:
            conn.execute(insert(schema_versions).values(component=component, version=current))
            continue
        if found > current:
            raise JournalError(
                f"the journal's {component} schema is version {found}, but this version of "
                f"celery_durable only knows version {current}: upgrade celery_durable",
                component=component,
                stored_version=found,
                code_version=current,
            )
        if found < current:
            _upgrade(conn, component, found, current)


def _upgrade(conn: Connection, component: str, found: int, current: int) -> None:
    for target in range(found + 1, current + 1):
        step = _MIGRATIONS.get((component, target))
        if step is None:
            raise JournalError(
                f"no migration of the {component} schema from version {target - 1} to {target}",
                component=component,
                stored_version=found,
                code_version=current,
            )
        log.info("migrating the %s schema from version %d to %d", component, target - 1, target)
        step(conn)
        conn.execute(
            update(schema_versions)
            .where(schema_versions.c.component == component)
            .values(version=target)
        )


def ddl(url: str) -> str:
    """The SQL that creates every table of the library for the URL's dialect.

    For databases where the application's user may not create tables: a DBA runs this once,
    then the journal finds the tables and the version rows on first use. Nothing connects.
    """
    from celery_durable.store.journal.sql import database_for  # it imports this module

    database = database_for(normalize_url(url), url)  # MySQL adds its lock rows' table
    dialect = normalize_url(url).get_dialect()()
    statements: list[str] = []
    for table in database.tables():
        statements.append(str(CreateTable(table).compile(dialect=dialect)).strip())
        for index in sorted(table.indexes, key=lambda i: i.name or ""):
            statements.append(str(CreateIndex(index).compile(dialect=dialect)).strip())
    if dialect.name == "sqlite":
        statements.append(SQLITE_GAP_DDL)
    for component, version in SCHEMA_VERSIONS.items():
        row: dict[str, Any] = {"component": component, "version": version}
        stmt = insert(schema_versions).values(**row)
        compiled = stmt.compile(dialect=dialect, compile_kwargs={"literal_binds": True})
        statements.append(str(compiled))
    return "".join(f"{statement};\n\n" for statement in statements)


def ddl_notes(url: str) -> list[str]:
    """What a DBA should know about :func:`ddl`'s SQL for this URL (one line each)."""
    from celery_durable.store.journal.sql import database_for  # it imports this module

    return database_for(normalize_url(url), url).ddl_notes()


# -- durable runs (celery_durable/runs.py) --------------------------------------------------------

#: One row per durable run: a summary of the stream ``run/<run_id>``, written in the same
#: transaction as the run's claim, suspension and ending events (never on an ordinary step).
#: ``status`` is one of queued, running, suspended, finished, faulted, cancelled, parked, missed,
#: failed_to_start;
#: ``wake_at`` is when the dispatcher should send a suspended run again; ``message`` the JSON
#: of the run's Celery message (args, kwargs, options) for that re-send; ``wake_after``, on a
#: parent suspended while its children run (W11), how many more of their ends wake it (none:
#: the first; journal schema version 4, 2026-12-06).
runs = Table(
    "celery_durable_runs",
    metadata,
    Column("run_id", String(255), primary_key=True),
    Column("task", String(255), nullable=False),
    Column("status", String(16), nullable=False),
    Column("owner", String(255), nullable=True),
    Column("lease_until", UtcDateTime, nullable=True),
    Column("wake_at", UtcDateTime, nullable=True),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("message", JsonText(), nullable=False),
    Column("wake_after", Integer, nullable=True),
    # RunStore.stale(): active runs by lease; RunStore.wakeups(): suspended runs by wake time.
    Index(None, "status", "lease_until"),
    Index(None, "status", "wake_at"),
)
__all__ += ["runs"]
