"""The suite on a machine without MariaDB, RabbitMQ or Chromium (docs/testing.md).

Outside CI a test needing one of them is skipped, and the run ends with one line naming each
missing service, its skipped tests and what enables it; with ``CI=true`` the same tests fail.
Each case runs pytest in a subprocess with the services' addresses pointed at closed ports
(``CELERY_DURABLE_TEST_MYSQL_URL``, ``CELERY_DURABLE_TEST_AMQP_URL``, …), so the real servers
of this machine are neither used nor touched.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.support import missing, services
from tests.support.processes import REPO_ROOT, child_env, run_child

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.timeout(120)

#: Tests asking for the suite's fixtures: four need MariaDB/MySQL, two RabbitMQ, two nothing.
NEEDS = """
import pytest


def test_mysql(mysql_url):
    pass


@pytest.mark.parametrize("n", [1, 2])
def test_mysql_server(mysql_server_url, n):
    pass


def test_journal(journal_url):  # [sqlite] passes, [mysql] needs the server; [postgres] deselected
    pass


def test_amqp(amqp_url):
    pass


def test_amqp_asked_for_inside(request):
    request.getfixturevalue("amqp_url")


def test_nothing():
    pass
"""


@pytest.fixture
def closed_services(monkeypatch: pytest.MonkeyPatch) -> None:
    """MariaDB/MySQL and RabbitMQ configured at ports nothing listens on."""
    mysql_port, amqp_port = services.free_port(), services.free_port()
    monkeypatch.setenv(
        "CELERY_DURABLE_TEST_MYSQL_URL", f"mysql+pymysql://root@127.0.0.1:{mysql_port}/test"
    )
    monkeypatch.setenv(
        "CELERY_DURABLE_TEST_AMQP_URL", f"amqp://guest:guest@127.0.0.1:{amqp_port}//"
    )
    monkeypatch.setenv("PYTHONPATH", child_env()["PYTHONPATH"])  # the inner run imports tests.*


def run_needs(pytester: pytest.Pytester) -> pytest.RunResult:
    pytester.makeconftest('pytest_plugins = ["tests.conftest"]\n')
    pytester.makepyfile(test_needs=NEEDS)
    return pytester.runpytest_subprocess("-ra", "-p", "no:cacheprovider", "-k", "not postgres")


def service_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if "service missing" in line]


@pytest.mark.usefixtures("closed_services")
def test_without_mariadb_and_rabbitmq_their_tests_skip_with_one_summary_line(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)
    result = run_needs(pytester)
    result.assert_outcomes(passed=2, skipped=6)
    assert result.ret == 0
    [line] = service_lines(result.outlines)
    assert line == missing.summary_line({"MariaDB/MySQL": 4, "RabbitMQ": 2})
    assert line.startswith("skipped, service missing (with CI=true these fail): ")
    assert "MariaDB/MySQL: 4 tests — start MariaDB" in line
    assert "or set CELERY_DURABLE_TEST_MYSQL_URL" in line
    assert "RabbitMQ: 2 tests — start RabbitMQ" in line
    assert "or set CELERY_DURABLE_TEST_AMQP_URL" in line
    # It ends the run: only pytest's counts follow it.
    assert result.outlines[result.outlines.index(line) + 1].startswith("=")
    assert "passed" in result.outlines[result.outlines.index(line) + 1]
    # -ra lists the skips once per missing service, not once per test.
    skipped = [ln for ln in result.outlines if ln.startswith("SKIPPED")]
    assert len(skipped) == 2, skipped
    assert any(ln.startswith("SKIPPED [4]") and "MariaDB/MySQL missing" in ln for ln in skipped)
    assert any(ln.startswith("SKIPPED [2]") and "RabbitMQ missing" in ln for ln in skipped)


@pytest.mark.usefixtures("closed_services")
def test_under_ci_the_same_tests_fail(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    result = run_needs(pytester)
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped", 0) == 0
    assert outcomes["passed"] == 2
    assert outcomes.get("errors", 0) + outcomes.get("failed", 0) == 6
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert not service_lines(result.outlines)
    result.stdout.fnmatch_lines(
        [
            "*MariaDB/MySQL is not answering at 127.0.0.1:*",
            "*RabbitMQ is not answering at 127.0.0.1:*",
        ]
    )


def _path_without_chromium() -> str:
    return os.pathsep.join(
        folder
        for folder in os.environ.get("PATH", "").split(os.pathsep)
        if not (Path(folder) / "chromium").exists()
    )


@pytest.mark.parametrize("ci", ["", "true"])
def test_browser_tests_look_for_chromium_before_postgres_is_started(
    ci: str, tmp_path: Path
) -> None:
    """Without Chromium the browser tests end before their PostgreSQL exists: with the
    configured address closed, no throwaway server is started for them."""
    env = child_env(
        {
            "CI": ci,
            "CELERY_DURABLE_CHROMIUM": str(tmp_path / "no-chromium"),
            "PATH": _path_without_chromium(),
            "CELERY_DURABLE_TEST_PG_URL": (
                f"postgresql+psycopg://postgres@127.0.0.1:{services.free_port()}/test"
            ),
        }
    )
    result = run_child(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/contrib/test_django_browser.py",
            "-p",
            "no:cacheprovider",
        ],
        cwd=REPO_ROOT,
        env=env,
        timeout=110,
    )
    output = result.stdout + result.stderr
    assert "postgres: " not in output, output  # the services summary names every server used
    assert "throwaway" not in output, output
    assert "PostgreSQL is not answering" not in output, output
    if ci:
        assert result.returncode == pytest.ExitCode.TESTS_FAILED, output
        assert "3 errors" in output, output
        assert output.count("Chromium is not at") >= 3, output
        assert not service_lines(output.splitlines()), output
    else:
        assert result.returncode == 0, output
        assert "2 passed, 3 skipped" in output, output
        [line] = service_lines(output.splitlines())
        assert line == missing.summary_line({"Chromium": 3}), output
