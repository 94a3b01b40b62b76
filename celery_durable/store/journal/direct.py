"""The driver's own connections for a durable run's two hot statements on SQLite.

A durable step stores its result with one ``INSERT`` (:meth:`.sql.SqlJournal.append`) and a
delivery reads its run's stream once (:meth:`.sql.SqlJournal.read_stream`). Through
SQLAlchemy each pays a pool checkout and return (the ``Connection``, the pool's fairy, the
reset on return) and the ``Connection``'s execution set-up and result rows: ~30 µs of a
step whose ``INSERT`` itself takes ~30 µs with ``synchronous = NORMAL``, and ~1.5 ms of the
5 ms read of a 1,000-step stream (measured 2026-12-06, docs/durable-tasks.md).
:class:`DirectConnections` keeps the journal's own ``sqlite3`` connections (made by the pool,
so set up by the journal's connect listener as every other, then detached from it) on a free
list and runs those statements on them with the driver's cursor.

Nothing else changes: a driver error leaves as SQLAlchemy's wrapper of it
(``DBAPIError.instance``, with ``connection_invalidated`` when the dialect calls it a
disconnect; such a connection is closed, never reused), so the journal translates it as
before (:mod:`.errors`). Whenever something would see SQLAlchemy's own path (a listener of the
engine's statement events, of the dialect's, of the pool's checkouts; SQL logging), the
journal takes that path instead (:meth:`DirectConnections.usable`): instrumentation such as
OpenTelemetry's, and tests counting statements, see every statement as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import QueuePool

__all__ = ["SPARE_MAX", "DirectConnections"]

SPARE_MAX = 32
"""Free connections kept at most (as many threads storing steps at once, W9's branches
included); one more given back is closed."""

_FORKED_AWAY: list[Any] = []
"""Connections a forked child inherited: kept referenced, never closed (closing a SQLite
connection opened by the parent would drop the POSIX locks of the child's own connections
to the same file)."""


class DirectConnections:
    """A free list of the driver's connections, taken and given back per statement.

    Thread-safe: a connection is used by one thread at a time (``list.pop`` and
    ``list.append`` are atomic); as many exist as statements ran at once.
    """

    def __init__(self, core: Engine) -> None:
        self._core = core
        self._dialect = core.dialect
        self._error = core.dialect.loaded_dbapi.Error
        self._spare: list[Any] = []
        self._closed = False

    @staticmethod
    def suits(core: Engine) -> bool:
        """Whether the engine's pool keeps connections one may take out of it (a file's
        ``QueuePool``; an in-memory database's connections are the database)."""
        return type(core.pool) is QueuePool

    def usable(self) -> bool:
        """Whether a statement may skip SQLAlchemy: nobody listens to what it would show."""
        core = self._core
        if getattr(core, "_has_events", True) or getattr(self._dialect, "_has_events", True):
            return False
        pool = core.pool.dispatch
        if pool.checkout or pool.checkin or pool.reset:
            return False
        return not core.logger.isEnabledFor(logging.INFO)  # echo, or sqlalchemy.engine logging

    def run(self, sql: str, parameters: Any, fetch: Callable[[Any], Any] | None = None) -> Any:
        """Execute ``sql`` on a free connection (a new one when none is free); the cursor's
        row count, or what ``fetch(cursor)`` returns. A driver error leaves as SQLAlchemy's
        ``DBAPIError`` subclass for it; the connection goes back to the list afterwards
        unless the dialect calls the error a disconnect."""
        try:
            conn = self._spare.pop()
        except IndexError:
            conn = self._connect()
        try:
            cursor = conn.cursor()
            cursor.execute(sql, parameters)
            result = cursor.rowcount if fetch is None else fetch(cursor)
        except self._error as exc:
            dialect = self._dialect
            lost = bool(dialect.is_disconnect(exc, conn, None))
            if lost:
                _close_quietly(conn)
            else:
                self._give_back(conn)
            raise DBAPIError.instance(
                sql,
                parameters,
                exc,
                self._error,
                hide_parameters=self._core.hide_parameters,
                connection_invalidated=lost,
                dialect=dialect,
            ) from exc
        except BaseException:
            _close_quietly(conn)  # interrupted (KeyboardInterrupt, a signal): start afresh
            raise
        self._give_back(conn)
        return result

    def _give_back(self, conn: Any) -> None:
        if conn.in_transaction:  # pragma: no cover - autocommit statements only
            conn.rollback()
        if len(self._spare) >= SPARE_MAX:
            _close_quietly(conn)  # after a burst of threads: keep no more than this
            return
        self._spare.append(conn)
        if self._closed:
            self.close()

    def _connect(self) -> Any:
        fairy = self._core.raw_connection()  # the pool's connect listener sets it up
        conn = fairy.driver_connection
        fairy.detach()  # the pool forgets it (and its slot) at once
        return conn

    def close(self) -> None:
        """Close the free connections; those in use close when given back."""
        self._closed = True
        spare = self._spare
        while spare:
            try:
                conn = spare.pop()
            except IndexError:  # pragma: no cover - taken meanwhile
                break
            _close_quietly(conn)

    def forget(self) -> None:
        """After ``fork()``, in the child: drop the parent's connections without closing them."""
        _FORKED_AWAY.extend(self._spare)
        self._spare = []


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # pragma: no cover - closing a broken connection
        logging.getLogger("celery_durable.journal.sql").debug(
            "closing a journal connection failed", exc_info=True
        )
