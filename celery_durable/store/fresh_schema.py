"""A fresh PostgreSQL schema for one test's journal (the ``durable_url`` fixture of the test
plugin, :mod:`celery_durable.testing`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

__all__ = ["fresh_postgres_schema"]


@contextmanager
def fresh_postgres_schema(url: str) -> Iterator[str]:
    """Create a schema named ``cdt_<random>`` in the database at ``url`` and give the URL of a
    connection that works in it (``options=-csearch_path=<schema>``, the password kept).

    On leaving, the schema is dropped with everything in it, also when the body raised.
    """
    schema = f"cdt_{uuid.uuid4().hex[:12]}"
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        parsed = make_url(url)
        query = dict(parsed.query)
        query["options"] = f"-csearch_path={schema}"
        yield parsed.set(query=query).render_as_string(hide_password=False)
    finally:
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        engine.dispose()
