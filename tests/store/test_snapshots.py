"""Snapshots (O2) and retention (O1) on real journals.

* Pure, by property: folding a snapshot of any prefix (through its JSON form) and then the rest
  equals folding everything, also when the run events of the prefix were removed and the
  reader meets the gap (``fold_stream``).
* On SQLite, PostgreSQL and MySQL: after ``durable.prune()`` every reader (``state()``,
  ``list()``, the dispatcher's start-up, an index rebuild) sees the same states as before, a
  backfill over the pruned days decides nothing, and ``--dry-run`` counts without removing.
"""

from __future__ import annotations

from datetime import timedelta, timezone

import pytest
import sqlalchemy as sa
from celery import Celery
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_durable import Durable, Every, Overlap
from celery_durable.core.journal import StoredEvent
from celery_durable.core.schedule_aggregate import (
    Change,
    Create,
    DecideDue,
    MarkEnded,
    MarkStarted,
    Pause,
    Resume,
    ScheduleState,
    decide,
    fold_all,
)
from celery_durable.core.schedule_events import RUN_RECORD_TYPES, Content, from_data, to_data
from celery_durable.store.journal.schema import events as events_table
from celery_durable.store.journal.schema import snapshots as snapshots_table
from celery_durable.store.snapshots import fold_stream
from tests.support.clock import T0, FakeClock

UTC = timezone.utc


def content(minutes: int, overlap: Overlap = Overlap.ALLOW) -> Content:
    return Content(
        task="backup", input="/srv", rule=Every(timedelta(minutes=minutes)), overlap=overlap
    )


# Pure: fold(all) == fold(snapshot(prefix)) + rest ------------------------------------------------

STEP = st.sampled_from(["tick", "tick", "tick", "start", "end", "pause", "resume", "change"])


def history(steps: list[str], overlap: Overlap) -> list[StoredEvent]:
    """The stored events a schedule gets from a sequence of commands (refused ones skipped)."""
    state = ScheduleState(schedule_id="s")
    now = T0
    stored: list[StoredEvent] = []

    def do(command: object) -> None:
        nonlocal state
        try:
            events = decide(state, command)  # type: ignore[arg-type]
        except Exception:
            return
        for event in events:
            data = to_data(event)
            state = fold_all(state, [from_data(event.TYPE, data)])
            stored.append(
                StoredEvent(
                    position=len(stored) + 1,
                    stream="schedule/s",
                    version=len(stored) + 1,
                    type=event.TYPE,
                    data=data,
                    recorded_at=now,
                )
            )

    do(Create(content=content(10, overlap), now=now))
    for step in steps:
        now += timedelta(minutes=7)
        if step == "tick":
            do(DecideDue(now=now))
        elif step == "start" and state.pending:
            do(MarkStarted(due=state.pending[0].due, now=now))
        elif step == "end" and state.running:
            do(MarkEnded(due=state.running[0], outcome="finished", now=now))
        elif step == "pause":
            do(Pause(now=now))
        elif step == "resume":
            do(Resume(now=now))
        elif step == "change":
            do(Change(content=content(5 if state.version % 2 else 10, overlap), now=now))
    return stored


def fold_events(events: list[StoredEvent]) -> ScheduleState:
    return fold_all(ScheduleState(schedule_id="s"), [from_data(e.type, e.data) for e in events])


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(STEP, max_size=40),
    overlap=st.sampled_from(list(Overlap)),
    data=st.data(),
)
def test_a_snapshot_of_any_prefix_then_the_rest_folds_to_the_same_state(
    steps: list[str], overlap: Overlap, data: st.DataObject
) -> None:
    """O2: fold(all) == fold(snapshot(prefix)) + rest, the snapshot through its stored JSON;
    and with the prefix's run events removed (retention, O1), a reader that meets the gap
    continues from the snapshot to the same state."""
    events = history(steps, overlap)
    whole = fold_events(events)
    cut = data.draw(st.integers(min_value=1, max_value=len(events)))
    snapshot = ScheduleState.from_json(fold_events(events[:cut]).to_json())
    assert fold_all(snapshot, [from_data(e.type, e.data) for e in events[cut:]]) == whole

    # Retention keeps the snapshot's own event and every life-cycle event below it.
    kept = [e for e in events if e.version >= cut or e.type not in RUN_RECORD_TYPES]
    start = data.draw(st.integers(min_value=0, max_value=len(events)))
    reader = fold_events([e for e in events if e.version <= start])  # e.g. a lagging index row
    tail = [e for e in kept if e.version > start]
    assert fold_stream(reader, tail, lambda sid: snapshot) == whole


# Journals: every reader after a prune ----------------------------------------------------------


@pytest.fixture
def app() -> Celery:
    app = Celery("retention_tests", broker="memory://", set_as_current=False)

    @app.task(name="backup", shared=False)
    def backup(folder: str) -> str:  # pragma: no cover - nothing consumes the queue
        return folder

    return app


def count(durable: Durable, table: sa.Table, *where: sa.ColumnElement[bool]) -> int:
    with durable.journal.engine.connect() as conn:
        query = sa.select(sa.func.count()).select_from(table)
        return int(conn.execute(query.where(*where) if where else query).scalar() or 0)


def run_days(durable: Durable, clock: FakeClock, days: int) -> None:
    dispatcher = durable.dispatcher()
    try:
        for _ in range(days * 24):
            clock.advance(hours=1)
            dispatcher.tick()
    finally:
        dispatcher.close()


def test_readers_see_the_same_states_after_a_prune(durable: Durable, clock: FakeClock) -> None:
    """O1/O2 on each database: state(), list(), rebuild and start-up agree with the full fold;
    a backfill over pruned days decides nothing (A6); a dry run removes nothing."""
    s = durable.schedules
    s.create("hourly", "backup", "/a", Every(timedelta(hours=1)))
    s.create("paused", "backup", "/b", Every(timedelta(hours=2)))
    s.create("gone", "backup", "/c", Every(timedelta(hours=3)))
    run_days(durable, clock, 3)
    s.pause("paused")
    s.delete("gone")
    run_days(durable, clock, 3)
    before = {v.id: v for v in s.list(include_deleted=True)}
    events_before = count(durable, events_table)

    dry = durable.prune(timedelta(days=2), dry_run=True)
    assert dry.schedule_events > 0 and count(durable, events_table) == events_before
    assert count(durable, snapshots_table) == 0

    report = durable.prune(timedelta(days=2))
    assert report.schedule_events == dry.schedule_events
    assert count(durable, events_table) == events_before - report.schedule_events
    assert count(durable, snapshots_table) == report.snapshots == 3

    assert {v.id: v for v in s.list(include_deleted=True)} == before
    for sid, view in before.items():
        assert s.state(sid) == view
    durable.index.rebuild(clock())
    assert {v.id: v for v in s.list(include_deleted=True)} == before

    # Only the last two days' runs are listed; none of the removed due times comes back.
    runs = s.runs("hourly")
    assert runs and min(r.due for r in runs) >= clock() - timedelta(days=2)
    assert s.backfill("hourly", T0, clock() - timedelta(days=3)) == []
    with pytest.raises(Exception, match="deleted"):
        s.create("gone", "backup", "/c", Every(timedelta(hours=3)))

    # The dispatcher continues from the pruned journal: one run per hour, none twice.
    clock.advance(minutes=30)
    run_days(durable, clock, 1)
    after = s.state("hourly")
    assert after is not None and after.runs_decided == before["hourly"].runs_decided + 24
    assert durable.prune(timedelta(days=2)).schedule_events > 0
