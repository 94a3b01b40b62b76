"""The pytest plugin ``celery_durable.testing`` as a user meets it (pytester, in process).

A user's test file that uses only the documented fixtures passes; a wrong expectation fails
with a message naming what was expected. The plugin is opt-in: this suite never loads it
itself (no ``pytest11`` entry point), only the inner pytest runs do.
"""

from __future__ import annotations

import re
from pathlib import Path

import celery.contrib.testing.tasks  # noqa: F401  imported once here, not by each inner run
import pytest
from sqlalchemy import create_engine, text

from tests.support.processes import REPO_ROOT

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.timeout(120)

CONFTEST = 'pytest_plugins = ["celery_durable.testing"]\n'

USER_TESTS = """
from datetime import datetime, time, timedelta, timezone

import pytest

from celery_durable import CatchUp, Daily, ScheduledRun, sleep


@pytest.fixture
def durable_clock():
    from celery_durable.testing import TestClock
    return TestClock(datetime(2026, 11, 2, 12, 0, tzinfo=timezone.utc))


def test_nightly_backup_runs_once_after_three_nights_down(durable):
    done = []

    @durable.task(name="proj.backup")
    def backup(run: ScheduledRun):
        done.append(run.due)

    durable.schedules.create("nightly", backup, "/srv", Daily(time(2, 0), "UTC"),
                             catch_up=CatchUp.LATEST)
    durable.downtime(days=3)
    assert done == [datetime(2026, 11, 5, 2, 0, tzinfo=timezone.utc)]
    durable.advance(days=1)
    assert len(done) == 2


def test_crash_in_step_two_across_a_week_long_sleep(durable):
    charged = []

    @durable.step(name="charge")
    def charge(amount):
        charged.append(amount)
        return amount

    @durable.step(name="email")
    def email():
        return "sent"

    @durable.task(name="proj.renew")
    def renew():
        charge(10)
        sleep(timedelta(days=7))
        return [charge(20), email()]

    with durable.crash_after_step(2):
        renew.apply_async(task_id="renew-1")
        durable.advance(days=7)
    durable.advance(minutes=10)  # past the crashed delivery's lease: sent again (D8)
    assert durable.result("renew-1") == [20, "sent"]
    assert charged == [10, 20]
    assert durable.step_calls("renew-1") == {"charge": 2, "email": 1}
    assert [s.name for s in durable.steps_of("renew-1")] == ["charge", "sleep", "charge", "email"]


def test_wrong_expectation(durable):
    @durable.task(name="proj.answer")
    def answer():
        return 41

    answer.apply_async(task_id="a-1")
    durable.run_until_idle()
    assert durable.result("a-1") == 42
"""


def test_a_users_test_file_passes_and_a_wrong_expectation_reads_well(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        ["*assert 41 == 42*", "*FAILED test_user.py::test_wrong_expectation*"]
    )


def test_the_plugin_is_opt_in(pytester: pytest.Pytester) -> None:
    """Without the one line, the fixture does not exist: nothing loads it by itself."""
    pytester.makepyfile(test_user="def test_x(durable):\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'durable' not found*"])


def test_a_crash_plan_that_never_fires_fails_the_test(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_user="""
def test_typo(durable):
    @durable.step
    def charge():
        return 1

    @durable.task(name="proj.t")
    def t():
        return charge()

    with durable.crash_after_step("chrage"):
        t.apply_async(task_id="t-1")
        durable.run_until_idle()
"""
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*crash_after_step('chrage') never crashed a delivery*"])


def test_the_example_projects_own_tests_pass(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """example_project/tests use the plugin on the project's own app (docs/testing-your-code.md)."""
    monkeypatch.setenv("EXAMPLE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CELERY_BROKER_URL", "memory://")
    tests = REPO_ROOT / "example_project" / "tests"
    result = pytester.runpytest_inprocess(str(tests), "-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=3)


def test_with_celery_session_worker_the_harness_uses_it(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        CONFTEST
        + """
import pytest


@pytest.fixture(scope="session")
def celery_config():
    return {"broker_url": "memory://", "result_backend": "cache+memory://",
            "broker_transport_options": {"polling_interval": 0.01}}
"""
    )
    pytester.makepyfile(
        test_user="""
from datetime import timedelta

from celery_durable import sleep


def test_on_the_session_worker(durable, celery_session_app, celery_session_worker):
    assert durable.app is celery_session_app and durable.worker is celery_session_worker

    @durable.task(name="proj.nap")
    def nap():
        sleep(timedelta(hours=5))
        return "rested"

    nap.apply_async(task_id="nap-1")
    durable.advance(hours=5)
    assert durable.result("nap-1") == "rested"
"""
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1)


def test_durable_url_option_gives_each_test_a_fresh_postgres_schema(
    pytester: pytest.Pytester, postgres_server_url: str
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_user="""
import re

import pytest


@pytest.mark.parametrize("n", [1, 2])
def test_on_postgres(durable, durable_url, n):
    assert durable.journal.engine.dialect.name == "postgresql"
    print("SCHEMA", re.search(r"cdt_[0-9a-f]+", durable_url).group(0))

    @durable.task(name="proj.once")
    def once():
        return n

    once.apply_async(task_id="same-id")  # the same run ID in both tests: separate journals
    durable.run_until_idle()
    assert durable.result("same-id") == n
"""
    )
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-q", "-s", "--durable-url", postgres_server_url
    )
    result.assert_outcomes(passed=2)
    schemas = re.findall(r"SCHEMA (cdt_[0-9a-f]+)", result.stdout.str())
    assert len(set(schemas)) == 2
    engine = create_engine(postgres_server_url)
    try:
        with engine.connect() as conn:
            left = conn.execute(
                text("SELECT schema_name FROM information_schema.schemata"),
            ).scalars()
            assert not set(schemas) & set(left), "the schemas are dropped after each test"
    finally:
        engine.dispose()
