"""The dispatcher: decide what is due, store the decision, enqueue, store the start (SPEC §5).

One :meth:`Dispatcher.tick` at a time, from the beat loop or from a test with a fake clock:

1. Hold the lease (D6); a standby only polls it.
2. Fold the schedule events stored since the last tick into the index (D2) — this is also how
   schedules created or changed by other processes are seen within a tick (D3).
3. For each schedule whose attention time has come, ask the aggregate (C1–C3, A2, A3, R5, R6)
   and append its decisions: many schedules per transaction (A6, A8).
4. Enqueue every decided run with ``task_id = run ID`` (S2, S3), then append the starts.
   A broker failure leaves the run decided; it is tried again after ``min(check, 5 s)``.

The policy lives in the aggregate; this module only asks, stores and sends.
"""

from __future__ import annotations

import gc
import heapq
import logging
import os
import signal
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from kombu.exceptions import EncodeError
from sqlalchemy.engine import Connection

from celery_durable import signals
from celery_durable.catchup import recent_due_times
from celery_durable.codec import time_to_json
from celery_durable.ends import DEADLINE_HEADER
from celery_durable.errors import AppendConflict, DurableError
from celery_durable.events import (
    RunsMissed,
    ScheduleEvent,
    from_stored,
    to_new_event,
)
from celery_durable.ids import format_due, schedule_stream
from celery_durable.index import (
    ScheduleIndex,
    UnreadableEntry,
    attention_of,
    entry_row,
    fold_stored,
    upsert,
)
from celery_durable.journal import Append
from celery_durable.lease import Lease, default_owner
from celery_durable.runs import Resend, RunStore
from celery_durable.schedule import (
    Command,
    DecideDue,
    MarkFailedToStart,
    MarkStarted,
    PendingRun,
    ScheduleState,
    decide,
    fold_all,
)

if TYPE_CHECKING:
    from celery_durable.durable import Durable

log = logging.getLogger("celery_durable.dispatcher")

CHUNK = 1000
"""Schedules decided, sent and recorded per round: bounds transaction size and latency."""

MIN_SLEEP = 0.02
"""The shortest sleep between ticks (seconds)."""

INDEX_CHECKPOINT = timedelta(seconds=1)
"""How often the projection's read position is saved with the rows that lag behind it (D2).

A crash loses nothing: start-up reads the events stored after the saved position, at most
this interval's worth more.
"""

MESSAGE_OPTIONS = (
    "queue",
    "routing_key",
    "exchange",
    "priority",
    "expires",
    "time_limit",
    "soft_time_limit",
)

#: Errors that mean "this message can never be built", as opposed to "the broker is away" (D5).
PERMANENT_SEND_ERRORS: tuple[type[BaseException], ...] = (TypeError, ValueError, EncodeError)


class TaskMissing(DurableError, LookupError):
    """A run's task is not registered in the dispatcher's app (D4)."""


@dataclass(frozen=True, slots=True)
class Message:
    """What is sent for one run: positional and keyword arguments, options, headers."""

    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    headers: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Recording:
    """A round whose starts are being stored: the schedules to re-watch once they are."""

    future: Future[int]
    sids: Sequence[str]
    now: datetime


class Dispatcher:
    """Decides and enqueues the due runs of every schedule in one journal.

    Build it with ``durable.dispatcher()``; call :meth:`tick` repeatedly. ``tick`` returns the
    seconds to sleep before the next call.
    """

    def __init__(
        self,
        durable: Durable,
        *,
        owner: str | None = None,
        lease_ttl: float | None = None,
        poll_interval: float | None = None,
    ) -> None:
        self.durable = durable
        self.app = durable.app
        config = durable.config
        self.check_interval = config.check_interval
        self.retry_delay = timedelta(seconds=min(config.check_interval, 5.0))
        self.poll_interval = min(poll_interval or config.poll_interval, config.check_interval)
        self.lease = Lease(
            durable.journal,
            "dispatcher",
            owner or default_owner(),
            lease_ttl or config.leader_lease,
        )
        self.index = ScheduleIndex(durable.journal)
        self._loaded = False
        self._position = 0
        self._states: dict[str, ScheduleState] = {}
        self._row_version: dict[str, int] = {}
        self._dirty: set[str] = set()
        self._next_checkpoint: datetime | None = None
        self._attention: dict[str, datetime] = {}
        self._heap: list[tuple[datetime, str]] = []
        self._retry_at: dict[str, datetime] = {}
        self._missing_logged: dict[str, datetime] = {}
        self._failed_logged: set[str] = set()
        self._broker_down_since: datetime | None = None
        self._next_resend_check: datetime | None = None
        self._missed = 0
        self.run_lease = config.run_lease
        self.runs = RunStore(durable.journal)
        self._writer: ThreadPoolExecutor | None = None

    # The loop body ----------------------------------------------------------------------------

    def tick(self) -> float:
        """Decide and enqueue everything due at the clock's time; return the seconds to sleep.

        When it raises (the journal went away), the next tick reads the index and the events
        again: runs decided but not recorded as started are then enqueued again (A6).
        """
        try:
            return self._tick()
        except BaseException:
            self._loaded = False
            raise

    def _tick(self) -> float:
        now = self.durable.now()
        if not self.lease.hold(now):
            self._loaded = False  # another process works; our caches go stale
            return self.poll_interval
        if not self._loaded:
            self.load(now)
        else:
            self.refresh(now)
        due = self._pop_due(now)
        self._missed = 0
        recording: _Recording | None = None
        burst = len(due) > CHUNK
        if burst:
            # Every object alive now outlives the burst; hidden from the collector meanwhile,
            # it is not scanned again by each full collection the burst's allocations trigger
            # (about 5 % of a 10,000-run burst). Given back afterwards: nothing is kept alive.
            gc.freeze()
        try:
            for start in range(0, len(due), CHUNK):
                # A fresh time per chunk: a long burst does not decide its last chunk late.
                chunk_now = now if start == 0 else self.durable.now()
                sids = due[start : start + CHUNK]
                starts, durable_runs = self._decide_and_send(sids, chunk_now)
                if recording is not None:
                    self._finish(recording)
                    recording = None
                more = start + CHUNK < len(due)
                recording = self._record(
                    sids, starts, durable_runs, chunk_now, background=more, rows=not burst
                )
            if recording is not None:
                self._finish(recording)
                recording = None
            if burst:  # the index rows of the burst, once its last start is stored (D2)
                self._write_rows(due, self.durable.now())
        finally:
            try:
                if recording is not None:  # a round failed: wait for the one in flight
                    self._finish(recording)
            finally:
                if burst:
                    gc.unfreeze()
        if self._missed:
            log.warning(
                "%d schedule(s) dropped missed due times by their catch-up policy", self._missed
            )
        self._resend_runs(now)
        return self._sleep_after(self.durable.now())

    def _resend_runs(self, now: datetime) -> None:
        """D8 and W4: send again durable runs that stalled, and those whose sleep is over."""
        if self._next_resend_check is not None and now < self._next_resend_check:
            return
        self._next_resend_check = now + timedelta(seconds=self.poll_interval)
        resends = self.runs.stale(now) + self.runs.wakeups(now)
        if not resends:
            return
        sent: list[str] = []
        try:
            with self.app.producer_or_acquire() as producer:
                connect_once(producer)
                for resend in resends:
                    if resend.task not in self.app.tasks:
                        continue  # D4: logged at the schedule's due times; the row waits
                    resend.send(self.app, retry=False, producer=producer)
                    sent.append(resend.run_id)
                    log.info(
                        "re-sent durable run %s", resend.run_id, extra={"run_id": resend.run_id}
                    )
        except Exception as exc:
            log.warning("could not re-send durable runs: %s: %s", type(exc).__name__, exc)
        self.runs.postpone(sent, now, self.run_lease)

    def load(self, now: datetime) -> None:
        """Read the index and the events stored since (C4); nothing is decided before this."""
        self.durable.journal.ensure_ready()
        if self.index.needs_rebuild():
            self.index.rebuild(now)
        self._states.clear()
        self._row_version.clear()
        self._dirty.clear()
        self._heap.clear()
        self._attention.clear()
        self._position = self.index.position()
        for sid, when in self.index.attention().items():
            self._watch(sid, when)
        self._loaded = True
        self.refresh(now)

    def refresh(self, now: datetime) -> None:
        """Fold the schedule events stored since the last read; write the rows that lag.

        Rows changed by other processes (a schedule created or changed through the API) are
        written at once. The dispatcher's own appends mostly wrote their rows with the starts;
        the few that did not (a decision with nothing to send), and the read position itself,
        wait for the next checkpoint (:data:`INDEX_CHECKPOINT`).
        """
        events = self.index.events_after(self._position)
        if not events:
            if self._dirty and self._checkpoint_due(now):
                self.checkpoint(now)
            return
        sids = {e.stream.split("/", 1)[1] for e in events}
        try:
            self._adopt(self.index.load([s for s in sids if s not in self._states]))
        except UnreadableEntry as exc:
            log.warning("%s: rebuilding the index", exc)
            self._states.clear()
            self._row_version.clear()
            self._dirty.clear()
            self._adopt(self.index.rebuild(now))
            self._position = self.index.position()
            self._heap.clear()
            self._attention.clear()
            for sid, state in self._states.items():
                self._watch(sid, attention_of(state))
            return
        changed = fold_stored(self._states, events)
        self._position = events[-1].position
        self._dirty.update(sids)
        if changed or self._checkpoint_due(now):
            self.checkpoint(now)
        for sid in changed:
            self._watch(sid, attention_of(self._states[sid]))

    def _checkpoint_due(self, now: datetime) -> bool:
        return self._next_checkpoint is None or now >= self._next_checkpoint

    def checkpoint(self, now: datetime) -> None:
        """Write every lagging index row and the read position, in one transaction (D2)."""
        lagging = [
            s
            for s in self._dirty
            if s in self._states and self._row_version.get(s, -1) < self._states[s].version
        ]
        self.index.save([self._states[s] for s in lagging], self._position, now)
        for sid in lagging:
            self._row_version[sid] = self._states[sid].version
        self._dirty.clear()
        self._next_checkpoint = now + INDEX_CHECKPOINT

    # Deciding and sending ----------------------------------------------------------------------

    def _decide_and_send(
        self, sids: Sequence[str], now: datetime
    ) -> tuple[dict[str, list[Command]], list[Resend]]:
        """Decide and store the due runs of these schedules, then enqueue them.

        Returns the commands that record each run's start (or failure to start) and the
        durable runs that were sent (their rows go in with the starts).
        """
        states = self._states_of(sids)
        self._missed += self._append(
            {sid: [DecideDue(now=now)] for sid in sids if not self._task_missing(states[sid], now)}
        )
        _crash_point("after-decide")
        sendable = [
            (sid, p)
            for sid in sids
            for p in self._states[sid].sendable()
            if self._retry_at.get(p.run_id, now) <= now and p.send_time <= now
        ]
        starts: dict[str, list[Command]] = {}
        durable_runs: list[Resend] = []
        for sid, pending, outcome in self._send(sendable, now):
            command: Command
            if isinstance(outcome, str):
                command = MarkFailedToStart(due=pending.due, error=outcome, now=now)
            else:
                command = MarkStarted(due=pending.due, now=now)
                if outcome is not None:
                    durable_runs.append(outcome)
            starts.setdefault(sid, []).append(command)
        return starts, durable_runs

    def _record(
        self,
        sids: Sequence[str],
        starts: dict[str, list[Command]],
        durable_runs: list[Resend],
        now: datetime,
        *,
        background: bool,
        rows: bool,
    ) -> _Recording:
        """Store the starts of one round, in the writer thread when another round follows.

        In a burst the next round's reads, decisions and (above all) publishing then overlap
        with this round's wait for the database. One round is recorded at a time, in order;
        the rounds touch disjoint schedules. With ``rows`` the round's index rows go in the
        same transaction; a burst writes them all once its last start is stored.
        """

        def store() -> int:
            # Durable runs get their row in the same transaction: the stale-run check (D8)
            # then re-sends one whose worker never claims it.
            return self._append(
                starts,
                rows=rows,
                extra=lambda conn: RunStore.record_sent_in(
                    conn, durable_runs, now=now, lease=self.run_lease
                ),
            )

        future: Future[int]
        if background:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="celery-durable-writer")
            future = self._writer.submit(store)
        else:
            future = Future()
            try:
                future.set_result(store())
            except BaseException as exc:
                future.set_exception(exc)
        return _Recording(future, sids, now)

    def _write_rows(self, sids: Sequence[str], now: datetime) -> None:
        """Bring the index rows of these schedules up to their state (after a burst)."""
        states = [self._states[s] for s in sids if s in self._states]
        self.index.save(states, self._position, now)
        for state in states:
            self._row_version[state.schedule_id] = state.version

    def _finish(self, recording: _Recording) -> None:
        """Wait for a round's starts (raising what storing them raised), then re-watch."""
        self._missed += recording.future.result()
        for sid in recording.sids:
            self._watch(sid, self._attention_now(sid, recording.now))

    def _decide(
        self, sid: str, commands: Sequence[Command]
    ) -> tuple[list[ScheduleEvent], ScheduleState]:
        state = self._states[sid]
        out: list[ScheduleEvent] = []
        for command in commands:
            events = decide(state, command)
            state = fold_all(state, events)
            out.extend(events)
        return out, state

    def _append(
        self,
        commands: dict[str, list[Command]],
        *,
        rows: bool = False,
        extra: Callable[[Connection], None] | None = None,
    ) -> int:
        """Decide and append every schedule's commands in one transaction.

        Returns how many ``RunsMissed`` events were stored (for the tick's one warning). With
        ``rows``, the schedules' index rows are written in the same transaction; without, they
        follow with the starts, after the burst, or at the next checkpoint (:meth:`refresh`).
        On a version conflict (another process appended first, A8) the schedule is read again
        and its commands decided again.
        """
        decided = {sid: self._decide(sid, cmds) for sid, cmds in commands.items()}
        decided = {sid: pair for sid, pair in decided.items() if pair[0]}
        journal = self.durable.journal
        while decided:
            appends = [
                Append(
                    stream=schedule_stream(sid),
                    expected_version=self._states[sid].version,
                    events=[to_new_event(e) for e in events],
                )
                for sid, (events, _) in decided.items()
            ]
            try:
                with journal.transaction() as conn:
                    journal.append_in(conn, appends)
                    if rows:
                        now = self.durable.now()
                        upsert(conn, [entry_row(state, now) for _, state in decided.values()])
                    if extra is not None:
                        extra(conn)
            except AppendConflict as exc:
                sid = str(getattr(exc, "stream", "")).split("/", 1)[-1]
                if sid not in decided:
                    raise
                self._reload(sid)
                fresh = self._decide(sid, commands[sid])
                if fresh[0]:
                    decided[sid] = fresh
                else:
                    del decided[sid]
                continue
            missed = 0
            for sid, (events, state) in decided.items():
                self._states[sid] = state
                if rows:
                    self._row_version[sid] = state.version
                for event in events:
                    signals.announce(self, sid, event)
                    missed += isinstance(event, RunsMissed)
            return missed
        return 0

    def _send(
        self, runs: Sequence[tuple[str, PendingRun]], now: datetime
    ) -> Iterable[tuple[str, PendingRun, str | Resend | None]]:
        """Enqueue runs and yield ``(sid, run, outcome)``.

        The outcome is ``None`` for a plain task that was sent, a :class:`Resend` (the message,
        to record) for a durable task that was sent, the error text for a run that never can be.
        """
        if not runs:
            return
        sent: list[tuple[str, PendingRun, Resend | None]] = []
        failed: list[tuple[str, PendingRun, str]] = []
        try:
            with self.app.producer_or_acquire() as producer:
                connect_once(producer)
                batch = getattr(producer, "batch", None)
                context = batch(max_size=CHUNK) if batch is not None else nullcontext()
                with context:
                    for sid, pending in runs:
                        try:
                            record = self._publish(sid, pending, producer)
                        except TaskMissing as exc:
                            self._log_missing(sid, pending.task, pending.due, now, exc)
                            self._retry_at[pending.run_id] = now + self.retry_delay
                        except PERMANENT_SEND_ERRORS as exc:
                            failed.append((sid, pending, f"{type(exc).__name__}: {exc}"))
                        else:
                            sent.append((sid, pending, record))
        except Exception as exc:  # the broker is away: nothing of this round counts as sent
            if self._broker_down_since is None:
                self._broker_down_since = now
                log.error(
                    "cannot enqueue %d decided run(s): %s: %s; retrying every %.0fs",
                    len(runs),
                    type(exc).__name__,
                    exc,
                    self.retry_delay.total_seconds(),
                )
            for _sid, pending in runs:
                self._retry_at[pending.run_id] = now + self.retry_delay
            sent = []
        else:
            if self._broker_down_since is not None and sent:
                log.warning("broker reachable again; enqueueing decided runs")
                self._broker_down_since = None
        for sid, pending, record in sent:
            self._retry_at.pop(pending.run_id, None)
            yield sid, pending, record
        for sid, pending, error in failed:
            if pending.run_id not in self._failed_logged:
                self._failed_logged.add(pending.run_id)
                log.error(
                    "run %s of schedule %s (due %s, task %s) can never be enqueued: %s",
                    pending.run_id,
                    sid,
                    time_to_json(pending.due),
                    pending.task,
                    error,
                    extra={"schedule": sid, "run_id": pending.run_id, "due": pending.due},
                )
            yield sid, pending, error

    def _publish(self, sid: str, pending: PendingRun, producer: Any) -> Resend | None:
        task = self.app.tasks.get(pending.task)
        if task is None:
            raise TaskMissing(f"task {pending.task!r} is not registered", task=pending.task)
        durable = bool(getattr(task, "__durable__", False))
        message = self.message(sid, pending, durable=durable, now=self.durable.now())
        task.apply_async(
            message.args,
            message.kwargs,
            task_id=pending.run_id,
            producer=producer,
            headers=message.headers,
            retry=False,
            **message.options,
        )
        if not durable:
            return None
        return Resend(
            run_id=pending.run_id,
            task=pending.task,
            args=message.args,
            kwargs=message.kwargs,
            options=message.options,
            headers=message.headers,
        )

    @staticmethod
    def message(
        sid: str, pending: PendingRun, *, durable: bool, now: datetime | None = None
    ) -> Message:
        """The message of a run: as stock beat sends it for plain tasks, a ScheduledRun else.

        A run with a start deadline (P1) expires at it, or earlier when its own ``expires``
        (seconds after ``now``, the moment of sending) says so.
        """
        options = dict(pending.options)
        headers = dict(options.get("headers") or {})
        headers.update(
            durable_schedule=sid,
            durable_due=format_due(pending.due),
            durable_run_id=pending.run_id,
        )
        if pending.track_end:
            headers["durable_track_end"] = True
        send_options = {k: options[k] for k in MESSAGE_OPTIONS if options.get(k) is not None}
        if pending.deadline is not None:
            headers[DEADLINE_HEADER] = format_due(pending.deadline)
            if not durable:
                # Celery's own ``expires`` header: the worker discards a late message and the
                # revoke is recorded as missed (a broker TTL would drop it unrecorded). A
                # durable run checks the deadline itself: once started it must run on, also
                # when redelivered or woken after the deadline.
                user = send_options.pop("expires", None)
                headers["expires"] = expiry(pending.deadline, user, now)
        if durable:
            from celery_durable import tasks

            run = tasks.ScheduledRun(schedule=sid, due=pending.due, input=pending.input)
            args, kwargs, extra = tasks.scheduled_message(run)
            headers.update(extra)
            return Message(list(args), dict(kwargs), send_options, headers)
        if "args" in options or "kwargs" in options:
            args = list(options.get("args") or [])
        else:
            args = [] if pending.input is None else [pending.input]
        return Message(args, dict(options.get("kwargs") or {}), send_options, headers)

    # Deploy safety --------------------------------------------------------------------------------

    def _task_missing(self, state: ScheduleState, now: datetime) -> bool:
        """D4: when the schedule's task is gone, log at each due time and decide nothing."""
        content = state.content
        if content is None or not state.active or content.task in self.app.tasks:
            return False
        first = state.next_due()
        if first is not None and first <= now and state.cursor is not None:
            latest = recent_due_times(content.rule, state.cursor, now, state.anchor, 1).run
            self._log_missing(
                state.schedule_id, content.task, latest[-1] if latest else first, now, None
            )
        elif first is not None and first <= now:
            self._log_missing(state.schedule_id, content.task, first, now, None)
        return True

    def _log_missing(
        self, sid: str, task: str, due: datetime, now: datetime, exc: Exception | None
    ) -> None:
        if self._missing_logged.get(sid) == due:
            return
        self._missing_logged[sid] = due
        log.error(
            "schedule %s: task %s is not registered; nothing is decided for due time %s",
            sid,
            task,
            time_to_json(due),
            extra={"schedule": sid, "task": task, "due": due},
        )

    # Bookkeeping --------------------------------------------------------------------------------

    def _states_of(self, sids: Sequence[str]) -> dict[str, ScheduleState]:
        missing = [s for s in sids if s not in self._states]
        if missing:
            self._adopt(self.index.load(missing))
            for sid in missing:
                self._states.setdefault(sid, ScheduleState(schedule_id=sid))
        return {sid: self._states[sid] for sid in sids}

    def _adopt(self, states: dict[str, ScheduleState]) -> None:
        """Cache states read from index rows (which are therefore at their version)."""
        self._states.update(states)
        for sid, state in states.items():
            self._row_version[sid] = state.version

    def _reload(self, sid: str) -> None:
        state = self._states.get(sid) or ScheduleState(schedule_id=sid)
        tail = self.durable.journal.read_stream(schedule_stream(sid), after_version=state.version)
        self._states[sid] = fold_all(state, [from_stored(e) for e in tail])

    def _attention_now(self, sid: str, now: datetime) -> datetime | None:
        state = self._states[sid]
        sendable = state.sendable()
        waits = [self._retry_at[p.run_id] for p in sendable if p.run_id in self._retry_at]
        unsent = [p.send_time for p in sendable if p.run_id not in self._retry_at]
        if unsent and min(unsent) <= now:
            return min(unsent)
        if state.content is not None and state.active and state.content.task not in self.app.tasks:
            nxt = content_rule_next(state, now)
            # D4: look again at the next due time (to log it), and soon in case the task returns.
            later = now + timedelta(seconds=self.poll_interval)
            return min(nxt, later) if nxt is not None and nxt > now else later
        following = state.attention(self._retry_at)  # jittered (P2), held deadlines (P1)
        candidates = [*waits, *([following] if following is not None else [])]
        return min(candidates) if candidates else None

    def _watch(self, sid: str, when: datetime | None) -> None:
        if when is None:
            self._attention.pop(sid, None)
            return
        if self._attention.get(sid) != when:
            self._attention[sid] = when
            heapq.heappush(self._heap, (when, sid))

    def _pop_due(self, now: datetime) -> list[str]:
        due: list[str] = []
        seen: set[str] = set()
        while self._heap and self._heap[0][0] <= now:
            when, sid = heapq.heappop(self._heap)
            if self._attention.get(sid) == when and sid not in seen:
                seen.add(sid)
                due.append(sid)
        return due

    def _sleep_after(self, now: datetime) -> float:
        while self._heap and self._attention.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        wait = self.poll_interval
        if self._heap:
            wait = min(wait, (self._heap[0][0] - now).total_seconds())
        # Never spin: due times closer together than this are decided together, so that the
        # per-tick costs (a poll, two commits) are shared when thousands are due per second.
        return max(wait, MIN_SLEEP)

    # Reads for tools and tests ------------------------------------------------------------------

    @property
    def next_attention(self) -> datetime | None:
        """The earliest moment a schedule needs the dispatcher."""
        return min(self._attention.values(), default=None)

    def close(self) -> None:
        """Write the lagging index rows, give up the lease; calling it twice is harmless."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)  # idle between ticks: tick() waits for its rounds
            self._writer = None
        if self._loaded:
            try:
                self._next_checkpoint = None  # due now
                self.refresh(self.durable.now())
            except Exception:  # the rows are a cache: start-up reads the events instead
                log.warning("could not write the index rows on close", exc_info=True)
        try:
            self.lease.release()
        except Exception:  # closing must not fail on a journal that is away
            log.warning("could not release the dispatcher lease", exc_info=True)


def expiry(deadline: datetime, expires: float | None, now: datetime | None) -> str:
    """The message expiry of a run with a start deadline: the earlier of the deadline and a
    user-given ``expires`` (seconds after ``now``), as ISO text (JSON-safe for re-sends)."""
    if expires is not None and now is not None:
        deadline = min(deadline, now + timedelta(seconds=expires))
    return deadline.isoformat()


def _crash_point(name: str) -> None:
    """Die here, like ``kill -9``, when ``CELERY_DURABLE_TEST_CRASH`` names this point.

    Only end-to-end tests set the variable: they prove that a crash between storing a decision
    and enqueueing it loses nothing (A6).
    """
    if os.environ.get("CELERY_DURABLE_TEST_CRASH") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def connect_once(producer: Any) -> None:
    """Connect the producer now, trying each broker host once, without sleeping.

    Left to itself, kombu retries a lost connection inside the first publish for up to
    ``broker_connection_timeout`` (4 s by default, with 2 s sleeps): a tick would stall there
    while the broker is down. Failing at once keeps the loop turning (D3): the runs stay
    decided and are tried again after ``min(check interval, 5 s)``.
    """
    connection = getattr(producer, "connection", None)
    ensure = getattr(connection, "ensure_connection", None)
    if ensure is None:
        return
    hosts = len(getattr(connection, "alt", None) or ()) or 1
    ensure(max_retries=hosts - 1, interval_start=0, interval_step=0, interval_max=0)


def content_rule_next(state: ScheduleState, now: datetime) -> datetime | None:
    """The rule's first due time after ``now`` (what D4 logs next)."""
    assert state.content is not None
    return state.content.rule.next_after(now, anchor=state.anchor)
