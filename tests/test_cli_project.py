"""``celery -A proj durable …`` sees the journal and the tasks the worker and beat see.

Real subprocesses, as a user types them: a standard Django project (tests/django_project,
tasks found by ``autodiscover_tasks()``, journal in the default database) and a plain app
whose tasks live in ``include=[…]`` modules. Without ``-A`` the command refuses to guess
rather than create an empty ``./celery_durable.db`` (docs/cli.md, "Which journal").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from celery_durable import Durable
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
    from celery import Celery

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
    named = celery(
        tmp_path, "durable", "schedules", "list", env={"CELERY_DURABLE_URL": "sqlite:///named.db"}
    )
    assert named.returncode == 0, named.stderr
    assert named.stdout.strip() == "No schedules."
    assert not (tmp_path / "celery_durable.db").exists()


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
