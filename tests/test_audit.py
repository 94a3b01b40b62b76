"""Who changed a schedule and why (O5): ``by``/``reason`` on every command, stored in the
events, read back by ``schedules.history`` — also from a journal written before they existed."""

from __future__ import annotations

import re
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery

from celery_durable import Durable, Every, InvalidSchedule
from celery_durable.core.schedule_events import SchedulePaused, from_data, to_data
from tests.data.make_journal_v1 import BASE, FIXTURE, Clock, build
from tests.support.clock import T0, FakeClock


@pytest.fixture
def app() -> Celery:
    app = Celery("audit_tests", broker="memory://", set_as_current=False)

    @app.task(name="backup", shared=False)
    def backup(folder: str = "/srv") -> str:  # pragma: no cover - never run here
        return folder

    return app


def test_every_command_stores_who_and_why(durable: Durable, clock: FakeClock) -> None:
    s = durable.schedules
    s.create("nightly", "backup", "/srv", Every(timedelta(hours=1)), by="alice", reason="new")
    clock.advance(minutes=1)
    s.change(
        "nightly", "backup", "/data", Every(timedelta(hours=2)), by="bob", reason="bigger disk"
    )
    clock.advance(minutes=1)
    s.pause("nightly", by="carol", reason="maintenance")
    clock.advance(minutes=1)
    s.resume("nightly", by="carol")
    clock.advance(minutes=1)
    s.delete("nightly", reason="not needed")
    history = s.history("nightly")
    assert [(h.action, h.by, h.reason, h.at) for h in history] == [
        ("created", "alice", "new", T0),
        ("changed", "bob", "bigger disk", T0 + timedelta(minutes=1)),
        ("paused", "carol", "maintenance", T0 + timedelta(minutes=2)),
        ("resumed", "carol", None, T0 + timedelta(minutes=3)),
        ("deleted", None, "not needed", T0 + timedelta(minutes=4)),
    ]
    created, changed = history[0].changes, history[1].changes
    assert created["task"] == (None, "backup") and created["input"] == (None, "/srv")
    assert set(changed) == {"input", "rule"}
    assert changed["input"] == ("/srv", "/data")
    assert history[2].changes == {"paused": (False, True)}
    assert history[4].changes == {"deleted": (False, True)}


def test_run_events_are_not_history_and_no_op_commands_store_nothing(
    durable: Durable, clock: FakeClock
) -> None:
    s = durable.schedules
    s.create("h", "backup", None, Every(timedelta(minutes=1)), by="alice")
    s.create("h", "backup", None, Every(timedelta(minutes=1)), by="mallory")  # A1: same content
    clock.advance(minutes=3)
    dispatcher = durable.dispatcher()
    dispatcher.tick()
    dispatcher.close()
    s.pause("h", by="bob")
    s.pause("h", by="mallory")  # A3: a no-op stores nothing
    assert [(h.action, h.by) for h in s.history("h")] == [("created", "alice"), ("paused", "bob")]
    assert s.history("never-created") == []


@pytest.mark.parametrize(
    ("by", "reason", "message"),
    [
        ("", None, "by must not be blank"),
        ("eve\nINFO forged", None, "by contains the control or format character U+000A"),
        (None, "\x1b[31mred", "reason contains the control or format character U+001B"),
        (None, "x" * 1001, "reason has 1001 characters; at most 1000 allowed"),
        (42, None, "by must be a str, not int"),
    ],
)
def test_bad_audit_fields_are_refused_before_anything_is_stored(
    durable: Durable, by: object, reason: object, message: str
) -> None:
    durable.schedules.create("a", "backup", None, Every(timedelta(minutes=1)))
    head = durable.journal.head()
    for command in (
        lambda: durable.schedules.pause("a", by=by, reason=reason),  # type: ignore[arg-type]
        lambda: durable.schedules.delete("a", by=by, reason=reason),  # type: ignore[arg-type]
        lambda: durable.schedules.create(
            "b",
            "backup",
            None,
            Every(timedelta(minutes=1)),
            by=by,  # type: ignore[arg-type]
            reason=reason,  # type: ignore[arg-type]
        ),
    ):
        with pytest.raises(InvalidSchedule, match=re.escape(message)):
            command()
    assert durable.journal.head() == head


def test_the_json_form_leaves_out_absent_fields_and_reads_old_events() -> None:
    """SPEC §9: ``by``/``reason`` are optional fields of format 1."""
    old = {"v": 1, "at": "2026-11-02T12:00:00.000000Z"}
    event = from_data("SchedulePaused", old)
    assert isinstance(event, SchedulePaused) and event.by is None and event.reason is None
    assert to_data(event) == old
    new = from_data("SchedulePaused", {**old, "by": "alice", "reason": "why"})
    assert to_data(new) == {**old, "reason": "why", "by": "alice"}


def test_history_of_a_journal_written_before_audit(tmp_path: Path) -> None:
    copy = tmp_path / "journal-v1.sqlite"
    shutil.copyfile(FIXTURE, copy)
    durable, _ = build(f"sqlite:///{copy}", Clock(BASE + timedelta(minutes=66)))
    try:
        history = durable.schedules.history("changed-weekly")
        assert [(h.action, h.by, h.reason) for h in history] == [
            ("created", None, None),
            ("changed", None, None),
        ]
        assert {"input", "rule", "catch_up"} <= set(history[1].changes)
        paused = durable.schedules.history("paused-daily")
        assert [h.action for h in paused] == ["created", "paused"]
        durable.schedules.resume("paused-daily", by="ops", reason="back")
        assert durable.schedules.history("paused-daily")[-1].by == "ops"
    finally:
        durable.close()


def test_triggers_and_backfills_carry_who_and_why(durable: Durable, clock: FakeClock) -> None:
    s = durable.schedules
    s.create("t", "backup", None, Every(timedelta(minutes=10)), by="alice")
    clock.advance(hours=1)
    dispatcher = durable.dispatcher()
    dispatcher.tick()  # decides 13:00 by the rule: not a command, not in the history
    dispatcher.close()
    clock.advance(seconds=1)  # (a trigger at 13:00 would be the rule's run: nothing stored)
    run = s.trigger("t", by="bob", reason="month end")
    clock.advance(seconds=1)
    ids = s.backfill(
        "t", T0 + timedelta(minutes=10), T0 + timedelta(minutes=40), by="carol", reason="outage"
    )
    assert len(ids) == 4  # 12:10 ... 12:40, dropped by CatchUp.LATEST
    clock.advance(seconds=1)
    s.backfill("t", T0 + timedelta(minutes=50), T0 + timedelta(minutes=50))  # a second one
    history = s.history("t")
    assert [(h.action, h.by, h.reason) for h in history] == [
        ("created", "alice", None),
        ("triggered", "bob", "month end"),
        ("backfilled", "carol", "outage"),
        ("backfilled", None, None),
    ]
    assert history[1].changes == {"run": (None, run)}
    assert history[2].changes == {"runs": (None, {"first": ids[0], "last": ids[-1], "count": 4})}
    assert history[3].changes["runs"][1]["count"] == 1
    # The run keeps its kind of decision; the reason given is its note.
    [triggered] = [r for r in s.runs("t") if r.run_id == run]
    assert triggered.reason == "trigger"
    with pytest.raises(InvalidSchedule, match="by must not be blank"):
        s.trigger("t", by=" ")
