"""``celery -A proj durable …`` sees the journal and the tasks the worker and beat see.

Real subprocesses, as a user types them: a standard Django project (tests/django_project,
tasks found by ``autodiscover_tasks()``, journal in the default database) and a plain app
whose tasks live in ``include=[…]`` modules. Without ``-A`` the command refuses to guess
rather than create an empty ``./celery_durable.db`` (docs/cli.md, "Which journal").
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery

from celery_durable import Durable, Every
from tests.django_project.harness import PROJECT_DIR
from tests.support.processes import child_env, run_child

pytestmark = pytest.mark.timeout(120)


def celery(cwd: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v for k, v in child_env(env).items() if k not in ("CELERY_DURABLE_URL", "CELERY_APP")
    }
    for key in ("DJANGO_SETTINGS_MODULE",):
        clean.pop(key, None)
    clean.update(env)
    return run_child([sys.executable, "-m", "celery", *args], cwd=cwd, env=clean)


def stored_ids(url: str) -> list[str]:
    durable = Durable(Celery("reader", broker="memory://"), url)
    try:
        return [v.id for v in durable.schedules.list()]
    finally:
        durable.close()


def test_django_project_cli_uses_the_django_database_and_autodiscovered_tasks(
    tmp_path: Path,
) -> None:
    database = tmp_path / "site.sqlite3"
    env = {
        "PYTHONPATH": os.pathsep.join([str(PROJECT_DIR), child_env()["PYTHONPATH"]]),
        "DURABLE_SITE_DB": str(database),
    }
    created = celery(
        tmp_path,
        "-A",
        "durable_site",
        "durable",
        "schedules",
        "create",
        "report",
        "shop.send_report",
        "--every",
        "5m",
        "--args",
        '["ada"]',
        env=env,
    )
    assert created.returncode == 0, created.stderr
    assert created.stdout.startswith("schedule 'report' created")
    listed = celery(
        tmp_path, "-A", "durable_site", "durable", "schedules", "list", "--json", env=env
    )
    assert listed.returncode == 0, listed.stderr
    assert [s["id"] for s in json.loads(listed.stdout)] == ["report"]
    # The journal is the project's default database, where beat and the admin read it.
    assert stored_ids(f"sqlite:///{database}") == ["report"]
    assert not (tmp_path / "celery_durable.db").exists()


def test_plain_app_with_include_modules(tmp_path: Path) -> None:
    (tmp_path / "plainproj.py").write_text(
        textwrap.dedent(
            """\
            from celery import Celery

            app = Celery("plainproj", broker="memory://", include=["plainproj_tasks"])
            app.conf.durable_url = "sqlite:///plain.db"
            """
        )
    )
    (tmp_path / "plainproj_tasks.py").write_text(
        textwrap.dedent(
            """\
            from plainproj import app

            @app.task(name="plain.job")
            def job():
                return "done"
            """
        )
    )
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), child_env()["PYTHONPATH"]])}
    args = ("-A", "plainproj", "durable", "schedules", "create", "j", "plain.job", "--every", "1m")
    created = celery(tmp_path, *args, env=env)
    assert created.returncode == 0, created.stderr
    assert stored_ids(f"sqlite:///{tmp_path / 'plain.db'}") == ["j"]
    module = run_child(
        [sys.executable, "-m", "celery_durable", "-A", "plainproj", "schedules", "show", "j"],
        cwd=tmp_path,
        env={**child_env(), **env},
    )
    assert module.returncode == 0, module.stderr
    assert "plain.job" in module.stdout


def test_without_an_app_nothing_is_created(tmp_path: Path) -> None:
    listed = celery(tmp_path, "durable", "schedules", "list", env={})
    assert listed.returncode == 2, (listed.stdout, listed.stderr)
    assert listed.stderr.startswith("Error: no Celery app given: give -A/--app MODULE")
    assert list(tmp_path.iterdir()) == []
    # A journal named explicitly is read, with Celery's default app.
    env = {"CELERY_DURABLE_URL": "sqlite:///named.db"}
    assert celery(tmp_path, "durable", "db", "init", env=env).returncode == 0
    named = celery(tmp_path, "durable", "schedules", "list", env=env)
    assert named.returncode == 0, named.stderr
    assert named.stdout.strip() == "No schedules."
    assert not (tmp_path / "celery_durable.db").exists()


ENTRY_POINTS = {
    "celery durable": ("celery", "durable"),
    "python -m celery_durable": ("celery_durable",),
}


@pytest.mark.parametrize("entry", ENTRY_POINTS.values(), ids=ENTRY_POINTS)
def test_both_entry_points_read_a_named_journal_without_an_app(
    tmp_path: Path, entry: tuple[str, ...]
) -> None:
    """``celery durable`` and ``python -m celery_durable`` agree: without -A, a journal named
    by --url or $CELERY_DURABLE_URL is read with Celery's default app; nothing named, both
    refuse (exit 2) and create nothing (docs/cli.md, "Which journal")."""
    url = f"sqlite:///{tmp_path / 'named.db'}"
    writer = Celery("writer", broker="memory://")

    task = "named." + "_".join(entry)  # one name per test: task names are process-wide

    @writer.task(name=task)
    def job() -> None: ...

    durable = Durable(writer, url)
    try:
        durable.schedules.create("nightly", task, None, Every(timedelta(days=1)))
    finally:
        durable.close()
    clean = {k: v for k, v in child_env().items() if k not in ("CELERY_DURABLE_URL", "CELERY_APP")}

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", *entry, *args, "schedules", "list", "--json"]
        return run_child(command, cwd=tmp_path, env={**clean, **extra})

    for result in (run("--url", url), run(CELERY_DURABLE_URL=url)):
        assert result.returncode == 0, result.stderr
        assert [s["id"] for s in json.loads(result.stdout)] == ["nightly"]
    refused = run()
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert refused.stderr.startswith("Error: no Celery app given: give -A/--app MODULE")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["named.db"]


def test_manage_py_durable_schedules_is_the_cli_command(tmp_path: Path) -> None:
    """Same output for an empty list and a full one, same columns, and delete asks first."""
    env = {
        "PYTHONPATH": os.pathsep.join([str(PROJECT_DIR), child_env()["PYTHONPATH"]]),
        "DURABLE_SITE_DB": str(tmp_path / "site.sqlite3"),
    }

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return run_child(
            [sys.executable, str(PROJECT_DIR / "manage.py"), "durable_schedules", *args],
            cwd=tmp_path,
            env={**child_env(), **env},
        )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return celery(tmp_path, "-A", "durable_site", "durable", "schedules", *args, env=env)

    sqlite3.connect(tmp_path / "site.sqlite3").close()  # the site's database (manage.py migrate)
    empty = manage("list")
    assert (empty.returncode, empty.stdout, empty.stderr) == (0, "No schedules.\n", "")
    assert cli("list").stdout == empty.stdout
    created = manage("create", "report", "shop.send_report", "--every", "5m", "--args", '["ada"]')
    assert created.returncode == 0, created.stderr
    assert created.stdout.startswith("schedule 'report' created")
    listed = manage("list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == cli("list").stdout
    assert listed.stdout.split()[:4] == ["ID", "TASK", "RULE", "STATUS"]
    assert manage("show", "report", "--json").stdout == cli("show", "report", "--json").stdout
    refused = manage("delete", "report")
    assert refused.returncode == 2
    assert refused.stderr == "Error: deleting is permanent: pass --yes to confirm\n"
    assert manage("list", "--json").stdout.count('"id": "report"') == 1
    deleted = manage("delete", "report", "--yes")
    assert deleted.returncode == 0 and "deleted" in deleted.stdout
    missing = manage("show", "nope")
    assert (missing.returncode, missing.stderr) == (3, "Error: schedule 'nope' not found\n")


def cli_project(tmp_path: Path) -> dict[str, str]:
    """``cliproj.py`` in ``tmp_path``, an app with one task; the environment that finds it."""
    (tmp_path / "cliproj.py").write_text(
        textwrap.dedent(
            """\
            from celery import Celery

            app = Celery("cliproj", broker="memory://")

            @app.task(name="cliproj.ping")
            def ping():
                return "pong"
            """
        )
    )
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path), child_env()["PYTHONPATH"]])}


READ_ONLY = [
    ("schedules", "list"),
    ("schedules", "show", "nightly"),
    ("schedules", "history", "nightly"),
    ("runs", "list"),
    ("runs", "show", "nightly@2026-11-16T01:00:00.0000000Z"),
    ("run", "result", "nightly@2026-11-16T01:00:00.0000000Z"),
    ("health",),
    ("replay", "--check"),
    ("prune", "--dry-run"),
    # Commands that change only what is stored: in a journal that is not there, nothing is.
    ("schedules", "pause", "nightly"),
    ("index", "rebuild"),
]


@pytest.mark.parametrize("command", READ_ONLY, ids=" ".join)
def test_a_mistyped_sqlite_url_creates_no_journal(tmp_path: Path, command: tuple[str, ...]) -> None:
    """A read-only command given a SQLite path that does not exist says so (exit 1) and
    creates neither the file nor its directory (docs/cli.md, "Which journal")."""
    env = cli_project(tmp_path)
    typo = tmp_path / "no-such-dir" / "journal.db"
    url = f"sqlite:///{typo}"
    result = celery(tmp_path, "-A", "cliproj", "durable", "--url", url, *command, env=env)
    assert (result.returncode, result.stdout) == (1, ""), result.stderr
    assert (
        result.stderr == f"Error: no journal at {typo} (is the URL right? 'db init' creates it)\n"
    )
    assert not typo.parent.exists()


def test_commands_that_write_create_the_journal(tmp_path: Path) -> None:
    """``schedules create`` and ``db init`` start a journal where there is none, directories
    included, as beat and the workers do."""
    env = cli_project(tmp_path)
    first = tmp_path / "a" / "journal.db"
    created = celery(
        tmp_path, "-A", "cliproj", "durable", "--url", f"sqlite:///{first}",
        "schedules", "create", "ping", "cliproj.ping", "--every", "1m", env=env,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert stored_ids(f"sqlite:///{first}") == ["ping"]
    second = tmp_path / "b" / "journal.db"
    initialised = celery(
        tmp_path, "-A", "cliproj", "durable", "--url", f"sqlite:///{second}", "db", "init", env=env
    )
    assert initialised.returncode == 0, initialised.stderr
    assert second.exists()


def test_the_missing_path_is_shown_safely(tmp_path: Path) -> None:
    """The path of a missing journal is echoed with its control characters escaped (docs/cli.md,
    "Output is safe for a terminal")."""
    typo = tmp_path / "x\x1b[2Jy" / "journal.db"
    result = celery(tmp_path, "durable", "--url", f"sqlite:///{typo}", "schedules", "list", env={})
    assert result.returncode == 1, result.stderr
    assert "\x1b" not in result.stderr and "x\\x1b[2Jy" in result.stderr
    assert not typo.parent.exists()
