"""Tests of the test infrastructure itself: the fixtures in ``conftest.py`` and the helpers in
``tests/support``. They need real PostgreSQL and Redis servers (configured or throwaway)."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest
import redis
import sqlalchemy as sa

from tests.support import services
from tests.support.processes import (
    ProcessExited,
    python_command,
    running_process,
    wait_for,
)

# ----------------------------------------------------------------------------- PostgreSQL


def _search_path(url: str) -> str:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return str(conn.execute(sa.text("SHOW search_path")).scalar_one())
    finally:
        engine.dispose()


def test_pg_url_sets_search_path_through_sqlalchemy(pg_url: str) -> None:
    assert pg_url.startswith("postgresql+psycopg://")
    schema = sa.engine.make_url(pg_url).query["options"]
    assert isinstance(schema, str) and schema.startswith("-csearch_path=cdt_")
    schema_name = schema.removeprefix("-csearch_path=")

    assert _search_path(pg_url) == schema_name

    engine = sa.create_engine(pg_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE probe (id int PRIMARY KEY)"))
            conn.execute(sa.text("INSERT INTO probe VALUES (1)"))
            where = conn.execute(
                sa.text(
                    "SELECT table_schema FROM information_schema.tables WHERE table_name='probe'"
                )
            ).scalar_one()
        assert where == schema_name
    finally:
        engine.dispose()

    # Plain psycopg (and libpq in general) honours the same URL.
    with psycopg.connect(services.to_libpq_url(pg_url)) as conn:
        row = conn.execute("SELECT current_schema(), (SELECT count(*) FROM probe)").fetchone()
    assert row == (schema_name, 1)


def test_pg_url_reaches_subprocesses(pg_url: str) -> None:
    code = textwrap.dedent(
        """
        import sys, sqlalchemy as sa
        engine = sa.create_engine(sys.argv[1])
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE made_by_child (x int)"))
            print(conn.execute(sa.text("SELECT current_schema()")).scalar_one())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, pg_url], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out.startswith("cdt_")
    engine = sa.create_engine(pg_url)
    try:
        assert sa.inspect(engine).get_table_names() == ["made_by_child"]
    finally:
        engine.dispose()


def test_schemas_are_isolated_and_dropped(postgres_server_url: str) -> None:
    with services.isolated_schema(postgres_server_url) as first:
        engine = sa.create_engine(first)
        try:
            with engine.begin() as conn:
                conn.execute(sa.text("CREATE TABLE only_in_first (x int)"))
            assert sa.inspect(engine).get_table_names() == ["only_in_first"]
        finally:
            engine.dispose()
        first_schema = _search_path(first)

        with services.isolated_schema(postgres_server_url) as second:
            assert _search_path(second) != first_schema
            engine = sa.create_engine(second)
            try:
                assert sa.inspect(engine).get_table_names() == []
                with engine.connect() as conn, pytest.raises(sa.exc.ProgrammingError):
                    conn.execute(sa.text("SELECT * FROM only_in_first"))
            finally:
                engine.dispose()

    with psycopg.connect(services.to_libpq_url(postgres_server_url)) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (first_schema,)
        ).fetchone()
    assert left == (0,)


def test_schema_drop_survives_a_leaked_transaction(postgres_server_url: str) -> None:
    """A connection left idle in a transaction holding locks must not block the teardown."""
    with services.isolated_schema(postgres_server_url) as url:
        leaked = psycopg.connect(services.to_libpq_url(url))
        leaked.execute("CREATE TABLE t (x int)")  # transaction left open, lock held
        row = leaked.execute("SELECT current_schema()").fetchone()
        assert row is not None
        schema = row[0]
    try:
        with psycopg.connect(services.to_libpq_url(postgres_server_url)) as conn:
            left = conn.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)
            ).fetchone()
        assert left == (0,)
        with pytest.raises(psycopg.OperationalError):  # its backend was terminated
            leaked.execute("SELECT 1")
    finally:
        leaked.close()


# ----------------------------------------------------------------------------- SQLite


def test_sqlite_url_is_a_file(sqlite_url: str, tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    assert sqlite_url == f"sqlite:///{path}"
    assert not path.exists()
    engine = sa.create_engine(sqlite_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE t (x int)"))
    finally:
        engine.dispose()
    assert path.is_file()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("t",)]


def test_journal_url_is_parametrised(journal_url: str, request: pytest.FixtureRequest) -> None:
    backend = request.node.callspec.params["journal_url"]
    assert request.node.name.endswith(f"[{backend}]")
    expected = {
        "sqlite": "sqlite:///",
        "postgres": "postgresql+psycopg://",
        "mysql": "mysql+pymysql://",
    }[backend]
    assert journal_url.startswith(expected)
    engine = sa.create_engine(journal_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE j (x int)"))
            conn.execute(sa.text("INSERT INTO j VALUES (42)"))
            assert conn.execute(sa.text("SELECT x FROM j")).scalar_one() == 42
    finally:
        engine.dispose()


# ----------------------------------------------------------------------------- Redis


@pytest.mark.parametrize("round_", [1, 2])
def test_redis_url_is_flushed_and_reachable(redis_url: str, round_: int) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.ping()
        # The previous round left a key behind; the fixture must have flushed it.
        assert client.dbsize() == 0
        client.set("leftover", round_)
        assert client.get("leftover") == str(round_).encode()
    finally:
        client.close()


# ----------------------------------------------------------------------------- subprocesses


def test_process_round_trip(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import os, signal, sys, time
        def bye(signum, frame):
            print("got SIGTERM", os.environ["GREETING_TARGET"], flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
        """
    )
    log = tmp_path / "logs" / "child.log"
    with running_process(
        python_command("-c", script), log_path=log, env={"GREETING_TARGET": "world"}
    ) as proc:
        wait_for(lambda: "ready" in proc.read_log(), timeout=20, processes=[proc])
        assert proc.is_alive()
    assert proc.returncode == 0
    assert "got SIGTERM world" in log.read_text()


def test_process_is_killed_when_it_ignores_sigterm(tmp_path: Path) -> None:
    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"  # noqa: E501
    with running_process(
        python_command("-c", script), log_path=tmp_path / "stubborn.log", stop_timeout=1
    ) as proc:
        wait_for(lambda: "up" in proc.read_log(), timeout=20, processes=[proc])
    assert proc.returncode == -signal.SIGKILL


def test_process_failure_prints_log_and_wait_for_notices_exit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = "import sys; print('boom happened', flush=True); sys.exit(3)"
    with (
        pytest.raises(ProcessExited, match="boom happened"),
        running_process(python_command("-c", script), log_path=tmp_path / "crash.log") as proc,
    ):
        wait_for(lambda: False, timeout=30, processes=[proc])
    assert proc.returncode == 3
    assert "boom happened" in capsys.readouterr().err


def test_wait_for_times_out_and_returns_value() -> None:
    calls: list[int] = []

    def third_time_lucky() -> int | None:
        calls.append(1)
        return len(calls) if len(calls) >= 3 else None

    assert wait_for(third_time_lucky, timeout=5, interval=0.01) == 3
    with pytest.raises(TimeoutError, match="never"):
        wait_for(lambda: False, timeout=0.2, interval=0.05, message="never")


# ----------------------------------------------------------------------------- services


def test_unanswering_server_is_an_error_in_ci() -> None:
    port = services.free_port()
    with pytest.raises(services.ServiceError, match="CI=true"):
        services.ensure_postgres(
            f"postgresql+psycopg://postgres@127.0.0.1:{port}/test", allow_throwaway=False
        )
    with pytest.raises(services.ServiceError, match="CI=true"):
        services.ensure_redis(f"redis://127.0.0.1:{port}/0", allow_throwaway=False)
