"""A journal loads only its own database's SQLAlchemy dialect (D13, 2026-12-06).

A beat launch counts every import: on PostgreSQL, SQLAlchemy's MySQL and SQLite dialects and
the library's modules for those databases cost about 20 ms of CPU for nothing. The tables'
MySQL and SQLite options are given when a journal on that database is built, so each
database's DDL is the same as when the options were declared with the tables.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

#: Modules a journal on PostgreSQL never needs: SQLAlchemy's and the library's for MySQL and SQLite.
OTHER_DATABASES = [
    f"{package}.{database}"
    for package in ("sqlalchemy.dialects", "celery_durable.store.journal")
    for database in ("mysql", "sqlite")
]

PG_URL = "postgresql+psycopg://beat@127.0.0.1:5432/journal"
MYSQL_URL = "mysql+pymysql://beat@127.0.0.1:3306/journal"
MARIADB_URL = "mariadb+pymysql://beat@127.0.0.1:3306/journal"
SQLITE_URL = "sqlite:///journal.db"


def _run(code: str) -> Any:
    """Run ``code`` in a fresh interpreter; it prints one JSON value last."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_beat_on_postgresql_loads_neither_mysql_nor_sqlite() -> None:
    found = _run(
        f"""
        import json, sys
        from celery import Celery
        import celery_durable.beat
        from celery_durable import Durable
        from celery_durable.store.journal.schema import ddl

        durable = Durable(Celery("beat"), {PG_URL!r})
        durable.runtime.journal.engine  # built, as beat's start-up builds it; not connected
        ddl({PG_URL!r})  # the tables compiled for PostgreSQL
        print(json.dumps({{"loaded": sorted(m for m in {OTHER_DATABASES!r} if m in sys.modules),
                          "pg": "sqlalchemy.dialects.postgresql" in sys.modules}}))
        """
    )
    assert found["pg"], "the PostgreSQL dialect was not loaded: the test sees nothing"
    assert found["loaded"] == []


def test_each_database_gets_its_table_options_whatever_was_compiled_before() -> None:
    """The options of one database (InnoDB and utf8mb4; SQLite's AUTOINCREMENT) appear in its
    DDL and in no other's, in whichever order the journals are opened."""
    found = _run(
        f"""
        import json
        from celery_durable.store.journal.schema import ddl

        urls = [{PG_URL!r}, {SQLITE_URL!r}, {MYSQL_URL!r}, {MARIADB_URL!r}, {PG_URL!r},
                {SQLITE_URL!r}]
        print(json.dumps([ddl(url) for url in urls]))
        """
    )
    pg, sqlite, mysql, mariadb, pg_after, sqlite_after = (str(x) for x in found)
    assert pg == pg_after and sqlite == sqlite_after
    tables = pg.count("CREATE TABLE")
    assert tables == sqlite.count("CREATE TABLE") and tables >= 9
    for text in (mysql, mariadb):
        assert text.count("ENGINE=InnoDB CHARSET=utf8mb4") == text.count("CREATE TABLE") > tables
        assert "data LONGTEXT NOT NULL" in text and "DATETIME(6)" in text
    assert "position INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT" in sqlite
    assert sqlite.count("AUTOINCREMENT") == 1
    for text in (pg, sqlite):
        assert "ENGINE" not in text and "LONGTEXT" not in text
    assert "AUTOINCREMENT" not in pg and "data TEXT NOT NULL" in pg
