"""The database layer's errors as the library's own: the one place that translates them.

What leaves the store is a :class:`~celery_durable.errors.JournalUnavailable` when the journal
cannot be reached right now (the server is down, refused or dropped the connection: what beat
and workers wait out) and a :class:`~celery_durable.errors.JournalFailed` for any other failure
of the database (beat retries it too). The driver's error stays the ``__cause__``; the message
is one line with the URL's password masked, so that it can be logged and shown as it is.

The store's own modules keep the database layer's errors inside them (a lease catches the
``IntegrityError`` of a row another beat inserted first); the translation happens where a call
leaves the store: the journal's public methods, a unit of work, and the classes and functions
marked with :func:`translating` (the index, the run table, the leases …).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    OperationalError,
    PendingRollbackError,
    SQLAlchemyError,
)

from celery_durable.errors import JournalError, JournalFailed, JournalUnavailable

JOURNAL_AWAY: tuple[type[Exception], ...] = (
    OperationalError,
    InterfaceError,
    PendingRollbackError,
    DisconnectionError,
)
"""The database layer's errors that mean the journal cannot be reached right now."""

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def connection_lost(error: BaseException | None) -> bool:
    """Whether ``error`` says the database connection itself died (the server closed it, the
    network dropped it): the statement may be tried once more on a fresh connection."""
    if isinstance(error, DisconnectionError):
        return True
    return isinstance(error, DBAPIError) and bool(error.connection_invalidated)


def one_line(error: BaseException | None) -> str:
    """A driver's error message on one line (libpq adds a tab-indented hint line)."""
    return " ".join(str(error).split())


def as_journal_error(error: SQLAlchemyError, shown: str, doing: str) -> JournalError:
    """The library's error for ``error``, met while ``doing`` (``"read"``, ``"write to"`` …)
    the journal whose masked URL is ``shown``."""
    driver = getattr(error, "orig", None) or error
    if isinstance(error, JOURNAL_AWAY):
        return JournalUnavailable(
            f"cannot {doing} the journal at {shown}: {one_line(driver)}",
            connection_lost=connection_lost(error),
        )
    return JournalFailed(
        f"the journal at {shown} failed ({type(error).__name__}): {one_line(driver)}"
    )


@contextmanager
def translated(shown: str, doing: str) -> Iterator[None]:
    """Inside, an error of the database layer leaves as :func:`as_journal_error` says."""
    try:
        yield
    except SQLAlchemyError as exc:
        raise as_journal_error(exc, shown, doing) from exc


def _shown(owner: Any) -> str:
    journal = getattr(owner, "journal", owner)
    return str(getattr(journal, "url", "?"))


def _wrap(function: F, doing: str, owner_of: Callable[[tuple[Any, ...]], Any]) -> F:
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except SQLAlchemyError as exc:
            raise as_journal_error(exc, _shown(owner_of(args)), doing) from exc

    return call  # type: ignore[return-value]


def _first(args: tuple[Any, ...]) -> Any:
    return args[0] if args else None


def translating(target: T, doing: str = "use") -> T:
    """Mark a store class (every public method and property) or a store function (whose first
    argument is the journal) so that the database layer's errors leave it translated."""
    if inspect.isclass(target):
        for name, member in list(vars(target).items()):
            if name.startswith("_"):
                continue
            if isinstance(member, property):
                fget = member.fget and _wrap(member.fget, doing, _first)
                fset = member.fset and _wrap(member.fset, doing, _first)
                setattr(target, name, property(fget, fset, member.fdel, member.__doc__))
            elif isinstance(member, staticmethod):
                continue  # no journal to name; the store's own helpers (called in a unit)
            elif inspect.isfunction(member):
                setattr(target, name, _wrap(member, doing, _first))
        return target
    if inspect.isfunction(target):
        return _wrap(target, doing, _first)
    raise TypeError(f"translating() takes a class or a function, not {target!r}")


__all__ = [
    "JOURNAL_AWAY",
    "as_journal_error",
    "connection_lost",
    "one_line",
    "translated",
    "translating",
]
