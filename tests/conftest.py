"""Shared fixtures for the celery_durable test-suite.

Servers (see ``docs/testing.md``), configured by environment variables:

* ``CELERY_DURABLE_TEST_PG_URL`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``)
* ``CELERY_DURABLE_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``; the db is flushed!)
* ``CELERY_DURABLE_TEST_AMQP_URL`` (default ``amqp://guest:guest@127.0.0.1:5672//``)
* ``CELERY_DURABLE_TEST_MYSQL_URL`` (default ``mysql+pymysql://root@127.0.0.1:3306/test``)

A server is started lazily, the first time a test needs it. If the configured PostgreSQL or
Redis does not answer, a throwaway server is started from a pip-installed wheel
(``tests/support/services.py``) and stopped at the end of the session. No such wheel exists for
RabbitMQ or MariaDB: a test needing one that does not answer is skipped, and the run ends with one
line naming each missing service, the tests skipped for it and what enables it
(``tests/support/missing.py``; Chromium's browser tests are counted there too). With ``CI=true``
nothing falls back and nothing is skipped: CI must provide every service, so a test needing one
that can't be had ERRORS (with a message saying why), as does one whose server answers but is
unusable, anywhere.

Fixtures:

* ``pg_url`` -- SQLAlchemy URL of a fresh, empty PostgreSQL schema (dropped afterwards); every
  connection made with the URL, in any process, has ``search_path`` set to it.
* ``sqlite_url`` -- ``sqlite:///<tmp_path>/journal.db`` (a file; not created yet).
* ``mysql_url`` -- SQLAlchemy URL of a fresh, empty MariaDB/MySQL database
  ``<configured name>_<random>`` (dropped afterwards).
* ``journal_url`` -- parametrised: ``sqlite_url`` (id ``sqlite``), ``pg_url`` (``postgres``)
  and ``mysql_url`` (``mysql``).
* ``redis_url`` -- Redis URL whose database was flushed at the start of the test.
* ``amqp_url`` -- RabbitMQ URL (checked to answer; no isolation, no fallback).
* ``postgres_server_url`` / ``redis_server_url`` / ``amqp_server_url`` / ``mysql_server_url``
  -- session-scoped URLs of
  the servers themselves (database ``test``, no schema isolation; prefer the fixtures above).
* ``clock`` -- a ``FakeClock`` at ``T0`` that the test moves.
* ``durable`` -- a ``Durable`` on the module's ``app`` fixture, ``journal_url`` and ``clock``
  (a module overrides ``journal_url`` with ``sqlite_url`` to use SQLite alone).

Hypothesis profiles: ``ci`` (default) and ``long`` (10,000 examples); pick one with the
environment variable ``HYPOTHESIS_PROFILE``.

Subprocess helpers for end-to-end tests live in ``tests/support/processes.py``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

# Make ``tests.support`` importable however pytest was started (``pytest`` vs
# ``python -m pytest``, from any directory).
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from tests.support import missing, services  # noqa: E402
from tests.support.clock import FakeClock  # noqa: E402

if TYPE_CHECKING:
    from celery import Celery

    from celery_durable import Durable

PG_URL = os.environ.get(
    "CELERY_DURABLE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("CELERY_DURABLE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("CELERY_DURABLE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
MYSQL_URL = os.environ.get(
    "CELERY_DURABLE_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"
)

#: In CI the services must be up (``.ci/run`` starts them): no throwaway fallback there.
IN_CI = services.truthy_env("CI")

# ----------------------------------------------------------------------------- hypothesis

settings.register_profile("ci", max_examples=100, deadline=None, print_blob=True)
settings.register_profile("long", max_examples=10_000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# ----------------------------------------------------------------------------- servers

#: Servers used in this session, reported in the terminal summary.
_USED_SERVICES: list[services.ServiceHandle] = []
#: Tests skipped because a service is missing (``tests/support/missing.py``), by service.
_SKIPPED_FOR: dict[str, set[str]] = {}


def _provide(
    ensure: Callable[[], services.ServiceHandle],
) -> Iterator[str]:
    """Run ``ensure``; turn a :class:`services.ServiceError` into a test error, or a server with
    no fallback that is not running into a skip outside CI; yield the URL and stop a throwaway
    server at the end."""
    failure: services.ServiceError | None = None
    try:
        handle = ensure()
    except services.ServiceError as exc:
        failure = exc
    if failure is not None:  # raised outside the except block: no chained traceback noise
        if isinstance(failure, services.ServiceNotRunning):
            missing.skip_or_fail(failure.service, str(failure))
        pytest.fail(str(failure), pytrace=False)
    _USED_SERVICES.append(handle)
    try:
        yield handle.url
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """SQLAlchemy URL of the PostgreSQL database used by the tests (configured or throwaway)."""
    yield from _provide(lambda: services.ensure_postgres(PG_URL, allow_throwaway=not IN_CI))


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    """URL of the Redis server and test database (configured or throwaway). Not flushed."""
    yield from _provide(lambda: services.ensure_redis(REDIS_URL, allow_throwaway=not IN_CI))


@pytest.fixture(scope="session")
def amqp_server_url() -> Iterator[str]:
    """URL of the RabbitMQ server (configured only: no pip-installable RabbitMQ exists)."""
    yield from _provide(lambda: services.ensure_amqp(AMQP_URL))


@pytest.fixture(scope="session")
def mysql_server_url() -> Iterator[str]:
    """SQLAlchemy URL of the MariaDB/MySQL server (configured only: no pip-installable server)."""
    yield from _provide(lambda: services.ensure_mysql(MYSQL_URL))


# ----------------------------------------------------------------------------- markers

#: The fixtures that reach a server, by the service they need.
SERVICE_FIXTURES = {
    "postgres_server_url": "postgres",
    "pg_url": "postgres",
    "mysql_server_url": "mysql",
    "mysql_url": "mysql",
    "redis_server_url": "redis",
    "redis_url": "redis",
    "amqp_server_url": "rabbitmq",
    "amqp_url": "rabbitmq",
}
#: Parameter values that name a server a fixture fetches by name (``journal_url``'s
#: ``postgres``, a store fixture's ``mysql``, a broker's ``redis``/``rabbitmq``).
SERVICE_PARAMS = {
    "postgres": "postgres",
    "pg_url": "postgres",
    "mysql": "mysql",
    "mysql_url": "mysql",
    "redis": "redis",
    "redis_url": "redis",
    "amqp": "rabbitmq",
    "amqp_url": "rabbitmq",
    "rabbitmq": "rabbitmq",
}


def services_of(item: pytest.Item) -> set[str]:
    """The servers a test needs: by the fixtures it uses, its ``services`` mark (for a fixture
    fetched by name at run time), and the parameters that name one."""
    needs = {
        SERVICE_FIXTURES[f] for f in getattr(item, "fixturenames", ()) if f in SERVICE_FIXTURES
    }
    for mark in item.iter_markers("services"):  # asked for by name at run time
        needs.update(mark.args)
    callspec = getattr(item, "callspec", None)
    for value in () if callspec is None else callspec.params.values():
        if isinstance(value, str) and value in SERVICE_PARAMS:
            needs.add(SERVICE_PARAMS[value])
    return needs


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that needs no server ``no_service`` (``pytest -m no_service`` runs on a
    machine with Python alone); a test so marked that asks for a server anyway errors (see
    :func:`_serving`), so the mark cannot be wrong silently."""
    for item in items:
        if not services_of(item):
            item.add_marker(pytest.mark.no_service)


def _serving(request: pytest.FixtureRequest, service: str) -> None:
    if request.node.get_closest_marker("no_service") is not None:
        pytest.fail(
            f"{request.node.nodeid} is marked no_service but asks for {service}: give it a "
            "fixture or parameter that names the service (tests/conftest.py: services_of)",
            pytrace=False,
        )


# ----------------------------------------------------------------------------- per test


@pytest.fixture
def pg_url(request: pytest.FixtureRequest, postgres_server_url: str) -> Iterator[str]:
    """``postgresql+psycopg://...?options=-csearch_path%3Dcdt_<random>``: a fresh schema for this
    test only, dropped (CASCADE) afterwards. Tables created through the URL land in it, also
    from subprocesses given the URL."""
    _serving(request, "postgres")
    with services.isolated_schema(postgres_server_url) as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """``sqlite:///<tmp_path>/journal.db`` -- a file database (shareable with subprocesses)."""
    return f"sqlite:///{tmp_path / 'journal.db'}"


@pytest.fixture
def mysql_url(request: pytest.FixtureRequest, mysql_server_url: str) -> Iterator[str]:
    """``mysql+pymysql://…/<db>_<random>``: a fresh utf8mb4 database for this test only,
    dropped afterwards (sessions still in it are killed first)."""
    _serving(request, "mysql")
    with services.isolated_database(mysql_server_url) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def journal_url(request: pytest.FixtureRequest) -> str:
    """The test runs three times: with ``sqlite_url`` (id ``sqlite``), ``pg_url``
    (``postgres``) and ``mysql_url`` (``mysql``)."""
    fixture = {"sqlite": "sqlite_url", "postgres": "pg_url", "mysql": "mysql_url"}[request.param]
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def redis_url(request: pytest.FixtureRequest, redis_server_url: str) -> str:
    """Redis URL (test database, default ``/0``), flushed (FLUSHDB) before the test."""
    _serving(request, "redis")
    import redis
    from kombu import pools

    client = redis.Redis.from_url(redis_server_url)
    try:
        client.flushdb()
    finally:
        client.close()
    # Celery apps on one broker URL share kombu's process-wide connection pools, and each
    # connection remembers the queues and bindings it declared: after the FLUSHDB those are
    # gone, so forget them too (else a send to a named exchange finds no binding).
    pools.reset()
    return redis_server_url


@pytest.fixture
def amqp_url(request: pytest.FixtureRequest, amqp_server_url: str) -> str:
    """RabbitMQ URL (shared vhost; use unique queue names per test)."""
    _serving(request, "rabbitmq")
    return amqp_server_url


# ----------------------------------------------------------------------------- reporting


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Iterator[None]:
    """Count a skip for a missing service, and report it at the place that skips (not at the
    test), so that ``-ra`` lists one line per missing service instead of one per test."""
    report: pytest.TestReport = yield
    if report.skipped and isinstance(report.longrepr, tuple):
        _path, _line, reason = report.longrepr
        service = missing.missing_service(reason)
        if service is not None:
            _SKIPPED_FOR.setdefault(service, set()).add(report.nodeid)
            code = missing.skip_or_fail.__code__
            report.longrepr = (code.co_filename, code.co_firstlineno, reason)
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> Iterator[None]:
    """After pytest's own summary, just before the counts: the servers used, then one line
    for the services missing here (each with its skipped tests and what enables it)."""
    yield
    if not _USED_SERVICES and not _SKIPPED_FOR:
        return
    terminalreporter.section("celery_durable test services")
    for handle in _USED_SERVICES:
        terminalreporter.write_line(
            f"{handle.name}: {services.redact_url(handle.url)} [{handle.origin}]"
        )
    if _SKIPPED_FOR:
        counts = {service: len(nodeids) for service, nodeids in _SKIPPED_FOR.items()}
        terminalreporter.write_line(missing.summary_line(counts))


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock at ``T0`` (Monday 2026-11-02 12:00 UTC) that tests move by hand."""
    return FakeClock()


@pytest.fixture
def durable(app: Celery, journal_url: str, clock: FakeClock) -> Iterator[Durable]:
    """A ``Durable`` on the module's ``app``, the ``journal_url`` journal and the ``clock``,
    closed after the test.

    A test module provides ``app`` (its tasks, its broker); it narrows the journals by
    overriding ``journal_url`` (``sqlite_url`` alone, when the database makes no difference)
    and moves time with its ``clock``. A module whose Durable differs (a memory store, the test
    harness, tasks registered on the Durable, another clock) keeps its own ``durable``.
    """
    from celery_durable import Durable

    made = Durable(app, journal_url, clock=clock)
    try:
        yield made
    finally:
        made.close()
