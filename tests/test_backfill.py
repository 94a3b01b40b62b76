"""A backfill that decides nothing says why (SPEC D9), in the API, the CLI text and ``--json``.

Over a future range, or over a range entirely before an ``Every`` schedule's first due time,
``celery durable schedules backfill`` printed ``0 run(s) decided`` and nothing else. The API
still returns a list of run IDs (equal to ``[]`` when empty: callers that compare or iterate
keep working); its ``reason`` attribute, the text line and the JSON ``reason`` field say why.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery

from celery_durable import Daily, Durable, Every
from celery_durable.core.backfill import Backfilled
from tests.cli.test_cli import cli
from tests.support.clock import T0, FakeClock

UTC = timezone.utc
HOUR = timedelta(hours=1)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def app() -> Celery:
    app = Celery("backfill_tests", broker="memory://", set_as_current=False)

    @app.task(name="backup", shared=False)
    def backup(folder: str) -> None:  # pragma: no cover - never run here
        return None

    return app


@pytest.fixture
def journal_url(sqlite_url: str) -> str:
    """SQLite alone: why a backfill decides nothing does not depend on the database."""
    return sqlite_url


def test_a_future_range_decides_nothing_and_says_why(durable: Durable, clock: FakeClock) -> None:
    durable.schedules.create("hourly", "backup", "/srv", Every(HOUR))
    clock.advance(hours=5)
    found = durable.schedules.backfill("hourly", T0 + timedelta(days=1), T0 + timedelta(days=2))
    assert found == [] and isinstance(found, list) and isinstance(found, Backfilled)
    assert found.reason == (
        "the range starts at 2026-11-03T12:00:00Z, after now (2026-11-02T17:00:00Z): due times "
        "still to come are the dispatcher's, decided when they are due"
    ), found.reason


def test_a_range_before_an_every_schedules_first_due_time_says_so(
    durable: Durable, clock: FakeClock
) -> None:
    durable.schedules.create("hourly", "backup", "/srv", Every(HOUR))
    clock.advance(hours=5)
    found = durable.schedules.backfill(
        "hourly", T0 - timedelta(hours=6), T0 + timedelta(minutes=30)
    )
    assert found == []
    assert found.reason == (
        "the range ends before the schedule's first due time 2026-11-02T13:00:00Z: an Every "
        "rule is due one interval after its anchor, the schedule's creation or last change "
        "(2026-11-02T12:00:00Z)"
    ), found.reason


def test_other_empty_backfills_say_why_and_a_full_one_has_no_reason(
    durable: Durable, clock: FakeClock
) -> None:
    durable.schedules.create("nightly", "backup", "/srv", Daily("02:00", "UTC"))
    clock.advance(days=3)
    start, end = T0 - timedelta(days=2), T0
    done = durable.schedules.backfill("nightly", start, end)
    assert len(done) == 2 and done.reason is None
    again = durable.schedules.backfill("nightly", start, end)
    assert again == [] and again.reason == (
        "all 2 due time(s) of the range were decided already (repeating a backfill adds nothing)"
    )
    none = durable.schedules.backfill("nightly", T0 + timedelta(hours=1), T0 + timedelta(hours=2))
    assert none.reason is not None
    assert none.reason.startswith("the range starts after 2026-11-02T12:00:00Z, as far as the ")
    quiet = durable.schedules.backfill("nightly", T0 - timedelta(hours=3), T0 - timedelta(hours=2))
    assert quiet.reason == (
        "the rule has no due time from 2026-11-02T09:00:00Z to 2026-11-02T10:00:00Z"
    )


def test_the_cli_prints_the_reason_and_json_carries_it(sqlite_url: str) -> None:
    created = cli(sqlite_url, "schedules", "create", "h", "cli.backup", "--every", "1h")
    assert created.exit_code == 0, created.stderr
    future = ("--start", "2999-01-01T00:00Z", "--end", "2999-01-02T00:00Z")
    text = cli(sqlite_url, "schedules", "backfill", "h", *future)
    assert text.exit_code == 0 and text.stdout == "", (text.stdout, text.stderr)
    assert text.stderr.startswith(
        "0 run(s) decided: the range starts at 2999-01-01T00:00:00Z, after now ("
    ), text.stderr
    before = ("--start", "2020-01-01T00:00Z", "--end", "2020-01-02T00:00Z")
    text = cli(sqlite_url, "schedules", "backfill", "h", *before)
    assert text.stderr.startswith(
        "0 run(s) decided: the range ends before the schedule's first due time "
    ), text.stderr
    data = json.loads(cli(sqlite_url, "schedules", "backfill", "h", *before, "--json").stdout)
    assert data["run_ids"] == [] and data["reason"].startswith("the range ends before the")
    assert set(data) == {"action", "schedule_id", "run_ids", "reason"}
    daily = cli(sqlite_url, "schedules", "create", "d", "cli.backup", "--cron", "0 2 * * *")
    assert daily.exit_code == 0, daily.stderr
    now = datetime.now(UTC)
    past = ("--start", (now - timedelta(days=3)).isoformat(), "--end", now.isoformat())
    data = json.loads(cli(sqlite_url, "schedules", "backfill", "d", *past, "--json").stdout)
    assert len(data["run_ids"]) >= 2 and data["reason"] is None
