"""``--reason`` and ``schedules history`` on the command line (O5), on a real journal."""

from __future__ import annotations

import getpass

import pytest

from celery_durable.cli import audit
from tests.cli.test_cli import UTC_JSON, as_json, columns, fails, ok

pytestmark = pytest.mark.timeout(60)


def test_reason_and_the_os_user_are_stored_and_shown(sqlite_url: str) -> None:
    url, me = sqlite_url, getpass.getuser()
    ok(url, "schedules", "create", "demo", "cli.backup", "--every", "30s", "--reason", "ticket 7")
    ok(url, "schedules", "change", "demo", "--every", "1m", "--input", "[1]")
    ok(url, "schedules", "pause", "demo", "--reason", "disk full")
    ok(url, "schedules", "resume", "demo", "--reason", "disk replaced")
    ok(url, "schedules", "delete", "demo", "--yes", "--reason", "obsolete")
    text = ok(url, "schedules", "history", "demo")
    lines = text.splitlines()
    assert columns(text)[:2] == [0, text.index("ACTION")]
    assert lines[0].split() == ["TIME", "(UTC)", "ACTION", "BY", "CHANGED", "REASON"]
    assert [line.split()[1:3] for line in lines[1:]] == [
        ["created", me], ["changed", me], ["paused", me], ["resumed", me], ["deleted", me],
    ]  # fmt: skip
    assert lines[1].endswith("ticket 7") and lines[2].endswith("-")
    assert "input, rule" in lines[2]
    data = as_json(url, "schedules", "history", "demo")
    assert [(e["action"], e["by"], e["reason"]) for e in data] == [
        ("created", me, "ticket 7"),
        ("changed", me, None),
        ("paused", me, "disk full"),
        ("resumed", me, "disk replaced"),
        ("deleted", me, "obsolete"),
    ]
    assert all(UTC_JSON.match(e["at"]) for e in data)
    assert data[1]["changes"]["input"] == {"before": None, "after": [1]}
    assert data[1]["changes"]["rule"]["after"]["seconds"] == 60
    assert [e["action"] for e in as_json(url, "schedules", "history", "demo", "--last", "2")] == [
        "resumed",
        "deleted",
    ]


def test_bad_reason_and_unknown_schedule(sqlite_url: str) -> None:
    url = sqlite_url
    ok(url, "schedules", "create", "demo", "cli.backup", "--every", "30s")
    line = fails(url, 2, "schedules", "pause", "demo", "--reason", "a\x1b[2Jb")
    assert "reason contains the control or format character U+001B" in line
    assert "\x1b" not in line
    assert as_json(url, "schedules", "show", "demo")["status"] == "active"
    assert fails(url, 3, "schedules", "history", "ghost") == "Error: schedule 'ghost' not found"


def test_a_user_without_a_name_is_named_by_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    def nameless() -> str:
        raise OSError("No username set in the environment")

    monkeypatch.setattr(getpass, "getuser", nameless)
    assert audit.os_user().startswith("uid ")


@pytest.mark.parametrize("name", ["evil\x1b[31m\nuser", "u" * 500])
def test_a_user_name_the_history_cannot_hold_is_named_by_uid(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """O5: the OS user is the environment's word ($LOGNAME, $USER); one that ``by`` refuses
    (a control character, 500 characters) must not make every command that stores fail."""
    monkeypatch.setattr(getpass, "getuser", lambda: name)
    ok(sqlite_url, "schedules", "create", "demo", "cli.backup", "--every", "30s")
    ok(sqlite_url, "schedules", "pause", "demo", "--reason", "maintenance")
    [created, paused] = as_json(sqlite_url, "schedules", "history", "demo")
    assert created["by"].startswith("uid ") and paused["by"] == created["by"]


def test_trigger_and_backfill_take_a_reason(sqlite_url: str) -> None:
    url, me = sqlite_url, getpass.getuser()
    ok(url, "schedules", "create", "demo", "cli.backup", "--every", "1h")
    run_id = ok(url, "schedules", "trigger", "demo", "--reason", "month end").strip()
    data = as_json(url, "schedules", "history", "demo")
    assert (data[-1]["action"], data[-1]["by"], data[-1]["reason"]) == (
        "triggered",
        me,
        "month end",
    )
    assert data[-1]["changes"] == {"run": {"before": None, "after": run_id}}
