"""What a new user meets first: errors that say what to do, in words.

* a missing database driver names the extra that installs it;
* user-facing errors say what is wrong without internal rule codes (``A7:``, ``S1:``): the
  code stays on the exception (``.rule``) and in logs.
"""

from __future__ import annotations

import sys

import pytest
from celery import Celery

from celery_durable import Durable
from celery_durable.errors import JournalError
from tests.test_cli import fails


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
