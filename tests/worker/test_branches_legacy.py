"""Journals written before the group markers still replay (W9, SPEC §9).

``tests/data/journal-branches-v1.sqlite`` was written by the code of 2026-12-05, which stored
nothing at a ``parallel``/``gather`` call's own position and only the winner at a race's
(``tests/data/make_journal_branches_v1.py`` says what each run holds). The current code
continues each run: stored steps do not run again, results come back in order, the race keeps
its stored winner, and the replay check finds every run on its stored path.
"""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from celery_durable.core.ids import run_stream
from celery_durable.core.run_aggregate import fold
from celery_durable.worker.replay import check_report
from tests.data.make_journal_branches_v1 import FIXTURE, Knobs, build

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def legacy(tmp_path: Path) -> Any:
    copy = tmp_path / "journal.sqlite"
    shutil.copyfile(FIXTURE, copy)
    knobs = Knobs()
    knobs.failed.set()  # replays never wait for the other branch
    # Long after the crashed deliveries' leases (they were written with the real clock).
    later = datetime.now(timezone.utc) + timedelta(days=1)
    durable, tasks = build(f"sqlite:///{copy}", knobs, clock=lambda: later)
    yield durable, tasks, knobs
    durable.close()


def positions(durable: Any, run_id: str) -> dict[Any, Any]:
    state = fold(durable.journal.read_stream(run_stream(run_id)))
    return {p: (r.name, r.kind, r.status) for p, r in state.positions.items()}


def test_the_fixture_holds_the_old_form(legacy: Any) -> None:
    durable, _, _ = legacy
    assert 0 not in positions(durable, "par-stopped"), "no marker at the call's position"
    assert positions(durable, "race-won")[0] == ("race", "race", "completed")
    assert set(positions(durable, "nested")) == {"0.1.0", "0.0.0.0.0", "0.0.0.1.0"}


RUNS = ("par-stopped", "par-stopped-on", "race-won", "gather-mid", "nested")


def test_old_runs_continue_with_the_current_code(legacy: Any) -> None:
    durable, tasks, knobs = legacy
    knobs.ran.clear()
    assert tasks["par-stopped-on"].apply(task_id="par-stopped-on").get() == [
        "0.1.0",
        "mark",
        "finished",
    ]
    # par-stopped-on's group holds a stored failure and the body went on past it: it had
    # stopped, so 'after_slow' (never started the first time) does not start now.
    assert knobs.ran == ["finish"]
    assert tasks["race-won"].apply(task_id="race-won").get() == ["quick0", "finished"]
    assert tasks["gather-mid"].apply(task_id="gather-mid").get() == [[0, 2, 4], "finished"]
    assert tasks["nested"].apply(task_id="nested").get() == [[[1, 2], 3], "finished"]
    assert tasks["par-finished"].apply(task_id="par-finished").get() == [4, 5]
    # par-stopped's journal does not show whether its group had ended (the crash came in the
    # very next step), so 'after_slow' may start, as before the markers; all else replays.
    assert tasks["par-stopped"].apply(task_id="par-stopped").get() == ["0.1.0", "finished"]
    assert sorted(set(knobs.ran) - {"after_slow"}) == ["double1", "double2", "finish"]
    assert knobs.ran.count("finish") == 5
    assert not {"slow", "boom", "quick0", "quick1", "double0", "leaf1", "leaf4"} & set(knobs.ran)
    # The old groups were not given a start marker: their journals keep the old form.
    assert 0 not in positions(durable, "gather-mid")
    assert "0.0.0" not in positions(durable, "nested")


def test_the_replay_check_finds_old_runs_on_their_stored_path(legacy: Any) -> None:
    durable, tasks, knobs = legacy
    found, old, cannot = check_report(durable.runtime, run_id="par-finished")
    assert (found, old, cannot) == ([], [], [])
    for run_id in RUNS:
        found, _, _ = check_report(durable.runtime, run_id=run_id)
        assert found == [], (run_id, found)  # still going: agrees so far
    for run_id in RUNS:
        tasks[run_id].apply(task_id=run_id).get()
    knobs.ran.clear()
    assert check_report(durable.runtime) == ([], [], [])
    assert knobs.ran == [], "the check runs no step"
