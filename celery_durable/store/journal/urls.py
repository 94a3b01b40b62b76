"""Journal URLs: which databases we accept, in which normal form, and how they are logged.

Only the drivers the test suite runs are supported: the standard library's ``sqlite3``
(``sqlite://``), psycopg 3 (``postgresql+psycopg://``) and, for MySQL ≥ 8.0 and MariaDB ≥ 10.6,
PyMySQL (``mysql+pymysql://``, ``mariadb+pymysql://``) or mysqlclient (``mysql+mysqldb://``). The
usual spellings ``postgres://`` and ``postgresql://`` (Heroku, Django, libpq habits) are mapped to
psycopg 3 rather than to SQLAlchemy's psycopg2 default, which this library does not install;
``mysql://`` and ``mariadb://`` keep SQLAlchemy's default driver (mysqlclient) when it is
installed and fall back to PyMySQL (the ``celery-durable[mysql]`` extra) when it is not, or
when ``pymysql.install_as_MySQLdb()`` has put PyMySQL in its place (see :func:`mysql_driver`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from celery_durable.errors import JournalError

__all__ = [
    "is_mysql",
    "is_sqlite",
    "mysql_driver",
    "mysql_url",
    "normalize_url",
    "redact",
    "split_secrets",
    "sqlite_path",
]

_POSTGRES_ALIASES = frozenset({"postgres", "postgresql", "postgresql+psycopg"})
_SQLITE_ALIASES = frozenset({"sqlite", "sqlite+pysqlite"})
_MYSQL_DIALECTS = frozenset({"mysql", "mariadb"})
_MYSQL_DRIVERS = frozenset({"pymysql", "mysqldb"})
#: The connection character set: 4-byte UTF-8, so that any Unicode ID or payload round-trips.
MYSQL_CHARSET = "utf8mb4"
# Connection parameters that carry a secret when written in the query string.
_SECRET_QUERY_KEYS = frozenset({"password", "passwd", "sslpassword"})
_MASK = "***"


def _parse(url: str | URL) -> URL:
    if isinstance(url, URL):
        return url
    if not isinstance(url, str) or not url.strip():
        raise JournalError("the journal URL must be a non-empty string")
    try:
        return make_url(url.strip())
    except ArgumentError:
        # ``from None``: the parser's context could carry the raw URL, password included.
        raise JournalError("the journal URL cannot be parsed (expected dialect://…)") from None


def normalize_url(url: str | URL) -> URL:
    """Return the URL the engine is built from, or raise :class:`JournalError`.

    * ``postgres://``, ``postgresql://`` → ``postgresql+psycopg://``;
    * ``sqlite:///relative.db`` → an absolute path, resolved now against the current
      directory, so that a worker that changes directory later still finds the same file;
    * memory databases (``sqlite://``, ``:memory:``, ``mode=memory``) are refused: beat and the
      workers are separate processes and a memory database is private to one of them;
    * ``mysql://`` / ``mariadb://`` → mysqlclient if importable, else PyMySQL; the connection
      character set is ``utf8mb4`` (added when absent, any other is refused);
    * every other dialect or driver is refused.
    """
    parsed = _parse(url)
    driver = parsed.drivername
    if driver in _POSTGRES_ALIASES:
        return parsed.set(drivername="postgresql+psycopg")
    if driver in _SQLITE_ALIASES:
        database = parsed.database
        if (
            not database
            or database == ":memory:"
            or parsed.query.get("mode") == "memory"
            or database.startswith("file::memory:")
        ):
            raise JournalError(
                "a memory database cannot be shared between beat and workers; "
                "use a file, e.g. sqlite:///celery_durable.db",
                url=redact(parsed),
            )
        if parsed.query.get("uri") in ("true", "1"):
            # ``file:`` URIs are passed to sqlite3 untouched; relative ones are the caller's affair.
            return parsed.set(drivername="sqlite")
        return parsed.set(drivername="sqlite", database=os.path.abspath(database))
    dialect, _, dbapi = driver.partition("+")
    if dialect in _MYSQL_DIALECTS and (not dbapi or dbapi in _MYSQL_DRIVERS):
        return _normalize_mysql(parsed, dialect, dbapi)
    raise JournalError(
        f"unsupported journal database {driver!r}: use sqlite:///path.db, "
        "postgresql+psycopg://user@host/db or mysql+pymysql://user@host/db",
        url=redact(parsed),
    )


def mysql_driver() -> str:
    """The SQLAlchemy driver of a ``mysql://`` URL here: ``"mysqldb"`` or ``"pymysql"``.

    mysqlclient (``MySQLdb``) when it is installed, as SQLAlchemy would choose; PyMySQL when it
    is not, and also when ``pymysql.install_as_MySQLdb()`` has made ``MySQLdb`` an alias of
    PyMySQL (the usual way to run Django's MySQL backend without mysqlclient's C build): the
    module is PyMySQL then, and the journal must use SQLAlchemy's PyMySQL dialect for it.
    """
    module = sys.modules.get("MySQLdb")
    if module is not None:
        return "pymysql" if getattr(module, "__name__", "") == "pymysql" else "mysqldb"
    return "mysqldb" if importlib.util.find_spec("MySQLdb") is not None else "pymysql"


def mysql_url(
    *,
    username: str | None,
    password: str | None,
    host: str | None,
    port: int | None,
    database: str | None,
    query: Mapping[str, str],
) -> str:
    """The text of a ``mysql+<driver>://`` URL built from its parts, the password kept.

    The driver is :func:`mysql_driver`'s; the parts are quoted as URLs need. This is how a
    setting that names the server part by part (Django's ``DATABASES`` entry) becomes a
    journal URL.
    """
    url = URL.create(
        f"mysql+{mysql_driver()}",
        username=username,
        password=password,
        host=host,
        port=port,
        database=database,
        query=query,
    )
    return url.render_as_string(hide_password=False)


def _normalize_mysql(parsed: URL, dialect: str, dbapi: str) -> URL:
    if not dbapi:
        dbapi = mysql_driver()
    if not parsed.database:
        raise JournalError(
            "a MySQL/MariaDB journal URL needs a database name: mysql+pymysql://user@host/db",
            url=redact(parsed),
        )
    charset = parsed.query.get("charset", MYSQL_CHARSET)
    if charset != MYSQL_CHARSET:
        raise JournalError(
            f"the journal needs the {MYSQL_CHARSET} character set on MySQL/MariaDB (any Unicode "
            f"in IDs and data), not charset={charset!r}: drop it from the URL",
            url=redact(parsed),
        )
    return parsed.set(drivername=f"{dialect}+{dbapi}").update_query_dict({"charset": MYSQL_CHARSET})


def is_mysql(url: URL) -> bool:
    """Whether a normalised URL points at MySQL or MariaDB."""
    return url.get_backend_name() in _MYSQL_DIALECTS


def is_sqlite(url: URL) -> bool:
    """Whether a normalised URL points at SQLite."""
    return url.get_backend_name() == "sqlite"


def sqlite_path(url: URL) -> str | None:
    """The file behind a normalised SQLite URL, ``None`` for URIs and other databases."""
    if not is_sqlite(url) or url.query.get("uri") in ("true", "1"):
        return None
    return url.database


def split_secrets(url: URL) -> tuple[URL, dict[str, str]]:
    """Move secrets written in the query string (``?sslpassword=…``) out of the URL.

    They go to the driver as connect arguments instead, so that the engine's own URL, which
    SQLAlchemy prints in reprs and logs with only the main password hidden, holds none.
    """
    keys = [key for key in url.query if key.lower() in _SECRET_QUERY_KEYS]
    secrets: dict[str, str] = {}
    for key in keys:
        value = url.query[key]
        secrets[key] = value if isinstance(value, str) else value[-1]
    return url.difference_update_query(keys), secrets


def password_of(url: str | URL | None) -> str | None:
    """The password written in a database URL (to scrub it from messages); ``None`` when the
    URL has none or cannot be read."""
    if not url:
        return None
    try:
        password = _parse(url).password
    except Exception:
        return None
    return str(password) if password else None


def redact(url: str | URL) -> str:
    """The URL as text that is safe to log: the password (also in the query) becomes ``***``."""
    try:
        parsed = _parse(url)
    except JournalError:
        return "<unparseable URL>"
    secret_keys = [key for key in parsed.query if key.lower() in _SECRET_QUERY_KEYS]
    if secret_keys:
        parsed = parsed.update_query_dict({key: _MASK for key in secret_keys})
    return parsed.render_as_string(hide_password=True).replace("%2A%2A%2A", _MASK)
