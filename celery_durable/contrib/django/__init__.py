"""celery_durable for Django: ``INSTALLED_APPS += ["celery_durable.contrib.django"]``.

The app adds an admin section for durable schedules, the management commands
``durable_schedules`` and ``durable_runs``, and makes the journal default to a database of
``DATABASES``. The schedules live in the journal, not in Django tables (see docs/django.md).

Settings (all optional):

* ``CELERY_DURABLE_URL`` -- the journal URL. With the usual
  ``app.config_from_object("django.conf:settings", namespace="CELERY")`` Celery reads it as
  ``app.conf.durable_url``, so beat, workers and the admin agree.
* ``CELERY_DURABLE_DATABASE`` -- the ``DATABASES`` alias the journal defaults to
  (``"default"``), used when no URL is configured anywhere.
* ``CELERY_DURABLE_APP`` -- the Celery app, as ``"proj.celery:app"`` (or the app itself);
  by default Celery's current app, which is the project's app in the documented layout.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    from celery import Celery

    from celery_durable.durable import Durable

__all__ = ["celery_app", "database_url", "get_durable", "journal_url", "mysql_database_url"]

_SQLITE_ENGINES = frozenset({"django.db.backends.sqlite3"})
_POSTGRES_ENGINES = frozenset(
    {"django.db.backends.postgresql", "django.db.backends.postgresql_psycopg2"}
)
# Keys of a PostgreSQL ``OPTIONS`` dict that are libpq connection parameters (passed on as
# query parameters of the URL); Django-only keys such as ``pool`` or ``server_side_binding``
# are not.
_LIBPQ_OPTIONS = frozenset(
    {
        "options",
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "sslpassword",
        "connect_timeout",
        "application_name",
        "target_session_attrs",
        "passfile",
        "service",
        "keepalives",
        "keepalives_idle",
    }
)


_MYSQL_ENGINES = frozenset({"django.db.backends.mysql"})
# MySQL ``OPTIONS`` carried to the URL as they are (driver connect arguments), and the
# ``ssl`` dict's keys mapped to SQLAlchemy's ``ssl_*`` query parameters.
_MYSQL_CARRIED = frozenset(
    {"init_command", "connect_timeout", "read_timeout", "write_timeout", "unix_socket"}
)
_MYSQL_SSL_KEYS = frozenset({"ca", "cert", "key", "capath", "cipher", "check_hostname"})
# Django's own keys (for its connection only): the journal sets its own isolation level.
_MYSQL_DJANGO_ONLY = frozenset({"isolation_level"})


class ImproperlyConfigured(Exception):
    """Stand-in used only when Django is not importable (Django's own class is raised else)."""


def _improperly(message: str) -> Exception:
    try:
        from django.core.exceptions import ImproperlyConfigured as DjangoImproperly
    except ImportError:  # pragma: no cover - the app cannot be installed without Django
        return ImproperlyConfigured(message)
    return DjangoImproperly(message)


def database_url(database: Mapping[str, Any]) -> str:
    """The SQLAlchemy URL of one ``DATABASES`` entry (SQLite, PostgreSQL, MySQL/MariaDB).

    ``sqlite3`` → ``sqlite:///NAME``; ``postgresql`` → ``postgresql+psycopg://USER:PASSWORD@
    HOST:PORT/NAME`` with libpq ``OPTIONS`` (``sslmode``, ``options``, …) as query parameters;
    ``mysql`` → ``mysql+pymysql://USER:PASSWORD@HOST:PORT/NAME?charset=utf8mb4`` (see
    :func:`mysql_database_url`). Other engines raise ``ImproperlyConfigured``: set
    ``CELERY_DURABLE_URL`` instead.
    """
    engine = str(database.get("ENGINE") or "")
    name = database.get("NAME")
    if engine in _SQLITE_ENGINES:
        text = str(name or "")
        if not text or text == ":memory:" or "mode=memory" in text:
            raise _improperly(
                "celery_durable: the default database is an SQLite memory database, which "
                "beat and the workers cannot share; set CELERY_DURABLE_URL"
            )
        return f"sqlite:///{text}"
    if engine in _POSTGRES_ENGINES:
        user = str(database.get("USER") or "")
        password = str(database.get("PASSWORD") or "")
        host = str(database.get("HOST") or "")
        port = str(database.get("PORT") or "")
        auth = quote(user, safe="")
        if password:
            auth += ":" + quote(password, safe="")
        netloc = (auth + "@" if auth else "") + (
            f"[{host}]" if ":" in host else quote(host, safe="")
        )
        if port:
            netloc += f":{port}"
        url = f"postgresql+psycopg://{netloc}/{quote(str(name or ''), safe='')}"
        options = database.get("OPTIONS") or {}
        query = [
            f"{quote(str(k), safe='')}={quote(str(v), safe='')}"
            for k, v in options.items()
            if k in _LIBPQ_OPTIONS and v is not None
        ]
        return url + ("?" + "&".join(query) if query else "")
    if engine in _MYSQL_ENGINES:
        return mysql_database_url(database)
    raise _improperly(
        f"celery_durable: the journal cannot default to a {engine or 'missing'} database "
        "(SQLite, PostgreSQL and MySQL/MariaDB are supported); set CELERY_DURABLE_URL"
    )


def mysql_database_url(database: Mapping[str, Any]) -> str:
    """The journal URL of a ``django.db.backends.mysql`` entry.

    The driver is the one Django's backend imports as ``MySQLdb``: ``mysql+pymysql://`` when
    that is PyMySQL (``pymysql.install_as_MySQLdb()``) or mysqlclient is not installed,
    ``mysql+mysqldb://`` with mysqlclient (:func:`~celery_durable.store.journal.urls.mysql_driver`).
    ``OPTIONS``: ``init_command``, ``connect_timeout``, ``read_timeout``, ``write_timeout``,
    ``unix_socket`` are carried; ``ssl`` (``{"ca": …, "cert": …, "key": …}``) becomes
    ``ssl_ca``/``ssl_cert``/``ssl_key``; ``charset`` must be ``utf8mb4`` (the journal stores
    any Unicode); ``isolation_level`` is Django's (the journal uses READ COMMITTED). Anything
    else, e.g. ``read_default_file``, raises ``ImproperlyConfigured`` naming the key: a setting
    the journal would silently drop could point it at another server or user.
    """
    from celery_durable.store.journal.urls import mysql_url

    options = dict(database.get("OPTIONS") or {})
    query: dict[str, str] = {"charset": "utf8mb4"}
    charset = options.pop("charset", "utf8mb4")
    if str(charset).lower() != "utf8mb4":
        raise _improperly(
            f"celery_durable: DATABASES OPTIONS charset={charset!r} cannot hold every ID and "
            "payload of the journal; use 'utf8mb4' (or set CELERY_DURABLE_URL)"
        )
    ssl = options.pop("ssl", None) or {}
    if not isinstance(ssl, Mapping):
        raise _improperly("celery_durable: DATABASES OPTIONS ssl must be a dict")
    unknown_ssl = sorted(set(ssl) - _MYSQL_SSL_KEYS)
    if unknown_ssl:
        raise _improperly(
            f"celery_durable: DATABASES OPTIONS ssl key(s) {', '.join(unknown_ssl)} cannot be "
            f"carried to the journal (known: {', '.join(sorted(_MYSQL_SSL_KEYS))}); "
            "set CELERY_DURABLE_URL"
        )
    query.update({f"ssl_{k}": str(v) for k, v in ssl.items() if v is not None})
    for key in _MYSQL_DJANGO_ONLY:
        options.pop(key, None)
    unknown = sorted(set(options) - _MYSQL_CARRIED)
    if unknown:
        raise _improperly(
            f"celery_durable: DATABASES OPTIONS key(s) {', '.join(unknown)} cannot be carried "
            f"to the journal URL (carried: charset, ssl, {', '.join(sorted(_MYSQL_CARRIED))}); "
            "set CELERY_DURABLE_URL"
        )
    query.update({k: str(v) for k, v in options.items() if v is not None})
    host = str(database.get("HOST") or "") or None
    if host is not None and host.startswith("/"):
        query["unix_socket"], host = host, "localhost"
    port = database.get("PORT")
    return mysql_url(
        username=str(database.get("USER") or "") or None,
        password=str(database.get("PASSWORD") or "") or None,
        host=host,
        port=int(port) if port not in (None, "") else None,
        database=str(database.get("NAME") or "") or None,
        query=query,
    )


def journal_url(app: Celery | None = None) -> str:
    """The journal URL the Django integration uses, first found of:

    ``app.conf.durable_url`` (where Celery puts ``CELERY_DURABLE_URL``), the Django setting
    ``CELERY_DURABLE_URL``, the ``CELERY_DURABLE_URL`` environment variable, and the
    ``DATABASES`` entry named by ``CELERY_DURABLE_DATABASE`` (default ``"default"``).
    """
    from django.conf import settings

    if app is not None:
        configured = app.conf.get("durable_url")
        if configured:
            return str(configured)
    setting = getattr(settings, "CELERY_DURABLE_URL", None)
    if setting:
        return str(setting)
    environ = os.environ.get("CELERY_DURABLE_URL")
    if environ:
        return environ
    alias = getattr(settings, "CELERY_DURABLE_DATABASE", None) or "default"
    databases = getattr(settings, "DATABASES", None) or {}
    if alias not in databases:
        raise _improperly(
            f"celery_durable: DATABASES has no {alias!r} entry for the journal; "
            "set CELERY_DURABLE_URL or CELERY_DURABLE_DATABASE"
        )
    return database_url(databases[alias])


def celery_app() -> Celery:
    """The project's Celery app: ``CELERY_DURABLE_APP`` or Celery's current app."""
    from celery import Celery, current_app
    from celery.utils.imports import symbol_by_name
    from django.conf import settings

    configured = getattr(settings, "CELERY_DURABLE_APP", None)
    if configured is None:
        return current_app._get_current_object()
    app = symbol_by_name(configured) if isinstance(configured, str) else configured
    if not isinstance(app, Celery):
        raise _improperly(f"CELERY_DURABLE_APP must name a Celery app, not {app!r}")
    return app


def configure(app: Celery) -> None:
    """Give ``app`` the journal URL Django resolves, unless it has one (``durable_url``).

    Called by the app's ``ready()``, so that beat and workers started with a Django project
    use the same journal as the admin without any Celery setting.
    """
    if not app.conf.get("durable_url"):
        app.conf.durable_url = journal_url(app)


def get_durable(app: Celery | None = None) -> Durable:
    """The :class:`~celery_durable.Durable` of the project's Celery app (made on first use).

    Task modules are imported first (as a worker would), so that the admin knows the tasks
    that ``app.autodiscover_tasks()`` finds.
    """
    from celery_durable.config import import_task_modules
    from celery_durable.durable import Durable

    app = app if app is not None else celery_app()
    configure(app)
    import_task_modules(app)
    return Durable.for_app(app)
