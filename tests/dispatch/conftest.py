"""Fixtures shared by the dispatcher's tests: an app with two tasks on the real Redis, and
Durables sharing one store of each kind."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from celery import Celery

from celery_durable import Durable
from celery_durable.store.memory import MemoryStore
from tests.support.clock import FakeClock


@pytest.fixture
def app(redis_url: str) -> Celery:
    app = Celery("dispatch_tests", broker=redis_url, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = False

    @app.task(name="backup", shared=False)
    def backup(folder: str) -> str:  # pragma: no cover - the tests read the queue
        return folder

    @app.task(name="invoice", shared=False)
    def invoice(customer: str, amount: int = 0) -> str:  # pragma: no cover
        return customer

    return app


@pytest.fixture(params=["memory", "sqlite", "postgres", "mysql"])
def make_durable(
    request: pytest.FixtureRequest, app: Celery, clock: FakeClock
) -> Iterator[Callable[[], Durable]]:
    """Makes Durables on one store, as processes sharing a journal: the memory store and each
    SQL database (for what the store takes part in)."""
    made: list[Durable] = []
    store = MemoryStore()
    url = None
    if request.param != "memory":
        fixture = {"sqlite": "sqlite_url", "postgres": "pg_url", "mysql": "mysql_url"}
        url = str(request.getfixturevalue(fixture[request.param]))

    def make() -> Durable:
        made.append(
            Durable(app, store=store, clock=clock)
            if url is None
            else Durable(app, url, clock=clock)
        )
        return made[-1]

    yield make
    for d in made:
        d.close()
