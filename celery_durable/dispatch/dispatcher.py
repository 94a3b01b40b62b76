"""The dispatcher: decide what is due, store the decision, enqueue, store the start (SPEC §5).

One :meth:`Dispatcher.tick` at a time, from the beat loop or from a test with a fake clock:

1. Hold the lease (D6); a standby only polls it.
2. Fold the schedule events stored since the last tick into the index (D2) — this is also how
   schedules created or changed by other processes are seen within a tick (D3).
3. For each schedule whose attention time has come, ask the aggregate (C1–C3, A2, A3, R5, R6)
   and append its decisions: many schedules per transaction (A6, A8).
4. Enqueue every decided run with ``task_id = run ID`` (S2, S3), then append the starts.
   A broker failure leaves the run decided; it is tried again after ``min(check, 5 s)``.

The policy lives in the aggregate; this module is the loop. Its collaborators, one job each:
:class:`~.state.StateCache` (states, attention heap, index checkpoints),
:class:`~.recorder.Recorder` (decide and append, the writer thread),
:class:`~.publisher.Publisher` (messages and enqueueing) and
:class:`~.resender.Resender` (stalled and woken durable runs).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from celery_durable.blackouts import BlackoutWatch, import_setting
from celery_durable.core.rules import LiveSchedules
from celery_durable.core.schedule_aggregate import (
    Command,
    DecideDue,
    MarkFailedToStart,
    MarkStarted,
    ScheduleState,
)
from celery_durable.core.schedule_events import RunsMissed
from celery_durable.dispatch.pruning import PruneJob
from celery_durable.dispatch.publisher import Publisher
from celery_durable.dispatch.recorder import Recorder, Recording, Stored
from celery_durable.dispatch.resender import Resender
from celery_durable.dispatch.state_cache import WINDOW_AHEAD, StateCache
from celery_durable.message import Resend
from celery_durable.observability import signals
from celery_durable.store.lease import default_owner
from celery_durable.store.stores import AnyLease, AnyLeases

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from celery_durable.runtime import Runtime

log = logging.getLogger("celery_durable.dispatcher")

CHUNK = 1000
"""Schedules decided, sent and recorded per round: bounds transaction size and latency."""

BURST_GC_THRESHOLD = 50_000
"""The collector's first threshold while a burst is dispatched (Python's default is 700)."""

MIN_SLEEP = 0.02
"""The shortest sleep between ticks (seconds)."""


class Dispatcher:
    """Decides and enqueues the due runs of every schedule in one journal.

    Build it with ``durable.dispatcher()``; call :meth:`tick` repeatedly. ``tick`` returns the
    seconds to sleep before the next call.
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        owner: str | None = None,
        lease_ttl: float | None = None,
        poll_interval: float | None = None,
    ) -> None:
        self.runtime = runtime
        self.app = runtime.app
        config = runtime.config
        self.check_interval = config.check_interval
        self.retry_delay = timedelta(seconds=min(config.check_interval, 5.0))
        self.poll_interval = min(poll_interval or config.poll_interval, config.check_interval)
        self.owner = owner or default_owner()
        self.lease_ttl = lease_ttl or config.leader_lease
        self.partitions = 1
        """The journal's partition count (D10), read from the journal at the first tick."""
        self._leases: AnyLeases | None = None
        self.held: frozenset[int] = frozenset()
        """The partitions whose schedules are in the cache now (D10)."""
        self.live = runtime.beat_objects  # BeatEntry rules ask them (B3)
        store = runtime.store
        self.index = store.schedule_index(self.live)
        self.run_lease = config.run_lease
        self.runs = store.run_table()
        self.cache = StateCache(runtime.journal, self.index)
        self.blackouts = BlackoutWatch(runtime.journal)  # P4: the global windows
        self._setting_imported = False
        self.recorder = Recorder(
            runtime.store,
            self.cache,
            runtime.now,
            run_lease=self.run_lease,
        )
        self.late_after = config.late_after
        self.publisher = Publisher(self.app, self.retry_delay)
        self.resender = Resender(
            self.app,
            self.runs,
            poll_interval=self.poll_interval,
            run_lease=self.run_lease,
            mine=self._mine,
        )
        self.pruning = PruneJob(runtime, self.index)  # O1, in the background
        self._loaded = False
        self._missed = 0

    @property
    def leases(self) -> AnyLeases:
        """This beat's partition leases; the first use reads the partition count (D10)."""
        if self._leases is None:
            runtime = self.runtime
            store = runtime.store
            count = store.resolve_partitions(runtime.config.partitions, runtime.now())
            self.partitions = count
            self.index.use_partitions(count)
            self.resender.share(count)
            # A joining beat gets its share within two lease periods (D10).
            poll = min(self.poll_interval, self.lease_ttl / 4)
            self._leases = store.partition_leases(self.owner, self.lease_ttl, count, poll)
            self.pruning.use_lease(self._leases.leases[0])
        return self._leases

    @property
    def lease(self) -> AnyLease:
        """Partition 0's lease: D6's only lease with one partition; its holder prunes (O1)."""
        return self.leases.leases[0]

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
        now = self.runtime.now()
        held = self.leases.hold(now)
        if not held:
            self._loaded = False  # another process works; our caches go stale
            self.held = held
            return self.poll_interval
        if held != self.held:
            if self._loaded:
                log.info("partitions held now: %s", _shown(held))
            self._loaded = False  # another share: read its rows and events (D10)
        if not self._setting_imported:
            # durable_blackouts applies without beat too (durable.dispatcher(), SPEC §8);
            # beat brought it in at its start already, so there this stores nothing (P4).
            import_setting(self.runtime)
            self._setting_imported = True
        if not self._loaded:
            self.load(now)
        else:
            self.refresh(now)
        due = self.cache.pop_due(now)
        self._missed = 0
        recording: Recording | None = None
        burst = len(due) > CHUNK
        thresholds = gc.get_threshold()
        if burst:
            # Every object alive now outlives the burst; hidden from the collector meanwhile,
            # it is not scanned again by each full collection the burst's allocations trigger
            # (about 5 % of a 10,000-run burst). Given back afterwards: nothing is kept alive.
            gc.freeze()
            # Most of what a burst allocates is freed by reference counting or kept (the
            # states): fewer young collections scan it (another 3-4 % of its CPU).
            gc.set_threshold(max(thresholds[0], BURST_GC_THRESHOLD), *thresholds[1:])
        try:
            for start in range(0, len(due), CHUNK):
                # A fresh time per chunk: a long burst does not decide its last chunk late.
                chunk_now = now if start == 0 else self.runtime.now()
                if start and not self.leases.fresh(chunk_now):
                    # Fencing: a lease was lost mid-burst; stop before another holder starts.
                    self._loaded = False
                    break
                sids = due[start : start + CHUNK]
                starts, durable_runs = self._decide_and_send(sids, chunk_now)
                if recording is not None:
                    self._finish(recording)
                    recording = None
                more = start + CHUNK < len(due)
                recording = self.recorder.record(
                    sids, starts, durable_runs, chunk_now, background=more, rows=not burst
                )
            if recording is not None:
                self._finish(recording)
                recording = None
            if burst:  # the index rows of the burst, once its last start is stored (D2)
                self.cache.write_rows(due, self.runtime.now())
        finally:
            try:
                if recording is not None:  # a round failed: wait for the one in flight
                    self._finish(recording)
            finally:
                if burst:
                    gc.set_threshold(*thresholds)
                    gc.unfreeze()
        if self._missed:
            log.warning(
                "%d schedule(s) dropped missed due times by their catch-up policy", self._missed
            )
        self.resender.resend(now)
        self.pruning.poke(now)
        # Idle until the next due time: read the states of what is due then (D13).
        self.cache.read_states_ahead(self.runtime.now() + WINDOW_AHEAD, self.runtime.now)
        done = self.runtime.now()
        self.leases.ticked(done)  # the heartbeats `celery durable health` reads (O3)
        return self._sleep_after(done)

    def load(self, now: datetime) -> None:
        """Read the index and the events stored since (C4); nothing is decided before this.

        With several partitions, only the rows and events of those held (D10).
        """
        held = self.leases.held
        self.cache.load(now, None if self.partitions == 1 else held)
        self.held = held
        self._loaded = True

    def _mine(self, schedule_id: str) -> bool:
        """Whether a schedule is in a partition this beat holds (D8's re-sends, D10)."""
        return self.partitions == 1 or self.index.mine(schedule_id, self.leases.held)

    def refresh(self, now: datetime) -> None:
        """Fold the schedule events stored since the last read; write the rows that lag."""
        self.cache.refresh(now)

    def invalidate(self) -> None:
        """Forget the cached states: the next tick reads the index and the events again."""
        self._loaded = False

    # Deciding and sending ----------------------------------------------------------------------

    def _decide_and_send(
        self, sids: Sequence[str], now: datetime
    ) -> tuple[dict[str, list[Command]], list[Resend]]:
        """Decide and store the due runs of these schedules, then enqueue them.

        Returns the commands that record each run's start (or failure to start) and the
        durable runs that were sent (their rows go in with the starts).
        """
        states = self.cache.states_of(sids)
        publisher = self.publisher
        due = DecideDue(now=now, live=self.live, blackouts=self.blackouts.current(now))
        decisions: dict[str, list[Command]] = {
            sid: [due] for sid in sids if not publisher.task_missing(states[sid], now, self.live)
        }
        self._announce(self.recorder.append(decisions))
        self.runtime.fault("after-decide")  # crash tests: decided, not yet sent (A6)
        sendable = [
            (sid, p)
            for sid in sids
            for p in self.cache.states[sid].sendable()
            if publisher.may_send(p.run_id, now) and p.send_time <= now  # P2: jittered
        ]
        starts: dict[str, list[Command]] = {}
        durable_runs: list[Resend] = []
        for sid, pending, outcome in publisher.send(sendable, now, batch_size=CHUNK):
            command: Command
            if isinstance(outcome, str):
                command = MarkFailedToStart(due=pending.due, error=outcome, now=now)
            else:
                command = MarkStarted(due=pending.due, now=now)
                if outcome is not None:
                    durable_runs.append(outcome)
            starts.setdefault(sid, []).append(command)
        return starts, durable_runs

    def _finish(self, recording: Recording) -> None:
        """Wait for a round's starts (raising what storing them raised), then re-watch."""
        self._announce(recording.future.result())
        for sid in recording.sids:
            self.cache.watch(sid, self._attention_now(sid, recording.now))

    def _announce(self, stored: Stored) -> None:
        """Log and signal what a round stored (O4 lateness); count dropped due times."""
        for sid, event in stored:
            signals.announce(self, sid, event, late_after=self.late_after)
            self._missed += isinstance(event, RunsMissed)

    def _attention_now(self, sid: str, now: datetime) -> datetime | None:
        state = self.cache.states[sid]
        retry_at: dict[str, datetime] = {}
        waits: list[datetime] = []
        if state.pending:  # else (a burst's every run, once started) nothing waits to be sent
            retry_at = self.publisher.retries_of(state)
            sendable = state.sendable()
            waits = [retry_at[p.run_id] for p in sendable if p.run_id in retry_at]
            unsent = [p.send_time for p in sendable if p.run_id not in retry_at]
            if unsent and min(unsent) <= now:
                return min(unsent)
        if self.publisher.task_gone(state):
            nxt = content_rule_next(state, now, self.live)
            # D4: look again at the next due time (to log it), and soon in case the task returns.
            later = now + timedelta(seconds=self.poll_interval)
            return min(nxt, later) if nxt is not None and nxt > now else later
        # jittered sends (P2), held deadlines (P1); with nothing decided, the rule's next due time
        following = (
            state.attention(retry_at, self.live) if state.pending else state.next_due(self.live)
        )
        candidates = [*waits, *([following] if following is not None else [])]
        return min(candidates) if candidates else None

    def _sleep_after(self, now: datetime) -> float:
        first = self.cache.first_attention()
        wait = self.poll_interval
        if first is not None:
            wait = min(wait, (first - now).total_seconds())
        # Never spin: due times closer together than this are decided together, so that the
        # per-tick costs (a poll, two commits) are shared when thousands are due per second.
        return max(wait, MIN_SLEEP)

    # Reads for tools and tests ------------------------------------------------------------------

    @property
    def next_attention(self) -> datetime | None:
        """The earliest moment a schedule needs the dispatcher."""
        return self.cache.next_attention

    @property
    def _writer(self) -> ThreadPoolExecutor | None:
        """The recorder's writer thread, once a burst started it."""
        return self.recorder.writer

    def close(self) -> None:
        """Write the lagging index rows, give up the lease; calling it twice is harmless."""
        self.pruning.close()
        self.recorder.close()
        if self._loaded:
            try:
                self.cache.checkpoint_soon()
                self.refresh(self.runtime.now())
            except Exception:  # the rows are a cache: start-up reads the events instead
                log.warning("could not write the index rows on close", exc_info=True)
        try:
            if self._leases is not None:
                self._leases.release()
        except Exception:  # closing must not fail on a journal that is away
            log.warning("could not release the dispatcher leases", exc_info=True)


def _shown(held: frozenset[int]) -> str:
    return ", ".join(map(str, sorted(held))) or "none"


def content_rule_next(
    state: ScheduleState, now: datetime, live: LiveSchedules | None = None
) -> datetime | None:
    """The rule's first due time after ``now`` (what D4 logs next)."""
    assert state.content is not None
    return state.content.rule.next_after(now, anchor=state.anchor, live=live)
