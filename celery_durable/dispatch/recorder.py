"""Decide and record: ask the schedule aggregate, append its events, retry on conflict (A8).

Many schedules go into one transaction (A6). The starts of a round may be stored by a writer
thread while the next round is decided and published, so a burst's publishing overlaps with
its wait for the database.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from celery_durable import tracing
from celery_durable.core.ids import schedule_stream
from celery_durable.core.journal import Append
from celery_durable.core.schedule_aggregate import Command, ScheduleState, decide_all
from celery_durable.core.schedule_events import ScheduleEvent, to_new_event
from celery_durable.dispatch.state_cache import StateCache
from celery_durable.errors import AppendConflict
from celery_durable.message import Resend
from celery_durable.store.conflicts import CONFLICT_ATTEMPTS, ConflictCount
from celery_durable.store.stores import AnyStore

log = logging.getLogger("celery_durable.dispatcher")

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
    """Turns commands into stored schedule events, one unit of work per round.

    It returns what it stored; the dispatcher announces it (logs, signals, O4).
    """

    def __init__(
        self,
        store: AnyStore,
        cache: StateCache,
        clock: Clock,
        *,
        run_lease: float,
    ) -> None:
        self.store = store
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
        sent: Sequence[Resend] = (),
        now: datetime | None = None,
    ) -> Stored:
        """Decide and append every schedule's commands in one unit of work.

        Returns the events stored, schedule by schedule. With ``rows``, the schedules' index
        rows are written in the same unit; without, they follow with the starts, after the
        burst, or at the next checkpoint (the state cache's ``refresh``). ``sent``: rows for
        the durable runs just sent, stored with them (queued as of ``now``, D8).

        On a version conflict (another process appended first, A8) the schedule is read again
        and its commands decided again, up to the conflict limit of ``store/conflicts.py``; a
        schedule that still conflicts then is left out of this round, with one ERROR line,
        and decided again at the next (the dispatcher looks at every schedule of a round
        again when it ends).
        """
        cache = self.cache
        tracer = tracing.tracer()
        began = tracing.started() if tracer is not None else 0
        decided = {sid: self.decide(sid, cmds) for sid, cmds in commands.items()}
        decided = {sid: pair for sid, pair in decided.items() if pair[0]}
        conflicts = ConflictCount()
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
                with self.store.unit_of_work() as unit:
                    unit.append(appends)
                    if rows:
                        states = [state for _, state in decided.values()]
                        unit.save_index(states, now=self.clock(), live=cache.index.live)
                    if sent:
                        unit.record_sent(sent, now=now or self.clock(), lease=self.run_lease)
            except AppendConflict as exc:
                sid = str(getattr(exc, "stream", "")).split("/", 1)[-1]
                if sid not in decided:
                    raise
                if not conflicts.another(sid):
                    _give_up(sid, exc)
                    del decided[sid]
                    continue
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
            # Durable runs get their row in the same unit of work: the stale-run check (D8)
            # then re-sends one whose worker never claims it.
            return self.append(starts, rows=rows, sent=durable_runs, now=now)

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


def _give_up(sid: str, conflict: AppendConflict) -> None:
    log.error(
        "schedule %r: %d appends in a row found its stream at another version than the one "
        "read (%s); it is left out of this round and decided again at the next. A stream "
        "behind its index row (a journal restored from a backup) needs `celery durable index "
        "rebuild`",
        sid, CONFLICT_ATTEMPTS, conflict,
        extra={"schedule": sid},
    )  # fmt: skip
