"""The ``celery durable`` command line (docs/cli.md), on real journals.

Commands run in-process through Celery's own ``celery`` click group (``-A tests.e2e.cli_app
durable …``), so the plugin gets the ``ctx.obj`` Celery builds; a few run as real
subprocesses (``celery …`` and ``python -m celery_durable …``) to prove the entry points.
Every test passes ``--url``: the app module's own ``Durable`` is shared by all tests in this
process, and its URL is read once.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.bin.celery import celery as celery_main
from click.testing import CliRunner, Result

from celery_durable import Durable
from celery_durable.core.retry import Retry
from celery_durable.store.journal import schema
from tests.support.processes import REPO_ROOT, child_env
from tests.support.services import free_port

pytestmark = pytest.mark.timeout(60)

APP = "tests.e2e.cli_app"

SCHEDULE_KEYS = {
    "last_run",
    "id",
    "task",
    "input",
    "rule",
    "rule_text",
    "zone",
    "catch_up",
    "overlap",
    "start_deadline",
    "jitter",
    "catch_up_window",
    "blackouts",
    "on_blackout",
    "next_run",
    "options",
    "status",
    "paused",
    "deleted",
    "complete",
    "next_due",
    "next_due_local",
    "overdue",
    "origin",
    "origin_text",
    "anchor",
    "created_at",
    "runs_decided",
    "pending",
    "version",
}
RUN_KEYS = {
    "run_id",
    "schedule_id",
    "due",
    "due_local",
    "state",
    "schedule_state",
    "task",
    "reason",
    "decided_at",
    "started_at",
    "error",
    "outcome",
}
UTC_JSON = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z\Z")


def cli(url: str | None, *args: str) -> Result:
    """``celery -A tests.e2e.cli_app durable [--url URL] ARGS`` in this process."""
    head = ["-A", APP, "durable"] + (["--url", url] if url else [])
    return CliRunner().invoke(
        celery_main, [*head, *args], catch_exceptions=False, auto_envvar_prefix="CELERY"
    )


def ok(url: str, *args: str) -> str:
    result = cli(url, *args)
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    assert result.stderr == "" or args[:2] == ("schedules", "backfill"), result.stderr
    return result.stdout


def as_json(url: str, *args: str) -> Any:
    return json.loads(ok(url, *args, "--json"))


def fails(url: str | None, code: int, *args: str) -> str:
    """Run a command that must fail with ``code`` and one ``Error:`` line; return the line."""
    result = cli(url, *args)
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def columns(text: str) -> list[int]:
    """Start offsets of the columns of a table's header line."""
    header = text.splitlines()[0]
    return [m.start() for m in re.finditer(r"(?:^|(?<=  ))\S", header)]


# -- schedules ------------------------------------------------------------------------------------


def test_create_list_show_in_tables_and_json(journal_url: str) -> None:
    url = journal_url
    assert "created" in ok(
        url,
        "schedules",
        "create",
        "nightly",
        "cli.backup",
        "--daily",
        "02:00",
        "--zone",
        "Europe/Oslo",
        "--args",
        '["/srv"]',
    )
    ok(
        url,
        "schedules",
        "create",
        "invoices",
        "cli.invoice",
        "--weekly",
        "mon,thu@08:00",
        "--zone",
        "Europe/Oslo",
        "--catch-up",
        "all",
        "--input",
        '{"customer": "Ada"}',
    )
    ok(
        url,
        "schedules",
        "create",
        "demo",
        "cli.backup",
        "--every",
        "1h30m",
        "--max-runs",
        "3",
        "--overlap",
        "skip",
        "--queue",
        "low",
        "--priority",
        "7",
    )
    ok(url, "schedules", "create", "cron", "cli.backup", "--cron", "0 2 * * *")
    ok(url, "schedules", "create", "party", "cli.backup", "--once", "2030-06-01T10:00Z")

    table = ok(url, "schedules", "list")
    lines = table.splitlines()
    assert lines[0].split() == [
        "ID",
        "TASK",
        "RULE",
        "STATUS",
        "LAST",
        "RUN",
        "(UTC)",
        "NEXT",
        "DUE",
        "(UTC)",
        "NEXT",
        "DUE",
        "(LOCAL)",
        "NEXT",
        "RUN",
        "(UTC)",
        "ORIGIN",
    ]
    assert [line.split()[0] for line in lines[1:]] == [
        "cron",
        "demo",
        "invoices",
        "nightly",
        "party",
    ]
    starts = columns(table)
    for line in lines[1:]:  # aligned: every value starts under its header
        assert all(pos == 0 or (line[pos - 2 : pos] == "  " and line[pos] != " ") for pos in starts)
    party = next(line for line in lines if line.startswith("party"))
    # Once has no zone: its times are shown in the app's timezone (Europe/Oslo).
    assert "2030-06-01T10:00:00Z" in party and "2030-06-01 12:00:00+02:00 Europe/Oslo" in party
    nightly = next(line for line in lines if line.startswith("nightly"))
    assert re.search(r"T0[01]:00:00Z .* 02:00:00\+0[12]:00 Europe/Oslo", nightly), nightly
    assert 'cron "0 2 * * *" UTC' in table and "every 1h30m, at most 3 runs" in table

    listed = as_json(url, "schedules", "list")
    assert [s["id"] for s in listed] == ["cron", "demo", "invoices", "nightly", "party"]
    assert all(set(s) == SCHEDULE_KEYS for s in listed)
    by_id = {s["id"]: s for s in listed}
    assert by_id["party"]["next_due"] == "2030-06-01T10:00:00.000000Z"
    assert by_id["party"]["next_due_local"] == "2030-06-01T12:00:00+02:00"
    assert by_id["invoices"]["rule"] == {
        "type": "weekly",
        "days": ["mon", "thu"],
        "at": "08:00:00",
        "zone": "Europe/Oslo",
        "end_at": None,
        "max_runs": None,
    }
    assert by_id["invoices"]["input"] == {"customer": "Ada"}
    assert by_id["invoices"]["catch_up"] == "all"
    assert by_id["demo"]["options"] == {"queue": "low", "priority": 7}
    assert by_id["demo"]["overlap"] == "skip"
    assert by_id["nightly"]["options"] == {"args": ["/srv"]}
    assert all(UTC_JSON.match(s["next_due"]) for s in listed)

    shown = ok(url, "schedules", "show", "nightly", "--next", "3")
    assert "Rule          daily at 02:00 Europe/Oslo" in shown
    assert 'Options       args=["/srv"]' in shown
    upcoming = shown.split("Next due times\n")[1].splitlines()
    assert upcoming[0].split() == ["UTC", "LOCAL"] and len(upcoming) == 4
    assert all(" 02:00:00+0" in row for row in upcoming[1:])
    detail = as_json(url, "--json", "schedules", "show", "demo", "--next", "5")  # group --json
    assert set(detail) == SCHEDULE_KEYS | {"global_blackouts", "upcoming", "recent_runs"}
    assert set(detail["upcoming"][0]) == {"due", "due_local", "runs", "starts", "blackout"}
    assert len(detail["upcoming"]) == 3, "max_runs 3 bounds the coming due times"


def test_create_again_is_a_no_op_and_other_content_a_conflict(sqlite_url: str) -> None:
    args = ("schedules", "create", "nightly", "cli.backup", "--daily", "02:00", "--zone", "UTC")
    created = json.loads(ok(sqlite_url, *args, "--json"))
    assert created["action"] == "create" and created["changed"] is True
    again = json.loads(ok(sqlite_url, *args, "--json"))
    assert again["changed"] is False and again["schedule"]["version"] == 1
    assert "unchanged" in ok(sqlite_url, *args)
    line = fails(sqlite_url, 4, *args[:-1], "Europe/Oslo")
    assert "different content" in line and "A1" not in line


def test_change_keeps_what_is_not_given(sqlite_url: str) -> None:
    ok(
        sqlite_url,
        "schedules",
        "create",
        "nightly",
        "cli.backup",
        "--daily",
        "02:00",
        "--zone",
        "Europe/Oslo",
        "--input",
        '"x"',
        "--queue",
        "low",
    )
    changed = as_json(sqlite_url, "schedules", "change", "nightly", "--daily", "03:30")
    view = changed["schedule"]
    assert changed["changed"] is True
    assert view["rule"]["at"] == "03:30:00" and view["rule"]["zone"] == "Europe/Oslo"
    assert view["input"] == "x" and view["options"] == {"queue": "low"}
    bounded = as_json(
        sqlite_url,
        "schedules",
        "change",
        "nightly",
        "--max-runs",
        "5",
        "--end-at",
        "2031-01-01T00:00",
        "--zone",
        "UTC",
        "--priority",
        "3",
    )
    rule = bounded["schedule"]["rule"]
    assert rule["max_runs"] == 5 and rule["end_at"].startswith("2031-01-01T00:00:00")
    assert rule["zone"] == "UTC" and rule["at"] == "03:30:00"
    assert bounded["schedule"]["options"] == {"queue": "low", "priority": 3}
    cleared = as_json(
        sqlite_url,
        "schedules",
        "change",
        "nightly",
        "--max-runs",
        "none",
        "--end-at",
        "none",
        "--task",
        "cli.invoice",
        "--every",
        "10m",
    )
    assert cleared["schedule"]["rule"]["type"] == "every"
    assert cleared["schedule"]["rule"]["max_runs"] is None
    assert cleared["schedule"]["task"] == "cli.invoice"
    assert as_json(sqlite_url, "schedules", "change", "nightly")["changed"] is False
    fails(sqlite_url, 3, "schedules", "change", "missing", "--every", "1m")
    fails(
        sqlite_url, 2, "schedules", "change", "nightly", "--zone", "Europe/Oslo"
    )  # every: no zone


def test_pause_resume_delete_and_their_exit_codes(sqlite_url: str) -> None:
    url = sqlite_url
    ok(url, "schedules", "create", "demo", "cli.backup", "--every", "30s")
    assert ok(url, "schedules", "pause", "demo").startswith("schedule 'demo' paused")
    assert as_json(url, "schedules", "pause", "demo")["changed"] is False  # no-op (A3)
    paused = as_json(url, "schedules", "show", "demo")
    assert paused["status"] == "paused" and paused["next_due"] is None
    resumed = ok(url, "schedules", "resume", "demo")
    assert "resumed" in resumed and "next due" in resumed
    assert "not paused" in fails(url, 4, "schedules", "resume", "demo")
    assert "--yes" in fails(url, 2, "schedules", "delete", "demo")  # not a terminal: no prompt
    assert ok(url, "schedules", "delete", "demo", "--yes").strip() == "schedule 'demo' deleted"
    assert as_json(url, "schedules", "delete", "demo", "-y")["changed"] is False
    assert "was deleted; its ID cannot be reused" in fails(
        url, 4, "schedules", "create", "demo", "cli.backup", "--every", "30s"
    )
    fails(url, 4, "schedules", "pause", "demo")
    assert as_json(url, "schedules", "show", "demo")["status"] == "deleted"
    assert "No schedules." in ok(url, "schedules", "list")
    assert [s["id"] for s in as_json(url, "schedules", "list", "--all")] == ["demo"]
    for verb in ("show", "pause", "resume", "delete", "trigger"):
        assert fails(url, 3, "schedules", verb, "ghost") == "Error: schedule 'ghost' not found"


# -- runs -----------------------------------------------------------------------------------------


def test_trigger_backfill_and_runs_list_show(journal_url: str) -> None:
    url = journal_url
    ok(
        url,
        "schedules",
        "create",
        "nightly",
        "cli.backup",
        "--daily",
        "02:00",
        "--zone",
        "Europe/Oslo",
    )
    ok(url, "schedules", "create", "other", "cli.backup", "--every", "1h")
    triggered = ok(url, "schedules", "trigger", "nightly").strip()
    assert re.fullmatch(r"nightly@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{7}Z", triggered)
    result = cli(
        url,
        "schedules",
        "backfill",
        "nightly",
        "--start",
        "2026-11-01",
        "--end",
        "2026-11-03T23:59",
        "--zone",
        "Europe/Oslo",
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split() == [
        "nightly@2026-11-01T01:00:00.0000000Z",
        "nightly@2026-11-02T01:00:00.0000000Z",
        "nightly@2026-11-03T01:00:00.0000000Z",
    ]
    assert result.stderr.strip() == "3 run(s) decided"
    again = as_json(
        url,
        "schedules",
        "backfill",
        "nightly",
        "--start",
        "2026-11-01T00:00Z",
        "--end",
        "2026-11-03T23:59Z",
    )
    assert again["run_ids"] == [], "a repeated backfill decides nothing (D9)"
    fails(
        url, 2, "schedules", "backfill", "nightly", "--start", "2026-11-01", "--end", "2026-11-02"
    )
    other = as_json(url, "schedules", "trigger", "other")["run_id"]

    table = ok(url, "runs", "list")
    lines = table.splitlines()
    assert lines[0].split() == ["RUN", "ID", "STATE", "DUE", "(UTC)", "DUE", "(LOCAL)", "TASK"]
    assert len(lines) == 6
    assert "2026-11-02T01:00:00Z  2026-11-02 02:00:00+01:00 Europe/Oslo" in table
    everything = as_json(url, "runs", "list")
    assert all(set(r) == RUN_KEYS for r in everything)
    dues = [r["due"] for r in everything]
    assert dues == sorted(dues, reverse=True), "newest first"
    only = as_json(url, "runs", "list", "--schedule", "nightly", "--state", "decided")
    assert {r["run_id"] for r in only} == {triggered, *result.stdout.split()}
    assert as_json(url, "runs", "list", "--schedule", "other")[0]["run_id"] == other
    assert as_json(url, "runs", "list", "--state", "finished") == []
    assert len(as_json(url, "runs", "list", "--limit", "2")) == 2
    assert ok(url, "runs", "list", "--state", "skipped").strip() == "No runs."
    fails(url, 3, "runs", "list", "--schedule", "ghost")
    fails(url, 2, "runs", "list", "--state", "sleeping")

    shown = ok(url, "runs", "show", "nightly@2026-11-02T01:00:00.0000000Z")
    assert "Schedule  nightly  (daily at 02:00 Europe/Oslo)" in shown
    assert "Due       2026-11-02T01:00:00Z  (2026-11-02 02:00:00+01:00 Europe/Oslo)" in shown
    assert "(reason: backfill)" in shown and "State     decided" in shown
    detail = as_json(url, "runs", "show", triggered)
    assert detail["state"] == "decided" and detail["durable"] is None
    assert detail["schedule_run"]["reason"] == "trigger"
    fails(url, 3, "runs", "show", "nightly@2020-01-01T00:00:00.0000000Z")
    fails(url, 3, "runs", "show", "no-such-run")


class Crash(BaseException):
    """A worker dying mid-body: nothing is stored for it."""


def _durable_runs(url: str) -> dict[str, str]:
    """Run durable tasks of a throwaway app on ``url``: finished (a step retried twice),
    faulted, and one left running (its worker "crashed")."""
    app = Celery(f"cli-runs-{uuid.uuid4().hex[:6]}", broker="memory://")
    durable = Durable(app, url)
    calls = {"flaky": 0}

    @durable.step(name="fetch")
    def fetch(x: int) -> int:
        return x * 2

    @durable.step(name="flaky", retry=Retry(attempts=3, initial=0.01))
    def flaky() -> str:
        calls["flaky"] += 1
        if calls["flaky"] < 3:
            raise ConnectionError(f"refused #{calls['flaky']}")
        return "ok"

    @durable.step(name="boom")
    def boom() -> None:
        raise ValueError("bad data")

    @durable.step(name="hang")
    def hang() -> None:
        raise Crash()

    @durable.task(name="cli.pipeline")
    def pipeline(x: int) -> dict[str, Any]:
        return {"value": fetch(x), "flaky": flaky()}

    @durable.task(name="cli.failing")
    def failing() -> None:
        fetch(1)
        boom()

    @durable.task(name="cli.hanging")
    def hanging() -> None:
        fetch(2)
        hang()

    ids = {k: f"{k}-{uuid.uuid4().hex[:8]}" for k in ("finished", "faulted", "running")}
    try:
        assert pipeline.apply((21,), task_id=ids["finished"]).get() == {"value": 42, "flaky": "ok"}
        assert failing.apply(task_id=ids["faulted"]).failed()
        with pytest.raises(Crash):
            hanging.apply(task_id=ids["running"])
    finally:
        durable.close()
    return ids


def test_durable_runs_show_result_cancel_signal(journal_url: str) -> None:
    url = journal_url
    ids = _durable_runs(url)

    shown = ok(url, "runs", "show", ids["finished"])
    assert (
        "Status   finished" in shown and 'Outcome  finished: {"value": 42, "flaky": "ok"}' in shown
    )
    steps = shown.split("Steps\n")[1].split("\n\n")[0].splitlines()
    assert steps[0].split() == ["POS", "NAME", "KIND", "STATUS", "ATTEMPTS", "RESULT", "/", "ERROR"]
    assert steps[1].split() == ["0", "fetch", "step", "completed", "1", "42"]
    assert steps[2].split() == ["1", "flaky", "step", "completed", "3", '"ok"']
    failed = shown.split("Failed attempts\n")[1].splitlines()
    assert [row.split()[:2] for row in failed[1:]] == [["1", "1"], ["1", "2"]]
    assert "ConnectionError: refused #1" in failed[1] and "ConnectionError: refused #2" in failed[2]

    detail = as_json(url, "runs", "show", ids["finished"])
    assert detail["state"] == "finished" and detail["schedule_run"] is None
    flaky = detail["durable"]["steps"][1]
    assert flaky["attempts"] == 3 and [a["message"] for a in flaky["failed_attempts"]] == [
        "refused #1",
        "refused #2",
    ]
    assert all(UTC_JSON.match(a["at"]) for a in flaky["failed_attempts"])
    assert detail["durable"]["args"] == [21]

    faulted = as_json(url, "runs", "show", ids["faulted"])["durable"]
    assert faulted["status"] == "faulted" and faulted["outcome"]["type"] == "faulted"
    assert faulted["steps"][1]["error"] == {
        "failure": "error",
        "error_type": "ValueError",
        "message": "bad data",
    }
    assert "ValueError: bad data" in ok(url, "runs", "show", ids["faulted"])
    states = {r["run_id"]: r["state"] for r in as_json(url, "runs", "list")}
    assert states == {
        ids["finished"]: "finished",
        ids["faulted"]: "faulted",
        ids["running"]: "running",
    }
    assert [r["run_id"] for r in as_json(url, "runs", "list", "--state", "faulted")] == [
        ids["faulted"]
    ]

    # run result: the value, or exit 5 (faulted), 6 (not ended), 3 (never started).
    assert json.loads(ok(url, "run", "result", ids["finished"])) == {"value": 42, "flaky": "ok"}
    assert as_json(url, "run", "result", ids["finished"]) == {
        "run_id": ids["finished"],
        "outcome": "finished",
        "value": {"value": 42, "flaky": "ok"},
    }
    assert "ValueError: bad data" in fails(url, 5, "run", "result", ids["faulted"])
    as_faulted = cli(url, "run", "result", ids["faulted"], "--json")
    assert as_faulted.exit_code == 5 and json.loads(as_faulted.stdout)["outcome"] == "faulted"
    assert "has not ended" in fails(url, 6, "run", "result", ids["running"], "--timeout", "0.1")
    assert "has started" in fails(url, 3, "run", "result", "never-ran")

    # signal and cancel the running one; an ended run refuses both.
    assert "stored" in ok(url, "run", "signal", ids["running"], "go", "--payload", '{"n": 1}')
    assert as_json(url, "run", "cancel", ids["running"]) == {
        "run_id": ids["running"],
        "cancel_requested": True,
    }
    assert "nothing done" in ok(url, "run", "cancel", ids["running"])
    running = ok(url, "runs", "show", ids["running"])
    assert "Cancel      requested" in running and "Signals     go (1)" in running
    assert "Claimed by" in running
    assert "has ended" in fails(url, 4, "run", "signal", ids["finished"], "go")
    assert "nothing done" in ok(url, "run", "cancel", ids["finished"])
    fails(url, 3, "run", "cancel", "never-ran")
    fails(url, 2, "run", "signal", ids["running"], "go", "--payload", "{nope")


# -- maintenance ---------------------------------------------------------------------------------


def test_index_rebuild_and_db_init(sqlite_url: str, tmp_path: Path) -> None:
    assert ok(sqlite_url, "db", "init").startswith("journal ready at sqlite:///")
    info = as_json(sqlite_url, "db", "init")
    assert "celery_durable_events" in info["tables"] and info["dialect"] == "sqlite"
    ok(sqlite_url, "schedules", "create", "a", "cli.backup", "--every", "1m")
    ok(sqlite_url, "schedules", "create", "b", "cli.backup", "--every", "2m")
    assert ok(sqlite_url, "index", "rebuild").startswith("schedule index rebuilt: 2 schedule(s)")
    rebuilt = as_json(sqlite_url, "index", "rebuild")
    assert rebuilt["schedules"] == 2 and rebuilt["position"] >= 2
    assert [s["id"] for s in as_json(sqlite_url, "schedules", "list")] == ["a", "b"]


def test_db_init_sql_prints_ddl_without_connecting(tmp_path: Path) -> None:
    lite = tmp_path / "never.db"
    text = ok(f"sqlite:///{lite}", "db", "init", "--sql")
    assert text.startswith("-- celery_durable schema for sqlite")
    assert "CREATE TABLE celery_durable_events" in text and "AUTOINCREMENT" in text
    assert not lite.exists(), "--sql must not open the database"
    pg = "postgresql://bob:s3cret@db.invalid:5432/prod?sslpassword=hush"
    text = ok(pg, "db", "init", "--sql")
    assert "BIGSERIAL" in text and "TIMESTAMP WITH TIME ZONE" in text
    assert "INSERT INTO celery_durable_schema" in text
    assert "s3cret" not in text and "hush" not in text and "bob:***@db.invalid" in text
    data = as_json(pg, "db", "init", "--sql")
    assert data["dialect"] == "postgresql" and "s3cret" not in json.dumps(data)


def test_db_init_sql_prints_mysql_and_mariadb_ddl_without_connecting() -> None:
    port = free_port()  # nothing listens: a connection attempt would fail the command
    text = ok(f"mysql+pymysql://bob:s3cret@127.0.0.1:{port}/prod", "db", "init", "--sql")
    assert text.startswith("-- celery_durable schema for mysql")
    assert "mariadb:// URL" in text
    assert "position BIGINT NOT NULL AUTO_INCREMENT" in text and "LONGTEXT" in text
    assert "DATETIME(6)" in text and "ENGINE=InnoDB CHARSET=utf8mb4" in text
    tables = len(schema.metadata.tables) + 1  # and MySQL's celery_durable_locks
    assert text.count("COLLATE=utf8mb4_0900_bin") == text.count("CREATE TABLE") == tables
    assert "CREATE TABLE celery_durable_locks" in text and "s3cret" not in text
    text = ok(f"mariadb://bob@127.0.0.1:{port}/prod", "db", "init", "--sql")
    assert text.startswith("-- celery_durable schema for mariadb")
    assert text.count("COLLATE=utf8mb4_nopad_bin") == text.count("CREATE TABLE") == tables


def test_passwords_never_appear_in_errors() -> None:
    url = "postgresql://bob:s3cret@127.0.0.1:1/prod"
    line = fails(url, 1, "schedules", "list")
    assert "s3cret" not in line and "bob:***@127.0.0.1:1" in line


# -- bad input -----------------------------------------------------------------------------------

BAD_INPUT = [
    # (arguments, exit code, part of the message)
    (["schedules", "create", "x", "cli.backup", "--daily", "25:00", "--zone", "UTC"], 2, "25:00"),
    (
        ["schedules", "create", "x", "cli.backup", "--daily", "02:00", "--zone", "Mars/Base"],
        2,
        "unknown time zone",
    ),
    (["schedules", "create", "x", "cli.backup", "--daily", "02:00"], 2, "needs --zone"),
    (
        ["schedules", "create", "x", "cli.backup", "--weekly", "mon,xyz@08:00", "--zone", "UTC"],
        2,
        "not a day",
    ),
    (
        ["schedules", "create", "x", "cli.backup", "--weekly", "mon", "--zone", "UTC"],
        2,
        "DAYS@HH:MM",
    ),
    (["schedules", "create", "x", "cli.backup", "--every", "10x"], 2, "not a duration"),
    (["schedules", "create", "x", "cli.backup", "--every", "0s"], 2, "between 1 second"),
    (["schedules", "create", "x", "cli.backup", "--cron", "0 25 * * *"], 2, "hour"),
    (["schedules", "create", "x", "cli.backup", "--cron", "0 0 31 2 *"], 2, "never"),
    (["schedules", "create", "x", "cli.backup", "--once", "2026-12-24T18:00"], 2, "offset"),
    (["schedules", "create", "x", "cli.backup", "--once", "christmas"], 2, "ISO 8601"),
    (
        ["schedules", "create", "x", "cli.backup", "--every", "1m", "--input", "{bad"],
        2,
        "--input is not valid JSON",
    ),
    (
        ["schedules", "create", "x", "cli.backup", "--every", "1m", "--args", '{"a": 1}'],
        2,
        "'args' must be a list",
    ),
    (
        ["schedules", "create", "x", "cli.backup", "--every", "1m", "--max-runs", "0"],
        2,
        "at least 1",
    ),
    (["schedules", "create", "x", "cli.backup", "--every", "1m", "--catch-up", "most"], 2, "most"),
    (
        ["schedules", "create", "x", "cli.backup", "--every", "1m", "--cron", "* * * * *"],
        2,
        "only one rule option",
    ),
    (["schedules", "create", "x", "cli.backup"], 2, "give one rule option"),
    (["schedules", "create", "x~y", "cli.backup", "--every", "1m"], 2, "must not contain '~'"),
    (["schedules", "create", "x", "cli.backup", "--every", "1m", "--bogus"], 2, "--bogus"),
    (["schedules", "create", "x", "cli.unknown", "--every", "1m"], 3, "not registered"),
    (["schedules", "show", "ghost"], 3, "not found"),
    (["schedules", "frobnicate"], 2, "frobnicate"),
    (["run", "result", "ghost", "--timeout", "-1"], 2, "--timeout"),
]


@pytest.mark.parametrize(("args", "code", "fragment"), BAD_INPUT, ids=lambda v: str(v)[:40])
def test_bad_input_is_one_error_line_and_a_distinct_exit_code(
    sqlite_url: str, args: list[str], code: int, fragment: str
) -> None:
    ok(sqlite_url, "db", "init")  # a journal that exists: only a command that writes creates one
    assert fragment in fails(sqlite_url, code, *args)


def test_bad_url_is_invalid_input() -> None:
    assert "unsupported journal database" in fails("mysql+asyncmy://x/y", 2, "schedules", "list")


# -- the real entry points -----------------------------------------------------------------------


def _run(command: list[str], url: str) -> subprocess.CompletedProcess[str]:
    env = child_env({"CELERY_DURABLE_URL": url})
    return subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=30, check=False
    )


def _celery() -> list[str]:
    script = Path(sys.executable).with_name("celery")
    return [str(script)] if script.exists() else [sys.executable, "-m", "celery"]


def test_celery_entry_point_reads_the_url_from_the_environment(sqlite_url: str) -> None:
    created = _run(
        [
            *_celery(),
            "-A",
            APP,
            "durable",
            "schedules",
            "create",
            "nightly",
            "cli.backup",
            "--daily",
            "02:00",
            "--zone",
            "Europe/Oslo",
        ],
        sqlite_url,
    )
    assert created.returncode == 0, created.stderr
    assert created.stdout.startswith("schedule 'nightly' created")
    listed = _run([*_celery(), "-A", APP, "durable", "schedules", "list", "--json"], sqlite_url)
    assert listed.returncode == 0, listed.stderr
    assert [s["id"] for s in json.loads(listed.stdout)] == ["nightly"]
    missing = _run([*_celery(), "-A", APP, "durable", "runs", "show", "ghost"], sqlite_url)
    assert missing.returncode == 3
    assert missing.stderr.strip() == "Error: run 'ghost' not found"


def test_python_dash_m_entry_point(sqlite_url: str) -> None:
    module = [sys.executable, "-m", "celery_durable"]
    created = _run(
        [
            *module,
            "-A",
            APP,
            "schedules",
            "create",
            "demo",
            "cli.backup",
            "--every",
            "30s",
            "--json",
        ],
        sqlite_url,
    )
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["schedule"]["rule"]["type"] == "every"
    shown = _run([*module, "-A", APP, "--json", "schedules", "show", "demo"], sqlite_url)
    assert json.loads(shown.stdout)["id"] == "demo"
    # Without -A, the journal $CELERY_DURABLE_URL names is read, as by `celery durable`.
    no_app = _run([*module, "schedules", "list"], sqlite_url)
    assert no_app.returncode == 0 and no_app.stdout.splitlines()[1].startswith("demo  "), (
        no_app.stderr
    )
    bad = _run(
        [
            *module,
            "-A",
            APP,
            "schedules",
            "create",
            "x",
            "cli.backup",
            "--every",
            "1m",
            "--input",
            "{",
        ],
        sqlite_url,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("Error: --input")


def test_runs_show_of_a_scheduled_durable_run(sqlite_url: str) -> None:
    from celery_durable.core.ids import parse_run_id
    from celery_durable.message import ScheduledRun, scheduled_message

    ok(
        sqlite_url,
        "schedules",
        "create",
        "invoices",
        "cli.invoice",
        "--weekly",
        "mon@08:00",
        "--zone",
        "Europe/Oslo",
        "--input",
        '"Ada"',
    )
    run_id = as_json(
        sqlite_url,
        "schedules",
        "backfill",
        "invoices",
        "--start",
        "2026-11-16T00:00Z",
        "--end",
        "2026-11-16T23:00Z",
    )["run_ids"][0]
    assert run_id == "invoices@2026-11-16T07:00:00.0000000Z"
    # A worker of the same project runs it (here: a throwaway app with the same task name).
    app = Celery(f"cli-worker-{uuid.uuid4().hex[:6]}", broker="memory://")
    worker_side = Durable(app, sqlite_url)

    @worker_side.step(name="issue")
    def issue(customer: str, week: str) -> str:
        return f"{customer}-{week}"

    @worker_side.task(name="cli.invoice")
    def invoice(run: ScheduledRun) -> str:
        year, week, _ = run.due.isocalendar()
        return issue(run.input, f"{year}-W{week:02d}")

    schedule_id, due = parse_run_id(run_id)
    args, kwargs, _ = scheduled_message(ScheduledRun(schedule_id, due, "Ada"))
    try:
        assert invoice.apply(args, kwargs, task_id=run_id).get() == "Ada-2026-W47"
    finally:
        worker_side.close()

    shown = ok(sqlite_url, "runs", "show", run_id)
    assert "Schedule  invoices  (weekly on mon at 08:00 Europe/Oslo)" in shown
    assert "Due       2026-11-16T07:00:00Z  (2026-11-16 08:00:00+01:00 Europe/Oslo)" in shown
    assert "State     finished" in shown and "Status    finished (durable run)" in shown
    assert '0    issue  step  completed  1         "Ada-2026-W47"' in shown
    detail = as_json(sqlite_url, "runs", "show", run_id)
    assert detail["schedule_run"]["reason"] == "backfill"
    assert detail["durable"]["outcome"] == {"type": "finished", "value": "Ada-2026-W47"}
    assert json.loads(ok(sqlite_url, "run", "result", run_id)) == "Ada-2026-W47"
    listed = as_json(sqlite_url, "runs", "list", "--schedule", "invoices", "--state", "finished")
    assert [r["run_id"] for r in listed] == [run_id]


def test_schedules_show_reads_its_recent_runs_in_one_query(sqlite_url: str) -> None:
    """The recent runs' states come from one read of the run table, not one per run."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    url = sqlite_url
    ok(url, "schedules", "create", "often", "cli.backup", "--every", "1h")

    def statements() -> int:
        count = 0

        def counted(*_: Any) -> None:
            nonlocal count
            count += 1

        event.listen(Engine, "before_cursor_execute", counted)
        try:
            ok(url, "schedules", "show", "often", "--runs", "20")
        finally:
            event.remove(Engine, "before_cursor_execute", counted)
            # SQLAlchemy marks the class as listened to for good: every later engine would
            # dispatch statement events (and the journal skip its direct path on SQLite).
            Engine._has_events = False
        return count

    counts = []
    for triggers in (2, 10):
        for _ in range(triggers):
            ok(url, "schedules", "trigger", "often")
        counts.append(statements())
    assert counts[0] == counts[1], f"{counts[0]} statements for 2 runs, {counts[1]} for 12"
