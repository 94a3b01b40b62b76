"""``celery durable schedules … --start-deadline/--jitter/--catch-up-window`` and missed runs in
``runs list`` (SPEC §5d: P1–P3)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from celery_durable import Durable
from celery_durable.core.schedule_aggregate import MarkMissed
from celery_durable.worker.run_ends import MISSED_IN_QUEUE
from tests.cli.test_cli import as_json, fails, ok
from tests.e2e.cli_app import app
from tests.support.clock import FakeClock

POLICIES = ("start_deadline", "jitter", "catch_up_window")


def test_create_show_and_change_the_timing_policies(journal_url: str) -> None:
    url = journal_url
    ok(url, "schedules", "create", "s", "cli.backup", "--every", "1m", "--catch-up", "all",
       "--start-deadline", "30s", "--jitter", "10", "--catch-up-window", "1h")  # fmt: skip
    shown = ok(url, "schedules", "show", "s")
    assert "Start deadline   30s" in shown
    assert "Jitter           10s" in shown
    assert "Catch-up window  3600s" in shown
    data = as_json(url, "schedules", "show", "s")
    assert {k: data[k] for k in POLICIES} == {
        "start_deadline": 30.0,
        "jitter": 10.0,
        "catch_up_window": 3600.0,
    }
    # Not given: kept; "none": turned off.
    changed = as_json(url, "schedules", "change", "s", "--jitter", "none", "--start-deadline", "1m")
    assert {k: changed["schedule"][k] for k in POLICIES} == {
        "start_deadline": 60.0,
        "jitter": None,
        "catch_up_window": 3600.0,
    }
    line = fails(url, 2, "schedules", "change", "s", "--catch-up", "none")
    assert "catch_up_window applies to CatchUp.LATEST and CatchUp.ALL" in line
    line = fails(url, 2, "schedules", "change", "s", "--start-deadline", "soon")
    assert "--start-deadline: 'soon' is not a duration" in line
    line = fails(url, 2, "schedules", "create", "t", "cli.backup", "--every", "1m",
                 "--start-deadline", "5s", "--jitter", "5s")  # fmt: skip
    assert "jitter (5 s) must be shorter than start_deadline (5 s)" in line
    plain = as_json(url, "schedules", "create", "plain", "cli.backup", "--every", "1m")
    assert {k: plain["schedule"][k] for k in POLICIES} == dict.fromkeys(POLICIES)
    assert "Start deadline" not in ok(url, "schedules", "show", "plain")


def test_runs_list_shows_a_missed_run_with_its_reason(journal_url: str) -> None:
    url = journal_url
    ok(url, "schedules", "create", "m", "cli.backup", "--every", "1m", "--start-deadline", "5s")
    created = as_json(url, "schedules", "show", "m")["created_at"]
    start = datetime.fromisoformat(created.replace("Z", "+00:00")).astimezone(timezone.utc)
    clock = FakeClock(start + timedelta(minutes=1))
    durable = Durable(app, url, clock=clock)
    try:
        durable.dispatcher().tick()  # decided and sent (in-memory broker)
        [run] = durable.schedules.runs("m")
        clock.advance(seconds=10)
        # What a worker records when the message reaches it after the deadline.
        durable._store.execute(
            "m", lambda now: MarkMissed(due=run.due, reason=MISSED_IN_QUEUE, now=now, sent=True)
        )
    finally:
        durable.close()
    table = ok(url, "runs", "list", "--schedule", "m")
    header, row = table.splitlines()
    assert header.split()[-2:] == ["TASK", "REASON"]
    assert row.split()[1] == "missed" and row.endswith(MISSED_IN_QUEUE)
    [listed] = as_json(url, "runs", "list", "--state", "missed")
    assert (listed["run_id"], listed["state"], listed["error"]) == (
        run.run_id,
        "missed",
        MISSED_IN_QUEUE,
    )
    assert MISSED_IN_QUEUE in ok(url, "schedules", "show", "m")
