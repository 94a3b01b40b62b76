"""``celery durable import redbeat`` against RedBeat itself, in a real Redis (SPEC I2).

Entries are saved with ``RedBeatSchedulerEntry(...).save()``; after the import, each
schedule's next due time is the ``due_at`` RedBeat computes for its entry (the peer is the
oracle), and the options reach the message as RedBeat passes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab, schedule
from click.testing import CliRunner
from redbeat import RedBeatSchedulerEntry
from redbeat.schedules import rrule

from celery_durable import Durable
from celery_durable.cli import main
from celery_durable.importers import redbeat as source
from celery_durable.importers.plan import run_import
from celery_durable.message import IMPORTED
from tests.support.clock import FakeClock

UTC = timezone.utc


def make_app(redis_url: str, prefix: str = "redbeat:") -> Celery:
    app = Celery("redbeat_import", broker="memory://", set_as_current=False)
    app.conf.update(
        timezone="Europe/Oslo",
        redbeat_redis_url=redis_url,
        redbeat_key_prefix=prefix,
        beat_schedule={"static": {"task": "proj.work", "schedule": 60.0}},
    )

    @app.task(name="proj.work", shared=False)
    def work(*args: Any, **kwargs: Any) -> None:  # pragma: no cover - not run
        return None

    @app.task(name="proj.report", shared=False)
    def report(customer: Any) -> None:  # pragma: no cover - not run
        return None

    return app


@pytest.fixture
def saved(redis_url: str) -> tuple[Celery, dict[str, RedBeatSchedulerEntry]]:
    app = make_app(redis_url)
    now = datetime.now(UTC).replace(microsecond=0)
    specs: dict[str, dict[str, Any]] = {
        "every-30s": dict(
            schedule=schedule(timedelta(seconds=30)), last=now - timedelta(seconds=10)
        ),
        "hourly": dict(schedule=schedule(timedelta(hours=1)), last=now - timedelta(minutes=59)),
        "weekdays-9": dict(schedule=crontab(minute=0, hour=9, day_of_week="1-5"), last=now),
        "never-ran": dict(schedule=crontab(minute="*/5")),
        "off": dict(schedule=schedule(timedelta(minutes=5)), enabled=False, last=now),
        "with-options": dict(
            schedule=schedule(timedelta(minutes=10)),
            last=now - timedelta(minutes=1),
            options={"queue": "q1", "priority": 3, "expires": 50, "headers": {"h": 1}},
            args=[1, 2],
            kwargs={"k": "v"},
        ),
        "rrule": dict(schedule=rrule("MINUTELY", dtstart=now)),
        "static": dict(schedule=schedule(timedelta(seconds=60)), last=now),
    }
    entries = {}
    for name, spec in specs.items():
        entry = RedBeatSchedulerEntry(
            name,
            "proj.work",
            spec["schedule"],
            args=spec.get("args"),
            kwargs=spec.get("kwargs"),
            options=spec.get("options") or {},
            enabled=spec.get("enabled", True),
            app=app,
        )
        entry.last_run_at = spec.get("last")
        entries[name] = entry.save()
    return app, entries


@pytest.fixture
def durable(sqlite_url: str, redis_url: str) -> Iterator[Durable]:
    found = Durable(make_app(redis_url), sqlite_url, clock=FakeClock(datetime.now(UTC)))
    yield found
    found.close()


def test_next_due_times_equal_redbeats(
    durable: Durable, saved: tuple[Celery, dict[str, RedBeatSchedulerEntry]], redis_url: str
) -> None:
    app, _ = saved
    found, unreadable = source.read_entries(redis_url, "redbeat:")
    assert set(unreadable) == {"rrule"} and "rrule" in unreadable["rrule"]
    result = run_import(
        durable.runtime,
        durable.schedules,
        found,
        source=source.SOURCE,
        unreadable=unreadable,
        where_from="redbeat:",
        skip_invalid=True,
    )
    now = durable.runtime.now()
    for name in ("every-30s", "hourly", "weekdays-9", "with-options"):
        entry = RedBeatSchedulerEntry.from_key(f"redbeat:{name}", app=app)
        # When RedBeat's tick sends it: not due yet, due in `wait` seconds from its now.
        # (Its zset score, ``due_at``, is last run + that wait: right only just after a run.)
        moment = entry.schedule.now()
        is_due, wait = entry.is_due()
        view = durable.schedules.state(name)
        assert not is_due and view is not None and view.next_due is not None
        assert abs(view.next_due - (moment + timedelta(seconds=wait))) < timedelta(
            milliseconds=50
        ), name
    # An entry that never ran is due at once, in both.
    never = RedBeatSchedulerEntry.from_key("redbeat:never-ran", app=app)
    assert never.last_run_at is None and never.is_due()[0]
    view = durable.schedules.state("never-ran")
    assert view is not None and view.next_due is not None and view.next_due <= now
    assert durable.schedules.state("off").paused
    options = durable.schedules.state("with-options").options
    assert options["queue"] == "q1" and options["priority"] == 3 and options["expires"] == 50
    assert options["args"] == [1, 2] and options["kwargs"] == {"k": "v"}
    assert options["headers"] == {"h": 1}
    assert options[IMPORTED] == {"source": "redbeat", "name": "with-options", "where": "redbeat:"}
    assert {i.name: i.action for i in result.items}["rrule"] == "refused"
    again = run_import(
        durable.runtime, durable.schedules, found, source=source.SOURCE, where_from="redbeat:"
    )
    assert {i.action for i in again.items} == {"unchanged"}
    # An entry deleted from Redis since: its schedule is paused, with the reason.
    RedBeatSchedulerEntry.from_key("redbeat:hourly", app=app).delete()
    found, _ = source.read_entries(redis_url, "redbeat:")
    third = run_import(
        durable.runtime, durable.schedules, found, source=source.SOURCE, where_from="redbeat:"
    )
    assert [(i.schedule_id, i.paused) for i in third.removed] == [
        ("hourly", "removed from redbeat")
    ]
    assert durable.schedules.state("hourly").paused


def test_the_cli_imports_redbeat(
    saved: tuple[Celery, dict[str, RedBeatSchedulerEntry]], redis_url: str, sqlite_url: str
) -> None:
    runner = CliRunner()
    args = ["--url", sqlite_url, "import", "redbeat", "--redis-url", redis_url]
    refused = runner.invoke(main, ["-A", "tests.importers.test_import_redbeat:cli_app", *args])
    assert refused.exit_code == 2, refused.output
    assert "rrule" in refused.output and "nothing stored" in refused.output
    done = runner.invoke(
        main,
        ["-A", "tests.importers.test_import_redbeat:cli_app", *args, "--skip-invalid", "--json"],
    )
    assert done.exit_code == 0, done.output
    assert '"create": 6' in done.output and '"refused": 1' in done.output
    assert '"skip": 1' in done.output  # "static" comes from beat_schedule: -S durable has it


def test_an_entry_whose_args_cannot_call_its_task_is_refused(
    durable: Durable, redis_url: str
) -> None:
    """RedBeat's beat fails every send of ``report(customer)`` with four args (Celery checks
    the call); the import refuses the entry with the test ``schedules create`` uses (I2)."""
    from celery.beat import Scheduler, SchedulingError

    app = make_app(redis_url, prefix="rb-args:")
    entry = RedBeatSchedulerEntry(
        "bad-args", "proj.report", schedule(timedelta(hours=1)), args=[1, 2, 3, 4], app=app
    ).save()
    with pytest.raises(SchedulingError, match="positional"):
        Scheduler(app, lazy=True).apply_async(entry, advance=False)
    error = refusal(durable, redis_url, "rb-args:")
    assert error.startswith(
        "redbeat entry 'bad-args': task 'proj.report' cannot be called with the redbeat "
        "entry's args and kwargs: "
    ), error
    assert durable.schedules.state("bad-args") is None


def refusal(durable: Durable, redis_url: str, prefix: str) -> str:
    """The error of the one entry under ``prefix``, which the import must refuse."""
    found, unreadable = source.read_entries(redis_url, prefix)
    assert not unreadable
    result = run_import(
        durable.runtime, durable.schedules, found, source=source.SOURCE, where_from=prefix
    )
    [item] = result.items
    assert item.action == "refused" and item.error is not None and not result.applied
    return item.error


def test_args_for_a_durable_task_are_refused_not_dropped(durable: Durable, redis_url: str) -> None:
    """A durable task is sent its ScheduledRun only: an entry's args would never reach it."""

    @durable.task(name="proj.durable_report", shared=False)
    def durable_report(run: Any) -> None:  # pragma: no cover - not run
        return None

    app = make_app(redis_url, prefix="rb-durable:")
    RedBeatSchedulerEntry(
        "durable-args", "proj.durable_report", schedule(timedelta(hours=1)), args=[1], app=app
    ).save()
    error = refusal(durable, redis_url, "rb-durable:")
    assert error.startswith(
        "redbeat entry 'durable-args': task 'proj.durable_report' is a durable task"
    ), error


cli_app = make_app("redis://127.0.0.1:1/0")  # the tests give --redis-url
