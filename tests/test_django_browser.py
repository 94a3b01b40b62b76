"""One check in a real browser: the admin's schedule list renders and the pause action works.

Headless Chromium from Debian (``apt-get install -y chromium``), driven by Playwright's Python
package (``pip install playwright``; no ``playwright install``: it uses /usr/bin/chromium).
The test project runs as ``manage.py runserver`` in a subprocess, its journal on PostgreSQL.

Screenshots go to the test's temporary folder; with ``CELERY_DURABLE_SCREENSHOTS=1`` they
replace the ones in docs/img/ that docs/django.md shows.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery

from celery_durable import CatchUp, Daily, Durable, Every, Overlap, ScheduledRun, Weekly
from celery_durable.message import scheduled_message

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "tests" / "django_project"
DOCS_IMG = ROOT / "docs" / "img"
CHROMIUM = os.environ.get("CELERY_DURABLE_CHROMIUM", "/usr/bin/chromium")
INSTALL = "apt-get update && apt-get install -y chromium"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"runserver exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"runserver did not listen on port {port} within {timeout:.0f} s")


@pytest.fixture
def site(tmp_path: Path, pg_url: str) -> Iterator[tuple[str, Durable]]:
    """The test project served by ``manage.py runserver``; yields its URL and the journal."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PROJECT), str(ROOT)]),
        "DJANGO_SETTINGS_MODULE": "durable_site.settings",
        "DURABLE_SITE_DB": str(tmp_path / "django.sqlite3"),
        "DURABLE_SITE_JOURNAL": pg_url,
        "DJANGO_SUPERUSER_PASSWORD": "pw",
    }
    manage = [sys.executable, str(PROJECT / "manage.py")]
    for command in (
        ["migrate", "--no-input", "-v0"],
        ["createsuperuser", "--no-input", "--username", "admin", "--email", "a@example.com"],
    ):
        subprocess.run([*manage, *command], env=env, cwd=PROJECT, check=True, timeout=60)

    # Schedules are made from here, through the library, as any other process would.
    app = Celery("browser_test", broker="memory://", set_as_current=False)
    app.task(name="shop.send_report", shared=False)(_report)
    durable = Durable(app, pg_url)
    durable.task(name="shop.nightly_backup", shared=False)(_backup)
    durable.schedules.create(
        "nightly-backup", "shop.nightly_backup", "/srv/data", Daily("02:00", "Europe/Oslo")
    )
    durable.schedules.create(
        "weekly-invoice",
        "shop.send_report",
        "Ada",
        Weekly(["mon"], "08:00", "Europe/Oslo"),
        CatchUp.ALL,
        overlap=Overlap.SKIP,
    )
    durable.schedules.create("heartbeat", "shop.send_report", "ping", Every(timedelta(minutes=5)))
    # One run, executed here as a worker would (its outcome is what the admin shows).
    run_id = durable.schedules.trigger("nightly-backup")
    [run] = durable.schedules.runs("nightly-backup")
    args, kwargs, _ = scheduled_message(ScheduledRun("nightly-backup", run.due, run.input))
    app.tasks["shop.nightly_backup"].apply(args, kwargs, task_id=run_id)

    port = _free_port()
    log = (tmp_path / "runserver.log").open("wb")
    server = subprocess.Popen(
        [*manage, "runserver", f"127.0.0.1:{port}", "--noreload", "--skip-checks"],
        env=env,
        cwd=PROJECT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_for_port(port, server)
        yield f"http://127.0.0.1:{port}", durable
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
        durable.close()


def _report(customer: str) -> str:  # pragma: no cover - never consumed
    return customer


def _backup(run: ScheduledRun) -> str:
    return f"backed up {run.input}"


# When the in-process Django tests ran first, @shared_task adds the project's task of the same
# name to this test's app as well.
@pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning")
def test_admin_list_renders_and_pause_works_in_chromium(
    site: tuple[str, Durable], tmp_path: Path
) -> None:
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.fail(f"Chromium is not installed; install it with: {INSTALL}", pytrace=False)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is missing: pip install playwright (no 'playwright install')")
    base, durable = site
    shots = DOCS_IMG if os.environ.get("CELERY_DURABLE_SCREENSHOTS") == "1" else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    executable = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(f"{base}/admin/login/?next=/admin/celery_durable/schedule/")
            page.fill("#id_username", "admin")
            page.fill("#id_password", "pw")
            page.click("input[type=submit]")
            page.wait_for_selector("#result_list")
            row = page.locator('tr[data-schedule="nightly-backup"]')
            assert row.locator("td.field-status").inner_text() == "active"
            assert "daily at 02:00 Europe/Oslo" in row.inner_text()
            assert page.locator("#result_list tbody tr").count() == 3
            page.screenshot(path=str(shots / "admin-schedule-list.png"))

            # The admin's action bar: tick the row, choose "Pause", press Go.
            row.locator("input.action-select").check()
            page.select_option("select[name=action]", "pause")
            page.click("button[name=index]")
            page.wait_for_selector("ul.messagelist li.success")
            assert "Paused 1 schedule: nightly-backup" in page.inner_text("ul.messagelist")
            status = page.locator('tr[data-schedule="nightly-backup"] td.field-status')
            assert status.inner_text() == "paused"
            page.screenshot(path=str(shots / "admin-schedule-paused.png"))
            view = durable.schedules.state("nightly-backup")
            assert view is not None and view.paused and view.next_due is None

            page.click('tr[data-schedule="nightly-backup"] th a')
            page.wait_for_selector("#durable-runs")
            runs = page.inner_text("#durable-runs")
            assert "trigger" in runs and "finished" in runs and "backed up /srv/data" in runs
            page.screenshot(path=str(shots / "admin-schedule-change.png"), full_page=True)

            page.goto(f"{base}/admin/celery_durable/schedule/add/")
            page.fill("#id_id", "bad-zone")
            page.fill("#id_task", "shop.send_report")
            page.fill("#id_at", "02:00")
            page.fill("#id_zone", "Mars/Olympus")
            page.click("input[name=_save]")
            page.wait_for_selector(".errorlist")
            assert "unknown time zone" in page.inner_text(".field-zone")
            page.screenshot(path=str(shots / "admin-schedule-form-error.png"), full_page=True)
        finally:
            browser.close()
