"""Decide and record: ask the schedule aggregate, append its events, retry on conflict (A8).

Many schedules go into one transaction (A6). The starts of a round may be stored by a writer
thread while the next round is decided and published, so a burst's publishing overlaps with
its wait for the database.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from celery_durable import tracing
from celery_durable.core.ids import schedule_stream
from celery_durable.core.journal import Append
from celery_durable.core.schedule_aggregate import Command, ScheduleState, decide_all
from celery_durable.core.schedule_events import ScheduleEvent, to_new_event
from celery_durable.dispatch.state import StateCache
from celery_durable.errors import AppendConflict
from celery_durable.message import Resend
from celery_durable.store.index import entry_row, upsert
from celery_durable.store.journal.sql import SqlJournal, Transaction
from celery_durable.store.runs import RunStore

Clock = Callable[[], datetime]
Stored = list[tuple[str, ScheduleEvent]]
"""The schedule events a round stored, as ``(schedule ID, event)`` in order."""


@dataclass(frozen=True, slots=True)
class Recording:
    """A round whose starts are being stored: the schedules to re-watch once they are."""

    future: Future[Stored]
    sids: Sequence[str]
    now: datetime


class Recorder:
    """Turns commands into stored schedule events, one transaction per round.

    It returns what it stored; the dispatcher announces it (logs, signals, O4).
    """

    def __init__(
        self,
        journal: SqlJournal,
        cache: StateCache,
        clock: Clock,
        *,
        run_lease: float,
    ) -> None:
        self.journal = journal
        self.cache = cache
        self.clock = clock
        self.run_lease = run_lease
        self.writer: ThreadPoolExecutor | None = None

    def decide(
        self, sid: str, commands: Sequence[Command]
    ) -> tuple[list[ScheduleEvent], ScheduleState]:
        """The events of these commands on the cached state, and the state after them."""
        return decide_all(self.cache.states[sid], commands)

    def append(
        self,
        commands: dict[str, list[Command]],
        *,
        rows: bool = False,
        extra: Callable[[Transaction], None] | None = None,
    ) -> Stored:
        """Decide and append every schedule's commands in one transaction.

        Returns the events stored, schedule by schedule. With
        ``rows``, the schedules' index rows are written in the same transaction; without, they
        follow with the starts, after the burst, or at the next checkpoint (the state cache's
        ``refresh``). On a version conflict (another process appended first, A8) the schedule
        is read again and its commands decided again.
        """
        cache = self.cache
        tracer = tracing.tracer()
        began = tracing.started() if tracer is not None else 0
        decided = {sid: self.decide(sid, cmds) for sid, cmds in commands.items()}
        decided = {sid: pair for sid, pair in decided.items() if pair[0]}
        journal = self.journal
        while decided:
            appends = [
                Append(
                    stream=schedule_stream(sid),
                    expected_version=cache.states[sid].version,
                    events=[to_new_event(e) for e in events],
                )
                for sid, (events, _) in decided.items()
            ]
            try:
                with journal.transaction() as conn:
                    journal.append_in(conn, appends)
                    if rows:
                        now = self.clock()
                        live = cache.index.live
                        upsert(conn, [entry_row(s, now, live) for _, s in decided.values()])
                    if extra is not None:
                        extra(conn)
            except AppendConflict as exc:
                sid = str(getattr(exc, "stream", "")).split("/", 1)[-1]
                if sid not in decided:
                    raise
                cache.reload(sid)
                fresh = self.decide(sid, commands[sid])
                if fresh[0]:
                    decided[sid] = fresh
                else:
                    del decided[sid]
                continue
            stored: Stored = []
            for sid, (events, state) in decided.items():
                cache.appended(sid, state, row_written=rows)
                stored.extend((sid, event) for event in events)
            if tracer is not None:
                tracing.decided(tracer, decided, began)
            return stored
        return []

    def record(
        self,
        sids: Sequence[str],
        starts: dict[str, list[Command]],
        durable_runs: list[Resend],
        now: datetime,
        *,
        background: bool,
        rows: bool,
    ) -> Recording:
        """Store the starts of one round, in the writer thread when another round follows.

        In a burst the next round's reads, decisions and (above all) publishing then overlap
        with this round's wait for the database. One round is recorded at a time, in order;
        the rounds touch disjoint schedules. With ``rows`` the round's index rows go in the
        same transaction; a burst writes them all once its last start is stored.
        """

        def store() -> Stored:
            # Durable runs get their row in the same transaction: the stale-run check (D8)
            # then re-sends one whose worker never claims it.
            return self.append(
                starts,
                rows=rows,
                extra=lambda conn: RunStore.record_sent_in(
                    conn, durable_runs, now=now, lease=self.run_lease
                ),
            )

        future: Future[Stored]
        if background:
            if self.writer is None:
                self.writer = ThreadPoolExecutor(1, thread_name_prefix="celery-durable-writer")
            future = self.writer.submit(store)
        else:
            future = Future()
            try:
                future.set_result(store())
            except BaseException as exc:
                future.set_exception(exc)
        return Recording(future, sids, now)

    def close(self) -> None:
        """Stop the writer thread (idle between ticks: a tick waits for its rounds)."""
        if self.writer is not None:
            self.writer.shutdown(wait=True)
            self.writer = None
