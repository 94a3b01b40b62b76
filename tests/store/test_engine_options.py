"""``durable_engine_options`` and the engine defaults every database gets (docs/journal.md,
"Engine options"): a pooled connection the server dropped is replaced before use."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery

from celery_durable import Durable
from celery_durable.config import ConfigError
from celery_durable.errors import JournalUnavailable
from celery_durable.store.journal import NewEvent
from celery_durable.store.journal.sql import SqlJournal


def _durable(url: str, **conf: Any) -> Durable:
    app = Celery("engine_options", broker="memory://", set_as_current=False)
    app.conf.update(conf)
    return Durable(app, url)


def _drop_sessions(url: str, tag: str) -> None:
    """End the sessions named ``tag`` and wait until they are gone: ``pg_terminate_backend``
    only signals a server process, which then sends its error, closes the socket and leaves
    ``pg_stat_activity``. A restart is over before the next append in the case under test;
    without the wait, a loaded machine could check out the connection before its socket
    shows the close (seen 2026-12-06)."""
    by_tag = {"tag": tag}
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = :tag"
                ),
                by_tag,
            )
        left = sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :tag")
        deadline = time.monotonic() + 10
        while True:
            with engine.connect() as conn:
                if not conn.execute(left, by_tag).scalar():
                    return
            assert time.monotonic() < deadline, f"the sessions {tag!r} did not end in 10 s"
            time.sleep(0.01)
    finally:
        engine.dispose()


@pytest.mark.parametrize("pre_ping", [None, False], ids=["defaults", "pre-ping-off"])
def test_a_postgresql_restart_between_appends_is_invisible_with_the_defaults(
    pg_url: str, pre_ping: bool | None
) -> None:
    """The server ends every session while the journal is idle; with the defaults (a look at
    each connection's socket at checkout) the next append takes a fresh connection. With
    ``pool_pre_ping=False`` given, which turns that look off too, it fails: the control that
    shows the defaults are what make the first case pass."""
    tag = f"cdt-{uuid.uuid4().hex[:10]}"
    options = {} if pre_ping is None else {"pool_pre_ping": pre_ping}
    journal = SqlJournal(f"{pg_url}&application_name={tag}", engine_options=options)
    try:
        journal.append("schedule/a", 0, [NewEvent(type="One")])
        _drop_sessions(pg_url, tag)
        if pre_ping is None:
            assert journal.engine.pool._pre_ping is False  # the socket look, no SELECT 1
            journal.append("schedule/a", 1, [NewEvent(type="Two")])
            assert [e.type for e in journal.read_stream("schedule/a")] == ["One", "Two"]
        else:
            # The store's own error; the driver's is its cause.
            with pytest.raises(JournalUnavailable) as info:
                journal.append("schedule/a", 1, [NewEvent(type="Two")])
            assert isinstance(info.value.__cause__, sa.exc.OperationalError)
    finally:
        journal.close()


def test_durable_engine_options_reach_the_engine(sqlite_url: str) -> None:
    durable = _durable(sqlite_url, durable_engine_options={"pool_recycle": 77, "echo_pool": True})
    try:
        pool = durable.journal.engine.pool
        assert pool._recycle == 77 and pool.echo is True
        assert pool._pre_ping is False  # SQLite: no server to close a pooled connection
    finally:
        durable.close()
    durable = _durable(sqlite_url, durable_engine_options={"pool_pre_ping": True})
    try:
        assert durable.journal.engine.pool._pre_ping is True  # the caller's choice wins
    finally:
        durable.close()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["pool_size", 5], "must be a dict of create_engine() keyword arguments, not a list"),
        ({"pool size": 5}, "keys must be keyword names, not 'pool size'"),
        ({1: 5}, "keys must be keyword names, not 1"),
    ],
)
def test_a_malformed_durable_engine_options_is_refused(
    sqlite_url: str, value: Any, message: str
) -> None:
    durable = _durable(sqlite_url, durable_engine_options=value)
    with pytest.raises(
        ConfigError,
        match=re.escape(f"durable_engine_options {message}"),
    ):
        durable.config  # noqa: B018
    durable.close()


def test_an_option_sqlalchemy_refuses_is_a_config_error_naming_the_setting(
    sqlite_url: str,
) -> None:
    durable = _durable(sqlite_url, durable_engine_options={"pool_sise": 5})
    try:
        with pytest.raises(ConfigError, match=r"^durable_engine_options: .*pool_sise"):
            durable.journal  # noqa: B018
    finally:
        durable.close()


def test_the_config_repr_shows_engine_option_names_never_values(sqlite_url: str) -> None:
    secret = "s3cr3t-password"
    durable = _durable(
        sqlite_url, durable_engine_options={"connect_args": {"password": secret}, "pool_size": 3}
    )
    try:
        shown = repr(durable.config)
        assert "'connect_args': …" in shown and "'pool_size': …" in shown
        assert secret not in shown
    finally:
        durable.close()
