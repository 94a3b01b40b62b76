"""Fixtures of the worker-side tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from celery_durable.testing import DurableHarness, TestClock
from tests.support.clock import T0


@pytest.fixture(params=["sqlite", "postgres"])
def durable(celery_app: Celery, request: pytest.FixtureRequest) -> Iterator[DurableHarness]:
    """The durable test harness, its worker started, on a SQLite file and on PostgreSQL."""
    url = request.getfixturevalue({"sqlite": "sqlite_url", "postgres": "pg_url"}[request.param])
    with DurableHarness(celery_app, url, clock=TestClock(T0)) as harness:
        harness.start()
        yield harness
