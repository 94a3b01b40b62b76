"""The run read model (``core/read_models.py``) and the presenter (``presentation.py``): pure,
plain values in, words and texts out; no journal, no server."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from celery_durable.core.journal import StoredEvent
from celery_durable.core.outcomes import Cancelled, Faulted, Finished
from celery_durable.core.read_models import (
    ENDED,
    NOT_STARTED,
    RunView,
    ending_of,
    project_run,
    run_outcome,
)
from celery_durable.errors import InvalidSchedule
from celery_durable.presentation import (
    NotATime,
    format_duration,
    local_text,
    parse_instant,
    run_detail,
    short,
    utc_label,
    utc_text,
)

UTC = timezone.utc
DUE = datetime(2026, 11, 2, 2, 0, tzinfo=UTC)


def run(state: str, **more: Any) -> RunView:
    return RunView(run_id="s@2026-11-02T02:00:00Z", schedule_id="s", due=DUE, state=state, **more)


def event(version: int, type_: str, **data: Any) -> StoredEvent:
    return StoredEvent(
        position=version, stream="run/x", version=version, type=type_, data=data, recorded_at=DUE
    )


# -- the projection ---------------------------------------------------------------------------


@pytest.mark.parametrize("state", NOT_STARTED)
def test_a_run_that_never_started_keeps_its_word_and_reason_whatever_its_row_says(
    state: str,
) -> None:
    for status in (None, "missed", "failed_to_start", "queued"):
        shown = project_run(run(state, error="start deadline passed"), status)
        assert (shown.state, shown.stage) == (state, state)
        assert shown.error == "start deadline passed" and shown.ending is None


def test_without_a_row_the_reported_outcome_else_the_schedules_word() -> None:
    assert project_run(run("decided")).state == "decided"
    assert project_run(run("started")).state == "started"
    # No run-table row to ask: the outcome the schedule's events reported (RunEndReported).
    reported = project_run(run("started", outcome="finished"))
    assert (reported.state, reported.stage, reported.outcome) == ("finished", "started", "finished")


def test_the_rows_status_is_the_word_and_a_decided_run_with_a_row_was_sent() -> None:
    shown = project_run(run("decided"), "running")
    assert (shown.state, shown.stage, shown.outcome) == ("running", "started", "running")
    shown = project_run(run("started"), "suspended", Finished(1))  # no ending before the row's
    assert (shown.state, shown.outcome, shown.ending) == ("suspended", "suspended", None)


@pytest.mark.parametrize(
    ("status", "ending", "word"),
    [
        ("finished", Finished({"n": 1}), "finished"),
        ("faulted", Faulted("disk full", "RuntimeError"), "faulted"),
        ("parked", Faulted("position 3", "celery_durable.errors.RunParked", "parked"), "parked"),
        ("cancelled", Cancelled(), "cancelled"),
    ],
)
def test_an_ended_run_shows_its_ending(status: str, ending: Any, word: str) -> None:
    assert status in ENDED
    shown = project_run(run("started", error="ignored"), status, ending)
    assert (shown.state, shown.stage, shown.outcome) == (status, "started", word)
    assert shown.ending == ending and shown.error is None


def test_an_ended_row_whose_ending_is_not_found_shows_the_rows_word_without_detail() -> None:
    shown = project_run(run("started"), "finished", None)
    assert (shown.outcome, shown.ending, run_detail(shown)) == ("finished", None, "")


def test_run_outcome_takes_the_rows_status_for_a_started_run_only() -> None:
    assert run_outcome(run("started"), "running") == "running"
    assert run_outcome(run("started", outcome="finished"), None) == "finished"
    assert run_outcome(run("decided"), "running") is None
    assert run_outcome(run("skipped"), "finished") is None


def test_ending_of_reads_the_ending_events() -> None:
    assert ending_of([]) is None
    assert ending_of([event(3, "RunFinished", result=[1, 2])]) == Finished([1, 2])
    faulted = ending_of([event(3, "RunFaulted", message="boom", error_type="KeyError")])
    assert isinstance(faulted, Faulted) and (faulted.error, faulted.error_type) == (
        "boom",
        "KeyError",
    )
    parked = ending_of([event(5, "RunParked", message="position 3: expected a, found b")])
    assert isinstance(parked, Faulted) and parked.kind == "parked"
    assert ending_of([event(2, "RunCancelled")]) == Cancelled()


# -- the presenter ---------------------------------------------------------------------------


def test_short_escapes_control_characters_and_bounds_the_length() -> None:
    assert short("backed up /srv") == '"backed up /srv"'
    text = short("\x1b[2J\u202e" + "x" * 500, limit=40)
    assert len(text) == 40 and text.endswith("…")
    assert text.isprintable() and "\\u001b" in text and "\\u202e" in text


def test_run_detail_of_each_ending_and_of_a_run_that_did_not_start() -> None:
    def detail(status: str, ending: Any) -> str:
        return run_detail(project_run(run("started"), status, ending))

    assert detail("finished", Finished("ok")) == '"ok"'
    assert detail("finished", Finished(None)) == ""
    assert detail("faulted", Faulted("disk full", "RuntimeError")) == "RuntimeError: disk full"
    assert detail("cancelled", Cancelled()) == ""
    assert run_detail(project_run(run("missed", error="deadline"))) == "deadline"


def test_times_for_tables_and_pages() -> None:
    assert utc_text(DUE) == "2026-11-02T02:00:00Z" and utc_text(None) == "-"
    assert utc_label(DUE) == "2026-11-02 02:00:00 UTC" and utc_label(None) == "—"
    assert local_text(DUE, "Europe/Oslo") == "2026-11-02 03:00:00+01:00 Europe/Oslo"
    with pytest.raises(InvalidSchedule, match="unknown time zone 'Mars/Olympus'"):
        local_text(DUE, "Mars/Olympus")


def test_parse_instant_reads_offsets_z_and_local_times() -> None:
    assert parse_instant("2026-11-02T02:00Z", None) == DUE
    assert parse_instant(" 2026-11-02 03:00 ", "Europe/Oslo") == DUE
    assert parse_instant("2026-11-02T03:00+01:00", None) == DUE
    with pytest.raises(NotATime) as refused:
        parse_instant("2026-11-02 03:00", None)
    assert refused.value.reason == "offset"
    with pytest.raises(NotATime) as refused:
        parse_instant("tomorrow", "UTC")
    assert refused.value.reason == "syntax"
    with pytest.raises(InvalidSchedule):
        parse_instant("2026-11-02 03:00", "Mars/Olympus")


def test_format_duration_is_what_parse_duration_reads() -> None:
    assert format_duration(timedelta(seconds=5400)) == "1h30m"
    assert format_duration(timedelta(days=2, seconds=5)) == "2d5s"
    assert format_duration(timedelta(0)) == "0s"
    assert format_duration(timedelta(seconds=2.5)) == "2.5s"
