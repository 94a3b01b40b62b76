"""What a new user meets first: errors that say what to do, in words.

* a missing database driver names the extra that installs it;
* user-facing errors say what is wrong without internal rule codes (``A7:``, ``S1:``): the
  code stays on the exception (``.rule``) and in logs.
"""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, Every, parse_run_id
from celery_durable.errors import DurableError, JournalError
from tests.cli.test_cli import fails, ok


@pytest.fixture
def no_psycopg(monkeypatch: pytest.MonkeyPatch) -> None:
    """The PostgreSQL driver is not installed (``import psycopg`` fails)."""
    for name in [m for m in sys.modules if m == "psycopg" or m.startswith("psycopg.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "psycopg", None)


def test_a_missing_postgresql_driver_names_the_extra_to_install(no_psycopg: None) -> None:
    durable = Durable(Celery("nodriver", set_as_current=False), "postgresql://u:pw@db/app")
    with pytest.raises(JournalError) as info:
        durable.journal.ensure_ready()
    message = str(info.value)
    assert "pip install 'celery-durable[postgres]'" in message
    assert "psycopg driver" in message and "pw" not in message
    assert info.value.missing_module == "psycopg"


def test_the_cli_says_which_extra_to_install(no_psycopg: None) -> None:
    line = fails("postgresql://u:pw@127.0.0.1:1/app", 1, "schedules", "list")
    assert "pip install 'celery-durable[postgres]'" in line, line


# -- errors in words ------------------------------------------------------------------------------


def _noop(*args: Any) -> None:
    return None


CODE_PREFIX = re.compile(r"(^|: )[ASRWD][0-9]+[a-z]?: ")


def test_api_errors_say_it_in_words_and_keep_the_rule_as_an_attribute(sqlite_url: str) -> None:
    app = Celery(f"words-{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.task(name="words.t", shared=False)(_noop)
    durable = Durable(app, sqlite_url)
    every = Every(timedelta(minutes=1))
    durable.schedules.create("s", "words.t", None, every)
    durable.schedules.create("gone", "words.t", None, every)
    durable.schedules.delete("gone")
    attempts: list[tuple[str, Callable[[], Any]]] = [
        ("A7", lambda: durable.schedules.create("x", "words.nothing", None, every)),
        ("S1", lambda: durable.schedules.create("a~b", "words.t", None, every)),
        ("S1", lambda: durable.schedules.create(" ", "words.t", None, every)),
        ("A1", lambda: durable.schedules.create("s", "words.t", 1, every)),
        ("A3", lambda: durable.schedules.resume("s")),
        ("A4", lambda: durable.schedules.create("gone", "words.t", None, every)),
        ("A4", lambda: durable.schedules.pause("never")),
        ("S2", lambda: parse_run_id("s@yesterday")),
    ]
    try:
        for rule, attempt in attempts:
            with pytest.raises(DurableError) as info:
                attempt()
            assert info.value.rule == rule, (rule, info.value)
            assert not CODE_PREFIX.search(str(info.value)), str(info.value)
    finally:
        durable.close()


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (
            ["create", "x", "cli.nothing", "--every", "1m"],
            3,
            "task 'cli.nothing' is not registered",
        ),
        (["create", "x~y", "cli.backup", "--every", "1m"], 2, "must not contain '~'"),
        (["pause", "nope"], 3, "not found"),
    ],
)
def test_cli_errors_say_it_in_words(
    sqlite_url: str, args: list[str], code: int, words: str
) -> None:
    ok(sqlite_url, "db", "init")  # `pause` changes only what is stored: it needs a journal
    line = fails(sqlite_url, code, "schedules", *args)
    assert words in line and not CODE_PREFIX.search(line), line
