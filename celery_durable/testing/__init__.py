"""A pytest plugin for testing a project's schedules and durable tasks (docs/testing-your-code.md).

Enable it with one line in a ``conftest.py`` (it is never loaded by itself)::

    pytest_plugins = ["celery_durable.testing"]

The ``durable`` fixture is a :class:`DurableHarness`: the real :class:`~celery_durable.Durable`
of the test's Celery app (pytest-celery's ``celery_app``, or ``celery_session_app`` when the
test uses ``celery_session_worker``) on a fresh journal, with a clock that moves only when the
test says so and an in-process worker (``celery.contrib.testing.worker.start_worker``, no
Docker). ``durable.advance(timedelta(days=7))`` moves the clock through every due time, durable
sleep, retry back-off and countdown on the way, so a week passes in milliseconds.

How time is skipped: every message sent with an ``eta`` (a countdown) is held by the harness
instead of reaching the broker, and released, without its ``eta``, once the test clock reaches
it; the dispatcher (``durable.dispatcher()``) is ticked at each due time on the way. Nothing
in the worker waits for wall time: the worker's short in-process waits ask the clock, which
moves itself (``TestClock.sleep``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_durable.testing._clock import TestClock
from celery_durable.testing._harness import CrashPlan, DurableHarness, StepRecord, assert_replays

__all__ = [
    "CrashPlan",
    "DurableHarness",
    "StepRecord",
    "TestClock",
    "assert_replays",
    "durable",
    "durable_app",
    "durable_clock",
    "durable_url",
    "pytest_addoption",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "durable_url",
        "Journal URL of the durable fixture (default: a SQLite file in the test's tmp_path). "
        "A PostgreSQL URL gets a fresh schema per test.",
        default="",
    )
    parser.addoption(
        "--durable-url",
        default=None,
        help="Journal URL of the durable fixture (overrides the durable_url ini option).",
    )


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def durable_clock() -> TestClock:
    """The test clock of the ``durable`` fixture (starts at the wall time; override to pick)."""
    return TestClock()


@pytest.fixture
def durable_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """The journal of the ``durable`` fixture: a SQLite file in ``tmp_path``, or, with
    ``--durable-url``/the ``durable_url`` ini option, that database (a fresh PostgreSQL schema
    per test, dropped afterwards)."""
    url = request.config.getoption("--durable-url") or request.config.getini("durable_url")
    if not url:
        yield f"sqlite:///{tmp_path / 'journal.db'}"
        return
    if not url.startswith("postgresql"):
        yield url
        return
    from celery_durable.store.fresh_schema import fresh_postgres_schema

    with fresh_postgres_schema(url) as schema_url:
        yield schema_url


@pytest.fixture
def durable_app(request: pytest.FixtureRequest) -> Celery:
    """The app the ``durable`` fixture binds to: ``celery_app``, or ``celery_session_app``
    when the test uses ``celery_session_worker``. Override it to test a project's own app."""
    if "celery_session_worker" in request.fixturenames:
        return request.getfixturevalue("celery_session_app")
    return request.getfixturevalue("celery_app")


@pytest.fixture
def durable(
    request: pytest.FixtureRequest, durable_app: Celery, durable_url: str, durable_clock: TestClock
) -> Iterator[DurableHarness]:
    """A :class:`DurableHarness` on ``durable_app``: fresh journal, test clock, worker."""
    harness = DurableHarness(durable_app, durable_url, clock=durable_clock)
    session_worker = None
    if "celery_session_worker" in request.fixturenames:
        session_worker = request.getfixturevalue("celery_session_worker")
    with harness:
        harness.start(session_worker)
        yield harness
