"""The example's jobs under the plugin: catch-up after downtime and crash recovery."""

from __future__ import annotations

from datetime import datetime, timezone

from example_project import app
from example_project.schedules import ensure_schedules


def test_nightly_backup_runs_once_after_three_nights_down(durable):
    ensure_schedules(durable.durable)
    durable.downtime(days=3)  # the nights of the 3rd, 4th and 5th pass with nothing running
    runs = [r for r in durable.schedules.runs("nightly-backup") if r.state != "skipped"]
    assert [r.due for r in runs] == [datetime(2026, 11, 5, 1, 0, tzinfo=timezone.utc)]
    assert len(app.backup_store.keys()) == 1


def test_every_missed_monday_is_invoiced_once(durable):
    ensure_schedules(durable.durable)
    durable.downtime(days=15)
    assert app.billing.numbers() == ["Ada-2026-W46", "Ada-2026-W47"]
    durable.advance(days=7)
    assert app.billing.numbers() == ["Ada-2026-W46", "Ada-2026-W47", "Ada-2026-W48"]


def test_backup_resumes_after_a_crash_without_listing_again(durable):
    ensure_schedules(durable.durable)
    with durable.crash_after_step("list_files"):
        run_id = durable.schedules.trigger("nightly-backup")
        durable.run_until_idle()
    assert durable.run_ended(run_id) is None  # the delivery died after list_files
    durable.advance(minutes=10)  # the run lease passes; the dispatcher sends it again (D8)
    assert durable.result(run_id) == {"folder": "documents", "files": 1, "stored": True}
    assert durable.step_calls(run_id) == {"list_files": 1, "store_snapshot": 1}
