"""A Django project whose only database is MariaDB/MySQL keeps the journal in that database.

Real subprocesses, as a user types them, in the test project (tests/django_project) with
``DATABASES["default"]`` on a fresh MariaDB database (``DURABLE_SITE_DATABASE_URL``) reached
through PyMySQL (``pymysql.install_as_MySQLdb()`` in its settings; mysqlclient is not
installed): ``manage.py migrate`` and ``createsuperuser``, the admin through Django's test client
in a script (tests/django_project/admin_client.py), ``manage.py durable_schedules`` and
``celery -A durable_site durable schedules``, then ``celery -A durable_site beat -S durable`` and
a real worker on Redis. The project connects as a MariaDB user with a password that must never
be printed (docs/django.md, "MariaDB and MySQL").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy.engine import URL, make_url

from celery_durable import Durable
from tests.django_project.harness import PROJECT_DIR
from tests.support import services
from tests.support.processes import child_env, python_command, running_process, wait_for

pytestmark = pytest.mark.timeout(150)

LIST = "/admin/celery_durable/schedule/"
# Inherited variables that would point the project elsewhere than the test's database.
_FOREIGN = frozenset(
    {
        "CELERY_DURABLE_URL",
        "CELERY_APP",
        "DJANGO_SETTINGS_MODULE",
        "DURABLE_SITE_DB",
        "DURABLE_SITE_JOURNAL",
    }
)


@pytest.fixture
def site_user(mysql_url: str) -> Iterator[tuple[str, str]]:
    """A MariaDB user with a password (characters a URL must quote), allowed only in the test's
    database; dropped afterwards."""
    database = make_url(mysql_url).database
    user, password = f"cdt_{uuid.uuid4().hex[:10]}", f"pw/{uuid.uuid4().hex[:12]}@:%!"
    hosts = ("%", "localhost")  # 'localhost' too: a server that resolves 127.0.0.1 to it
    try:
        for host in hosts:
            sql(mysql_url, "CREATE USER %s@%s IDENTIFIED BY %s", user, host, password)
            sql(mysql_url, f"GRANT ALL PRIVILEGES ON `{database}`.* TO %s@%s", user, host)
        yield user, password
    finally:
        for host in hosts:
            sql(mysql_url, "DROP USER IF EXISTS %s@%s", user, host)


class Site:
    """The test project run as commands in ``cwd``, with an environment of its own only."""

    def __init__(self, cwd: Path, database_url: str, broker_url: str) -> None:
        self.cwd = cwd
        env = {k: v for k, v in child_env().items() if k not in _FOREIGN}
        env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_DIR), env["PYTHONPATH"]])
        env.update(DURABLE_SITE_DATABASE_URL=database_url, DURABLE_SITE_BROKER=broker_url)
        env["PYTHONIOENCODING"] = "utf-8"  # outputs and logs hold the input's emoji
        self.env = env
        self.outputs: list[str] = []  # everything the commands printed, for the secret check

    def run(self, *args: str, stdin: str | None = None, **extra: str) -> str:
        """Run ``python ARGS…`` to its end; return its stdout, failing on a non-zero exit."""
        done = subprocess.run(
            python_command(*args),
            cwd=self.cwd,
            env={**self.env, **extra},
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        self.outputs += [done.stdout, done.stderr]
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    def manage(self, *args: str, **extra: str) -> str:
        return self.run(str(PROJECT_DIR / "manage.py"), *args, **extra)

    def celery(self, *args: str) -> str:
        return self.run("-m", "celery", "-A", "durable_site", *args)

    def admin(self, password: str, *requests: dict[str, Any]) -> list[dict[str, Any]]:
        """Log in as ``admin`` and make ``requests`` (tests/django_project/admin_client.py)."""
        script = str(PROJECT_DIR / "admin_client.py")
        answers = self.run(script, "admin", password, stdin=json.dumps(list(requests)))
        return list(json.loads(answers))


def sql(url: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run one statement as the server's administrator; its rows."""
    conn = services.mysql_connect(url)
    try:
        with conn.cursor() as cursor:
            cursor.execute(statement, params or None)
            return list(cursor.fetchall())
    finally:
        conn.close()


def schedules(listing: str) -> dict[str, str]:
    return {s["id"]: s["status"] for s in json.loads(listing)}


def timeless(listing: str) -> list[dict[str, Any]]:
    """A ``schedules list --json`` without ``overdue``, which is judged against the reading's
    own clock: an active every-second schedule turns overdue between two reads."""
    return [{k: v for k, v in s.items() if k != "overdue"} for s in json.loads(listing)]


def test_a_django_project_on_mariadb_keeps_the_journal_in_its_default_database(
    tmp_path: Path, mysql_url: str, site_user: tuple[str, str], redis_url: str
) -> None:
    server = make_url(mysql_url)
    user, password = site_user
    database_url = URL.create(
        "mysql",
        username=user,
        password=password,
        host=server.host,
        port=server.port,
        database=server.database,
        # OPTIONS as a production project sets them; the journal's URL carries both.
        query={"charset": "utf8mb4", "init_command": "SET sql_mode='STRICT_TRANS_TABLES'"},
    ).render_as_string(hide_password=False)
    site = Site(tmp_path, database_url, redis_url)
    # A database whose default character set is latin1 (a server default still met): Django's
    # tables take it, the journal's are utf8mb4 with a binary collation all the same.
    sql(mysql_url, f"ALTER DATABASE `{server.database}` CHARACTER SET latin1")

    migrated = site.manage("migrate")
    assert "Applying celery_durable.0001_initial... OK" in migrated
    site.manage(
        "createsuperuser",
        "--noinput",
        "--username=admin",
        "--email=admin@example.com",
        DJANGO_SUPERUSER_PASSWORD="admin-pw",
    )
    created = site.celery(
        "durable", "schedules", "create", "from-cli", "shop.send_report", "--every", "1s",
        "--args", '["ada"]',
    )  # fmt: skip
    assert created.startswith("schedule 'from-cli' created")

    # The admin (a logged-in user, sessions in MariaDB) lists it, creates one and pauses it.
    form = {
        "id": "from-admin",
        "task": "shop.nightly_backup",
        "kind": "every",
        "every": "1s",
        "zone": "Europe/Oslo",
        "input": '"/srv 😀"',
        "catch_up": "latest",
        "overlap": "allow",
        "options": "{}",
    }
    pause = {"action": "pause", "_selected_action": "from-cli"}
    index, listed, added, paused, after = site.admin(
        "admin-pw",
        {"method": "get", "path": "/admin/"},
        {"method": "get", "path": LIST},
        {"method": "post", "path": LIST + "add/", "data": form},
        {"method": "post", "path": LIST, "data": pause},
        {"method": "get", "path": LIST},
    )
    assert index["status"] == 200 and "Durable schedules" in index["text"]
    assert 'data-schedule="from-cli"' in listed["text"]
    assert (added["status"], added["location"]) == (302, LIST + "from-admin/change/")
    assert paused["status"] == 302
    assert "Paused 1 schedule: from-cli" in after["text"]
    assert 'data-schedule="from-admin"' in after["text"]
    assert f"mysql+pymysql://{user}:***@{server.host}" in after["text"]  # the admin's journal

    # manage.py and the Celery CLI read the same journal: the one in the default database.
    by_manage = site.manage("durable_schedules", "list", "--json")
    assert timeless(by_manage) == timeless(site.celery("durable", "schedules", "list", "--json"))
    assert schedules(by_manage) == {"from-admin": "active", "from-cli": "paused"}
    tables = dict(
        sql(
            mysql_url,
            "SELECT TABLE_NAME, TABLE_COLLATION FROM information_schema.TABLES"
            " WHERE TABLE_SCHEMA = %s",
            server.database,
        )
    )
    assert tables["auth_user"].startswith("latin1_") and "django_session" in tables
    journal = {name: c for name, c in tables.items() if name.startswith("celery_durable_")}
    assert "celery_durable_events" in journal
    assert set(journal.values()) == {"utf8mb4_nopad_bin"}

    # Beat with the durable scheduler decides runs; a worker runs them.
    beat_cmd = python_command("-m", "celery", "-A", "durable_site", "beat", "-S", "durable")
    worker_cmd = python_command(
        "-m", "celery", "-A", "durable_site", "worker", "--pool=solo", "-l", "INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    )  # fmt: skip
    kwargs: dict[str, Any] = {"env": site.env, "inherit_env": False, "cwd": tmp_path}
    with (
        running_process(worker_cmd, log_path=tmp_path / "worker.log", **kwargs) as worker,
        running_process(beat_cmd, log_path=tmp_path / "beat.log", **kwargs) as beat,
    ):
        wait_for(
            lambda: "succeeded" in worker.read_log() and "backed up /srv 😀" in worker.read_log(),
            timeout=45,
            message="a run of from-admin done by the worker",
            processes=[worker, beat],
        )
    logs = [beat.read_log(), worker.read_log()]
    site.outputs += logs
    banner = next(line for line in logs[0].splitlines() if ". journal ->" in line)
    assert f"mysql+pymysql://{user}:***@{server.host}:{server.port}/{server.database}" in banner

    runs = json.loads(site.manage("durable_runs", "from-admin", "--json"))
    finished = [r for r in runs if r["outcome"] == "finished"]
    assert finished and json.loads(finished[0]["detail"]) == "backed up /srv 😀", runs
    reader = Durable(Celery("reader", set_as_current=False), mysql_url)
    try:
        assert reader.schedules.runs("from-cli") == []  # paused in the admin: never decided
        assert reader.schedules.runs("from-admin")
    finally:
        reader.close()
    [page] = site.admin("admin-pw", {"method": "get", "path": LIST + "from-admin/change/"})
    assert "finished" in page["text"] and "backed up /srv 😀" in page["text"]

    # The password went into the journal URL, but no command printed it; Celery's report
    # shows the URL with the password masked.
    report = site.celery("report")
    [line] = [x for x in report.splitlines() if x.startswith("durable_url:")]
    assert line.startswith(f"durable_url: 'mysql+pymysql://{user}:***@{server.host}:")
    assert "init_command=" in line
    everything = "\n".join(site.outputs)
    assert password not in everything
    assert password.replace("/", "%2F") not in everything


def test_the_journal_uses_the_driver_djangos_backend_imports_as_mysqldb(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``pymysql.install_as_MySQLdb()`` makes ``MySQLdb`` PyMySQL: the journal must then use
    SQLAlchemy's PyMySQL dialect, not its mysqlclient one over PyMySQL (and so must a bare
    ``mysql://`` journal URL in the same process)."""
    import types

    import pymysql

    from celery_durable.contrib.django import database_url
    from celery_durable.store.journal.urls import normalize_url

    entry = {"ENGINE": "django.db.backends.mysql", "NAME": "shop", "USER": "app", "PASSWORD": "x"}
    monkeypatch.setitem(sys.modules, "MySQLdb", pymysql)  # what install_as_MySQLdb() does
    assert make_url(database_url(entry)).drivername == "mysql+pymysql"
    assert normalize_url("mysql://app@db/shop").drivername == "mysql+pymysql"
    assert normalize_url("mariadb://app@db/shop").drivername == "mariadb+pymysql"
    # mysqlclient (not among the test dependencies: a stand-in module of its name).
    monkeypatch.setitem(sys.modules, "MySQLdb", types.ModuleType("MySQLdb"))
    assert make_url(database_url(entry)).drivername == "mysql+mysqldb"
    assert normalize_url("mysql://app@db/shop").drivername == "mysql+mysqldb"
