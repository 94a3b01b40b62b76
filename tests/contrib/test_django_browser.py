"""Checks in a real browser: the admin's schedule list renders, fits the window, and the pause
action works.

Headless Chromium from Debian (``apt-get install -y chromium``), driven by Playwright's Python
package (``pip install playwright``; no ``playwright install``: it uses /usr/bin/chromium).
The test project runs as ``manage.py runserver`` in a subprocess, its journal on PostgreSQL.

Screenshots go to the test's temporary folder; with ``CELERY_DURABLE_SCREENSHOTS=1`` they
replace the ones in docs/img/ that docs/django.md shows.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_durable import CatchUp, Daily, Durable, Every, Overlap, ScheduledRun, Weekly
from celery_durable.message import scheduled_message
from tests.support import missing

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "tests" / "django_project"
DOCS_IMG = ROOT / "docs" / "img"
INSTALL = "apt-get update && apt-get install -y chromium"


def require_chromium() -> str:
    """Chromium's path: ``CELERY_DURABLE_CHROMIUM`` (default /usr/bin/chromium), else
    ``chromium`` on PATH. Missing: a skip naming the install command, or a failure under ``CI``
    (``.ci/run`` installs it, so there its absence is a broken set-up, not a missing extra)."""
    configured = os.environ.get("CELERY_DURABLE_CHROMIUM", "/usr/bin/chromium")
    executable = configured if Path(configured).exists() else shutil.which("chromium")
    if executable is not None:
        return executable
    missing.skip_or_fail(
        "Chromium", f"Chromium is not at {configured} nor on PATH; install it with: {INSTALL}"
    )


@pytest.fixture
def chromium() -> str:
    """Chromium's path (see :func:`require_chromium`); ``site`` asks for it first."""
    return require_chromium()


@pytest.mark.parametrize("ci", ["", "true"])
def test_a_missing_chromium_skips_outside_ci_and_fails_under_ci(
    ci: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CELERY_DURABLE_CHROMIUM", str(tmp_path / "no-chromium"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CI", ci)
    outcome = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(outcome, match="apt-get update && apt-get install -y chromium"):
        require_chromium()
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert require_chromium() == str(fake)


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
def site(
    chromium: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[str, Durable]]:
    """The test project served by ``manage.py runserver``; yields its URL and the journal.

    ``pg_url`` is asked for only once Chromium was found: as an argument, its session-scoped
    server would be set up before any function-scoped fixture, so a machine without Chromium
    would start a throwaway PostgreSQL for tests that are then skipped."""
    pg_url = str(request.getfixturevalue("pg_url"))
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


@contextlib.contextmanager
def admin_list(executable: str, base: str, width: int) -> Iterator[Any]:
    """Headless Chromium logged in as the admin, on the schedule list, ``width`` px wide."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is missing: pip install playwright (no 'playwright install')")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(f"{base}/admin/login/?next=/admin/celery_durable/schedule/")
            page.fill("#id_username", "admin")
            page.fill("#id_password", "pw")
            page.click("input[type=submit]")
            page.wait_for_selector("#result_list")
            yield page
        finally:
            browser.close()


# When the in-process Django tests ran first, @shared_task adds the project's task of the same
# name to this test's app as well.
@pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning")
@pytest.mark.services("postgres")  # the site fixture asks for pg_url once Chromium is found
def test_admin_list_renders_and_pause_works_in_chromium(
    chromium: str, site: tuple[str, Durable], tmp_path: Path
) -> None:
    base, durable = site
    shots = DOCS_IMG if os.environ.get("CELERY_DURABLE_SCREENSHOTS") == "1" else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    with admin_list(chromium, base, 1440) as page:
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


@pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning")
@pytest.mark.parametrize("width", [1400, 1280])
@pytest.mark.services("postgres")
def test_admin_list_fits_the_window(
    chromium: str, site: tuple[str, Durable], width: int, tmp_path: Path
) -> None:
    """At common laptop widths every column of the list is visible without scrolling sideways:
    the next-run, catch-up and runs columns were once cut off at 1,400 px."""
    base, durable = site
    durable.schedules.create(
        "monthly-customer-statement-for-enterprise-accounts",
        "shop.send_report",
        "Ada",
        Weekly(["mon", "tue", "wed", "thu", "fri"], "08:00", "America/Argentina/Buenos_Aires"),
        CatchUp.ALL,
        overlap=Overlap.BUFFER_ONE,
    )
    with admin_list(chromium, base, width) as page:
        overflow = page.evaluate(
            """() => {
                const box = document.querySelector('#changelist .results');
                const right = box.getBoundingClientRect().right;
                const cut = [...document.querySelectorAll('#result_list tr > *')]
                    .filter(c => c.getBoundingClientRect().right > right + 1)
                    .map(c => c.className || c.textContent.trim().slice(0, 30));
                return {scroll: box.scrollWidth - box.clientWidth, cut: [...new Set(cut)],
                        page: document.documentElement.scrollWidth - window.innerWidth};
            }"""
        )
        page.screenshot(path=str(tmp_path / f"admin-schedule-list-{width}.png"))
        assert overflow == {"scroll": 0, "cut": [], "page": 0}, overflow
