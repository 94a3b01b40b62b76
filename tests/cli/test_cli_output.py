"""What the command line prints is safe and readable (docs/cli.md, "Output").

Stored data never reaches the terminal with raw control characters (S1), long arguments are
not echoed back in full, a closed pipe ends a command quietly, and ``schedules list`` shows
each schedule's last run.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import unicodedata
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery

from celery_durable import Durable, Every, InvalidSchedule
from tests.cli.test_cli import APP, cli, fails, ok
from tests.support.processes import REPO_ROOT, child_env

pytestmark = pytest.mark.timeout(60)

HOSTILE_IDS = ["a\nb", "esc\x1b[31mred", "rtl\u202egnp.exe", "soh\x01", "del\x7f", "nel\x85"]
HOSTILE_IDS += ["zero\u200bwidth", " leading", "trailing ", "tab\tid"]


def raw_controls(text: str) -> list[str]:
    """Control and format characters in ``text`` other than the newlines between lines."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf")]


@pytest.fixture
def app() -> Celery:
    app = Celery("output", broker="memory://")

    @app.task(name="out.plain")
    def plain(*args: object) -> None: ...

    return app


@pytest.mark.parametrize("sid", HOSTILE_IDS, ids=repr)
def test_s1_refuses_control_and_format_characters_through_the_api(
    app: Celery, sqlite_url: str, sid: str
) -> None:
    durable = Durable(app, sqlite_url)
    try:
        with pytest.raises(InvalidSchedule) as refused:
            durable.schedules.create(sid, "out.plain", None, Every(timedelta(minutes=1)))
        assert "S1" in str(refused.value) or refused.value.rule == "S1"
        assert durable.schedules.list() == []
    finally:
        durable.close()


@pytest.mark.parametrize("sid", ["a\nb", "esc\x1b[2J", "rtl\u202e"], ids=repr)
def test_s1_refuses_control_characters_through_the_cli(sqlite_url: str, sid: str) -> None:
    line = fails(sqlite_url, 2, "schedules", "create", sid, "cli.backup", "--every", "1m")
    assert "control or format characters" in line
    assert not raw_controls(line)
    assert "No schedules." in ok(sqlite_url, "schedules", "list")


def _legacy(monkeypatch: pytest.MonkeyPatch, durable: Durable, sid: str, **kw: object) -> None:
    """A schedule stored by a version before S1 refused control characters."""
    with monkeypatch.context() as patch:
        patch.setattr("celery_durable.core.ids.first_control", lambda text: None, raising=False)
        durable.schedules.create(sid, "cli.backup", None, Every(timedelta(minutes=1)), **kw)


def test_stored_control_characters_never_reach_the_terminal(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.e2e.cli_app import app as cli_app

    durable = Durable(cli_app, sqlite_url)
    evil = "old\x1b[2J\nforged\u202eline"
    try:
        _legacy(monkeypatch, durable, evil, args=["\x1b]0;title\x07", "\x9b31m"])
        durable.schedules.trigger(evil)
    finally:
        durable.close()
    for args in (
        ("schedules", "list"),
        ("schedules", "list", "--json"),
        ("schedules", "show", evil),
        ("schedules", "show", evil, "--json"),
        ("runs", "list"),
        ("runs", "list", "--json"),
        ("schedules", "pause", evil),
    ):
        result = cli(sqlite_url, *args)
        assert result.exit_code == 0, (args, result.output)
        assert not raw_controls(result.stdout + result.stderr), (args, result.stdout)
    listed = ok(sqlite_url, "schedules", "list")
    assert "old\\x1b[2J\\nforged\\u202eline" in listed
    # Read as JSON, the data is the stored data.
    assert json.loads(ok(sqlite_url, "schedules", "list", "--json"))[0]["id"] == evil


def test_logs_quote_ids_so_a_newline_cannot_forge_a_line(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.e2e.cli_app import app as cli_app

    start = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)
    clock = [start]
    durable = Durable(cli_app, sqlite_url, clock=lambda: clock[0])
    forged = "x\n[2026-12-03 12:00:00,000: ERROR/MainProcess] forged"
    try:
        _legacy(monkeypatch, durable, forged)
        dispatcher = durable.dispatcher()
        with caplog.at_level(logging.INFO, logger="celery_durable"):
            clock[0] = start + timedelta(minutes=1, seconds=1)
            dispatcher.tick()
        dispatcher.close()
    finally:
        durable.close()
    decided = [r.getMessage() for r in caplog.records if "decided run" in r.getMessage()]
    assert decided, [r.getMessage() for r in caplog.records]
    assert all("\n" not in message for message in decided)
    assert repr(forged) in decided[0]


def test_a_long_run_id_is_named_not_echoed(sqlite_url: str) -> None:
    long_id = "r" * 100_000
    ok(sqlite_url, "db", "init")
    line = fails(sqlite_url, 3, "runs", "show", long_id)
    assert len(line) < 300, len(line)
    assert "100,000 characters" in line
    line = fails(sqlite_url, 3, "schedules", "show", "s" * 150)
    assert "150 characters" in line and len(line) < 300


@pytest.mark.parametrize(
    "args",
    [
        ("health", "--max-lag", "x" * 100_000),
        ("health", "--max-tick-age", "x" * 100_000),
        ("partitions", "set", "x" * 100_000),
        ("runs", "list", "--limit", "x" * 100_000),
        ("--" + "x" * 99_998,),
    ],
    ids=["health-max-lag", "health-max-tick-age", "partitions-set", "runs-limit", "group-option"],
)
def test_a_long_bad_option_value_is_named_not_echoed(sqlite_url: str, args: tuple) -> None:
    """A 100,000-character value where a number belongs: one short line, its length said."""
    ok(sqlite_url, "db", "init")
    line = fails(sqlite_url, 2, *args)
    assert len(line) < 300, len(line)
    assert "100,000 characters" in line


def test_a_closed_pipe_ends_the_command_quietly(sqlite_url: str) -> None:
    """``celery … schedules show X | head``: no ``Error: BrokenPipeError``, no traceback."""
    created = ok(sqlite_url, "schedules", "create", "zz", "cli.backup", "--every", "1m")
    assert "created" in created
    command = [sys.executable, "-m", "celery", "-A", APP, "durable", "--url", sqlite_url]
    process = subprocess.Popen(
        [*command, "schedules", "show", "zz", "--next", "1000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env({}),
        cwd=REPO_ROOT,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before anything is written
    error = process.stderr.read().decode()
    process.wait(timeout=30)
    assert error == ""
    assert process.returncode == 141


def test_schedules_list_has_a_last_run_column(sqlite_url: str) -> None:
    ok(sqlite_url, "schedules", "create", "a", "cli.backup", "--every", "1m")
    ok(sqlite_url, "schedules", "create", "b", "cli.backup", "--every", "1m")
    run_id = ok(sqlite_url, "schedules", "trigger", "a").strip()
    listed = ok(sqlite_url, "schedules", "list")
    header, row_a, row_b = listed.splitlines()
    assert re.split(r"\s{2,}", header)[:5] == ["ID", "TASK", "RULE", "STATUS", "LAST RUN (UTC)"]
    start = header.index("LAST RUN (UTC)")
    due = run_id.partition("@")[2]
    assert row_a[start:].startswith(due[:19] + "Z")
    assert row_b[start:].startswith("- ")
    data = {s["id"]: s for s in json.loads(ok(sqlite_url, "schedules", "list", "--json"))}
    assert data["a"]["last_run"].startswith(due[:19]) and data["b"]["last_run"] is None


def test_schedules_list_and_show_say_where_a_schedule_came_from_and_mark_overdue(
    sqlite_url: str,
) -> None:
    """``celery.backend_cleanup`` says it was installed by Celery (result_expires, B7); a
    schedule whose next due time has passed is marked "(overdue)", one still to come is not."""
    from celery.schedules import crontab

    from celery_durable.importers.beat_schedule import import_beat_schedule
    from tests.e2e.cli_app import app as cli_app

    hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    durable = Durable(cli_app, sqlite_url, clock=lambda: hour_ago)
    try:
        cleanup = {"task": "celery.backend_cleanup", "schedule": crontab("0", "4", "*")}
        import_beat_schedule(durable, {"celery.backend_cleanup": cleanup})
        durable.schedules.create("behind", "cli.backup", None, Every(timedelta(minutes=1)))
        durable.schedules.create("ahead", "cli.backup", None, Every(timedelta(days=2)))
    finally:
        durable.close()
    listed = ok(sqlite_url, "schedules", "list")
    rows = {line.split()[0]: line for line in listed.splitlines()[1:]}
    assert rows["celery.backend_cleanup"].endswith("Celery (result_expires)"), listed
    assert rows["behind"].endswith("API") and "(overdue)" in rows["behind"], listed
    assert "(overdue)" not in rows["ahead"], listed
    shown = ok(sqlite_url, "schedules", "show", "celery.backend_cleanup")
    assert "Origin" in shown and "installed by Celery because result_expires is set" in shown
    data = {s["id"]: s for s in json.loads(ok(sqlite_url, "schedules", "list", "--json"))}
    assert data["celery.backend_cleanup"]["origin"] == "Celery (result_expires)"
    assert (data["behind"]["overdue"], data["ahead"]["overdue"]) == (True, False)
