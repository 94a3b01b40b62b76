"""Settings of the test project (see README.md beside ``manage.py``)."""

import os
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "celery-durable-tests-only"
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "celery_durable.contrib.django",
    "durable_shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "durable_site.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_ENGINES = {
    "sqlite": "django.db.backends.sqlite3",
    "postgres": "django.db.backends.postgresql",
    "postgresql": "django.db.backends.postgresql",
    "mysql": "django.db.backends.mysql",
    "mariadb": "django.db.backends.mysql",
}


def database_from_url(url: str) -> dict[str, object]:
    """A ``DATABASES`` entry from ``scheme://user:password@host:port/name?option=value``.

    ``mysql://`` and ``mariadb://`` (a ``+driver`` suffix is ignored) give Django's MySQL
    backend; query parameters become ``OPTIONS`` (``?charset=utf8mb4``).
    """
    parts = urlsplit(url)
    scheme = parts.scheme.partition("+")[0]
    if scheme not in _ENGINES:
        raise ValueError(f"DURABLE_SITE_DATABASE_URL: unknown database kind {scheme!r}")
    if scheme == "sqlite":
        return {"ENGINE": _ENGINES[scheme], "NAME": unquote(parts.path[1:])}
    return {
        "ENGINE": _ENGINES[scheme],
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": dict(parse_qsl(parts.query)),
    }


if os.environ.get("DURABLE_SITE_DATABASE_URL"):
    DATABASES = {"default": database_from_url(os.environ["DURABLE_SITE_DATABASE_URL"])}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("DURABLE_SITE_DB", str(BASE_DIR / "db.sqlite3")),
        }
    }

if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    # Django's MySQL backend imports MySQLdb (mysqlclient, a C extension); PyMySQL stands in
    # for it. Django 5.2 needs it to report mysqlclient >= 1.4.3: PyMySQL >= 1.1 does.
    import pymysql

    pymysql.install_as_MySQLdb()

USE_TZ = True
TIME_ZONE = "Europe/Oslo"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

CELERY_BROKER_URL = os.environ.get("DURABLE_SITE_BROKER", "memory://")
CELERY_TIMEZONE = TIME_ZONE
if os.environ.get("DURABLE_SITE_JOURNAL"):
    CELERY_DURABLE_URL = os.environ["DURABLE_SITE_JOURNAL"]
