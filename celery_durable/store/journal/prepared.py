"""Statements rendered once per database and executed as the driver's SQL: the append's hot path.

SQLAlchemy Core caches a statement's compiled form, but finds it again on every execution by
building the statement's cache key, a walk over the whole statement. For the journal's insert
(an ``INSERT … SELECT … WHERE … EXISTS`` of ten parameters) that walk and the parameter set-up
cost about 30 µs per append on SQLite, a fifth of a durable step (measured 2026-12-06,
docs/durable-tasks.md). A :class:`Prepared` statement is rendered by SQLAlchemy for the engine's
dialect once and run with ``Connection.exec_driver_sql``: the driver's errors are still wrapped
(and a dead connection invalidated) by SQLAlchemy, its events and echo still see the statement;
only the per-execution lookup goes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection, CursorResult, Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

__all__ = ["Prepared"]

_OPTIONS = {"preserve_rowcount": True}


class Prepared:
    """One statement rendered for one dialect; :meth:`execute` runs it with one row's values."""

    __slots__ = ("_fixed", "_names", "_positional", "_processors", "sql")

    def __init__(self, statement: ClauseElement, dialect: Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        if not isinstance(compiled, SQLCompiler):
            raise TypeError(f"not a SQL statement: {statement!r}")
        if compiled.escaped_bind_names or compiled.post_compile_params:
            raise ValueError("a prepared statement needs plain bind parameter names")
        self.sql: str = compiled.string
        self._positional = bool(dialect.positional)
        binds = compiled.binds
        # Names in the order the driver takes them (qmark/format), else each name once.
        self._names: tuple[str, ...] = (
            tuple(compiled.positiontup or ()) if self._positional else tuple(binds)
        )
        self._fixed: dict[str, Any] = {
            name: bind.effective_value for name, bind in binds.items() if not bind.required
        }
        processors: dict[str, Callable[[Any], Any]] = {}
        for name, bind in binds.items():
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                processors[name] = process
        self._processors = processors

    def parameters(self, row: dict[str, Any]) -> Any:
        """The driver's parameters for ``row``'s values (its bind parameters by name)."""
        values = row
        if self._fixed or self._processors:
            values = {**self._fixed, **row}
            for name, process in self._processors.items():
                values[name] = process(values[name])
        if self._positional:
            return tuple([values[name] for name in self._names])
        return {name: values[name] for name in self._names}

    def execute(self, conn: Connection, row: dict[str, Any]) -> CursorResult[Any]:
        """Run the statement with ``row``'s values (its bind parameters by name)."""
        return conn.exec_driver_sql(self.sql, self.parameters(row), execution_options=_OPTIONS)
