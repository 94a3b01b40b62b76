"""Schedules written straight into a journal (as a dispatcher that had run before would leave
it), and the queries with which the benchmarks watch the journal."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from celery_durable import CatchUp, Durable, Every
from celery_durable.core.ids import run_id, schedule_stream
from celery_durable.core.journal import Append
from celery_durable.core.schedule_aggregate import ScheduleState, fold_all
from celery_durable.core.schedule_events import (
    Content,
    RunDecided,
    RunSent,
    ScheduleCreated,
    to_new_event,
)
from celery_durable.store.journal.schema import events as events_table

from .common import TASK, utcnow


def seed(
    durable: Durable,
    schedules: Iterator[tuple[str, list[Any]]],
    *,
    batch_rows: int = 5000,
) -> dict[str, Any]:
    """Write each schedule's events with ``append_many`` in big batches, then the index rows
    (folded here) and the projection position in one ``index.save``: a consistent index, as a
    dispatcher that had run before would leave it."""
    journal_ = durable.journal
    journal_.ensure_ready()
    t0 = time.perf_counter()
    states: list[ScheduleState] = []
    pending: list[Append] = []
    rows = events_n = 0
    for sid, evs in schedules:
        pending.append(
            Append(
                stream=schedule_stream(sid),
                expected_version=0,
                events=[to_new_event(e) for e in evs],
            )
        )
        states.append(fold_all(ScheduleState(schedule_id=sid), evs))
        rows += len(evs)
        events_n += len(evs)
        if rows >= batch_rows:
            journal_.append_many(pending)
            pending, rows = [], 0
    if pending:
        journal_.append_many(pending)
    t_events = time.perf_counter() - t0
    head = journal_.head("schedule")
    durable.index.save(states, head, utcnow())
    return {
        "schedules": len(states),
        "events": events_n,
        "head": head,
        "seed_events_s": t_events,
        "seed_total_s": time.perf_counter() - t0,
    }


def content(i: int, rule: Any) -> Content:
    return Content(task=TASK, input=i, rule=rule, catch_up=CatchUp.LATEST)


def burst_schedules(
    n: int, created: datetime, prefix: str = "b"
) -> Iterator[tuple[str, list[Any]]]:
    rule = Every(timedelta(seconds=60))
    for i in range(n):
        yield f"{prefix}-{i:06d}", [ScheduleCreated(at=created, content=content(i, rule))]


def startup_schedules(
    n: int, due_now: int, now: datetime, history_runs: int
) -> Iterator[tuple[str, list[Any]]]:
    """``n`` hourly schedules; the first ``due_now`` have their next due time 60 s before
    ``now``, the others are spread over [now + 30 min, now + 90 min). With history, each
    schedule has ``history_runs`` past runs (RunDecided + RunSent each) before that due
    time; without, it was created one interval before it. The next due times are identical."""
    hour = timedelta(hours=1)
    rule = Every(hour)
    spread = (n - due_now) or 1
    for i in range(n):
        if i < due_now:
            next_due = now - timedelta(seconds=60)
        else:
            next_due = now + timedelta(minutes=30) + hour * ((i - due_now) / spread)
        created = next_due - hour * (history_runs + 1)
        evs: list[Any] = [ScheduleCreated(at=created, content=content(i, rule))]
        sid = f"s-{i:06d}"
        for k in range(1, history_runs + 1):
            due = created + hour * k
            evs.append(
                RunDecided(
                    at=due + timedelta(milliseconds=40),
                    due=due,
                    run_id=run_id(sid, due),
                    task=TASK,
                    input=i,
                )
            )
            evs.append(RunSent(at=due + timedelta(milliseconds=45), due=due))
        yield sid, evs


def steady_schedules(n: int, base: datetime, period: float) -> Iterator[tuple[str, list[Any]]]:
    """``n`` schedules of ``Every(period)`` whose anchors are spread evenly over one period."""
    rule = Every(timedelta(seconds=period))
    step = timedelta(seconds=period / n)
    for i in range(n):
        yield f"e-{i:06d}", [ScheduleCreated(at=base + step * i, content=content(i, rule))]


def type_counts(durable: Durable, after: int) -> dict[str, int]:
    query = (
        select(events_table.c.type, func.count())
        .where(events_table.c.category == "schedule", events_table.c.position > after)
        .group_by(events_table.c.type)
    )
    with durable.journal.engine.connect() as conn:
        return {t: int(c) for t, c in conn.execute(query).all()}


def last_recorded(
    durable: Durable, after: int, type_: str, t0: float, *, first: bool = False
) -> float | None:
    """``recorded_at`` of the last (``first``: the first) event of a type (set by the writer
    just before its INSERT), relative to ``t0``."""
    pick = func.min if first else func.max
    query = select(pick(events_table.c.recorded_at)).where(
        events_table.c.category == "schedule",
        events_table.c.position > after,
        events_table.c.type == type_,
    )
    with durable.journal.engine.connect() as conn:
        found = conn.execute(query).scalar()
    return None if found is None else found.timestamp() - t0


def first_decided(durable: Durable, after: int) -> bool:
    query = (
        select(events_table.c.position)
        .where(
            events_table.c.category == "schedule",
            events_table.c.position > after,
            events_table.c.type == "RunDecided",
        )
        .limit(1)
    )
    with durable.journal.engine.connect() as conn:
        return conn.execute(query).first() is not None
