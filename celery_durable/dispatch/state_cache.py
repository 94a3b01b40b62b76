"""The dispatcher's cache of schedule states, their attention times, and index checkpoints (D2).

The cache holds the folded state of every schedule the dispatcher has looked at, the moment
each next needs attention (a heap keyed by that moment), and the read position of the index
projection. Reads come from the index rows and the events stored after them; the rows that lag
behind the cache are written at checkpoints, at most every :data:`INDEX_CHECKPOINT`.

The heap holds the due times read so far: those of the index rows up to a horizon, read a
:data:`WINDOW` at a time as the clock reaches it (a beat with a million schedules reads the few
due soon at start-up, D13), and those of every cached state. A row past the horizon whose
schedule is cached is never read again: the cached state is newer than the row.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from operator import itemgetter

from celery_durable.core.ids import schedule_stream
from celery_durable.core.schedule_aggregate import ScheduleState
from celery_durable.store.index import (
    UnreadableEntry,
    attention_of,
    fold_stored,
    stream_schedule_id,
)
from celery_durable.store.snapshots import fold_stream
from celery_durable.store.stores import AnyIndex, AnyJournal

log = logging.getLogger("celery_durable.dispatcher")

WINDOW = timedelta(seconds=60)
"""The due times whose index rows one read brings into the attention heap (D13): start-up
reads the rows due within this of the clock's time, not every schedule's."""

WINDOW_AHEAD = timedelta(seconds=2)
"""How long before the next window's first due time the dispatcher reads it, and before a
schedule's due time it reads the schedule's state from its row, so that neither read delays
the runs due then."""

STATES_AHEAD_BATCH = 1000
"""Index rows read per query when states are read ahead of their due times."""

INDEX_CHECKPOINT = timedelta(seconds=1)
"""How often the projection's read position is saved with the rows that lag behind it (D2).

A crash loses nothing: start-up reads the events stored after the saved position, at most
this interval's worth more.
"""


_due = itemgetter(0)
"""The due time of a ``(due, schedule_id)`` pair."""


class StateCache:
    """Schedule states in memory, the attention heap, and the index rows that lag behind them.

    ``states`` maps a schedule ID to its folded state; ``row_version`` the version of its
    index row. The writer thread stores the states of the round it records (disjoint keys);
    everything else runs in the dispatcher's thread.
    """

    def __init__(self, journal: AnyJournal, index: AnyIndex) -> None:
        self.journal = journal
        self.index = index
        self.states: dict[str, ScheduleState] = {}
        self.row_version: dict[str, int] = {}
        self.position = 0
        self._dirty: set[str] = set()
        self._next_checkpoint: datetime | None = None
        self._attention: dict[str, datetime] = {}
        self._heap: list[tuple[datetime, str]] = []
        self._horizon: datetime | None = None
        """The index rows due up to this are in the heap (or their schedule is cached)."""
        self._beyond: datetime | None = None
        """The earliest ``next_due`` of a row past the horizon; ``None``: no row is due later."""
        self._unread: deque[tuple[datetime, str]] = deque()
        """``(next_due, schedule_id)`` of the rows read into the heap, earliest first, whose
        states are read ahead of that time (:meth:`read_states_ahead`)."""
        self.held: frozenset[int] | None = None
        """The partitions this cache keeps (D10); ``None``: every schedule."""

    # Reading the index and the events ------------------------------------------------------

    def load(self, now: datetime, held: frozenset[int] | None = None) -> None:
        """Read the index and the events stored since (C4); nothing is decided before this.

        ``held``: read only these partitions' rows and events (D10); ``None``: all.
        """
        self.held = held
        if self.index.needs_rebuild():
            self.index.rebuild(now)
        self.states.clear()
        self.row_version.clear()
        self._dirty.clear()
        self._heap.clear()
        self._attention.clear()
        self._unread.clear()
        self.position = self.index.position(held=held)
        self._read_window(None, now + WINDOW)
        self.refresh(now)

    def refresh(self, now: datetime) -> None:
        """Fold the schedule events stored since the last read; write the rows that lag.

        Rows changed by other processes (a schedule created or changed through the API) are
        written at once. The dispatcher's own appends mostly wrote their rows with the starts;
        the few that did not (a decision with nothing to send), and the read position itself,
        wait for the next checkpoint (:data:`INDEX_CHECKPOINT`).
        """
        read = self.index.events_after(self.position)
        held, index = self.held, self.index
        events = (
            read
            if held is None
            else [e for e in read if index.mine(stream_schedule_id(e.stream), held)]
        )
        if not events:
            if read:
                self.position = read[-1].position
            if (self._dirty or read) and self._checkpoint_due(now):
                self.checkpoint(now)
            return
        sids = {e.stream.split("/", 1)[1] for e in events}
        try:
            adopted = self.index.load([s for s in sids if s not in self.states])
            self.adopt(adopted)
        except UnreadableEntry as exc:
            log.warning("%s: rebuilding the index", exc)
            self.states.clear()
            self.row_version.clear()
            self._dirty.clear()
            rebuilt = self.index.rebuild(now)
            self.adopt({s: st for s, st in rebuilt.items() if index.mine(s, held)})
            self.position = self.index.position(held=held)
            self._heap.clear()
            self._attention.clear()
            self._horizon = self._beyond = None  # every state is cached: no row to read
            self._unread.clear()
            for sid, state in self.states.items():
                self.watch(sid, attention_of(state, self.index.live))
            return
        changed = fold_stored(self.states, events, self.index.snapshots.state)
        self.position = read[-1].position
        self._dirty.update(sids)
        if changed or self._checkpoint_due(now):
            self.checkpoint(now)
        # A schedule cached now is watched by its state from now on, even one its events did
        # not change: its row may lie past the horizon, never to be read again.
        for sid in changed.union(adopted):
            self.watch(sid, attention_of(self.states[sid], self.index.live))

    def _checkpoint_due(self, now: datetime) -> bool:
        return self._next_checkpoint is None or now >= self._next_checkpoint

    def checkpoint(self, now: datetime) -> None:
        """Write every lagging index row and the read position, in one transaction (D2)."""
        lagging = [
            s
            for s in self._dirty
            if s in self.states and self.row_version.get(s, -1) < self.states[s].version
        ]
        self.index.save([self.states[s] for s in lagging], self.position, now, self.held)
        for sid in lagging:
            self.row_version[sid] = self.states[sid].version
        self._dirty.clear()
        self._next_checkpoint = now + INDEX_CHECKPOINT

    def checkpoint_soon(self) -> None:
        """Make the next :meth:`refresh` write the lagging rows (on close)."""
        self._next_checkpoint = None

    def write_rows(self, sids: Sequence[str], now: datetime) -> None:
        """Bring the index rows of these schedules up to their state (after a burst)."""
        states = [self.states[s] for s in sids if s in self.states]
        self.index.save(states, self.position, now, self.held)
        for state in states:
            self.row_version[state.schedule_id] = state.version

    # Single schedules ------------------------------------------------------------------------

    def states_of(self, sids: Sequence[str]) -> dict[str, ScheduleState]:
        """The states of these schedules, read from their index rows when not cached."""
        missing = [s for s in sids if s not in self.states]
        if missing:
            self.adopt(self.index.load(missing))
            for sid in missing:
                self.states.setdefault(sid, ScheduleState(schedule_id=sid))
        return {sid: self.states[sid] for sid in sids}

    def adopt(self, states: dict[str, ScheduleState]) -> None:
        """Cache states read from index rows (which are therefore at their version)."""
        self.states.update(states)
        for sid, state in states.items():
            self.row_version[sid] = state.version

    def appended(self, sid: str, state: ScheduleState, *, row_written: bool) -> None:
        """The state after events this process appended (its index row written in the same
        transaction when ``row_written``)."""
        self.states[sid] = state
        if row_written:
            self.row_version[sid] = state.version

    def reload(self, sid: str) -> None:
        """Fold the events another process appended to this schedule (after a conflict)."""
        state = self.states.get(sid) or ScheduleState(schedule_id=sid)
        tail = self.journal.read_stream(schedule_stream(sid), after_version=state.version)
        self.states[sid] = fold_stream(state, tail, self.index.snapshots.state)

    # Attention ---------------------------------------------------------------------------------

    def watch(self, sid: str, when: datetime | None) -> None:
        """Look at this schedule again at ``when`` (never, for ``None``)."""
        if when is None:
            self._attention.pop(sid, None)
            return
        if self._attention.get(sid) != when:
            self._attention[sid] = when
            heapq.heappush(self._heap, (when, sid))

    def _watch_all(self, pairs: Sequence[tuple[datetime, str]]) -> None:
        """:meth:`watch` of each ``(when, sid)`` of ``pairs``, which outnumber the heap when a
        beat starts: then added at once with one ``heapify`` instead of a push each (D13).
        (``watch`` keeps its own three lines: it runs once per decided run.)"""
        attention, heap = self._attention, self._heap
        fresh = [(when, sid) for when, sid in pairs if attention.get(sid) != when]
        attention.update((sid, when) for when, sid in fresh)
        if len(fresh) > len(heap):
            heap.extend(fresh)
            heapq.heapify(heap)
        else:
            for item in fresh:
                heapq.heappush(heap, item)

    def _read_window(self, after: datetime | None, upto: datetime) -> None:
        """Put the due times of the index rows in ``(after, upto]`` on the heap, except those
        of cached schedules (their state is newer than their row)."""
        rows, self._beyond = self.index.attention_window(after, upto, self.held)
        self._horizon = upto
        states = self.states
        # Sorted by the due time alone (stable; the heap orders equal times by ID itself): the
        # rows of a burst share one due time, and comparing their IDs as well made this sort
        # most of the heap's 0.2 s at the start of a 100,000-schedule burst (D13, 2026-12-06).
        unread = sorted(((when, sid) for sid, when in rows if sid not in states), key=_due)
        self._watch_all(unread)
        self._unread.extend(unread)  # the windows follow each other: still earliest first

    def read_states_ahead(self, until: datetime, clock: Callable[[], datetime]) -> None:
        """Read from their index rows the states of the schedules due by ``until`` that are not
        cached, a batch at a time, while nothing is due (the clock has not reached the
        earliest attention time): at their due time they are decided without a read.

        A burst due at midnight, say, has its states in memory when midnight comes."""
        unread, states = self._unread, self.states
        while unread and unread[0][0] <= until:
            if self._heap and self._heap[0][0] <= clock():
                return  # something is due: the dispatcher reads what it needs itself
            batch: list[str] = []
            while unread and unread[0][0] <= until and len(batch) < STATES_AHEAD_BATCH:
                sid = unread.popleft()[1]
                if sid not in states:
                    batch.append(sid)
            if batch:
                self.states_of(batch)
                for sid in batch:  # cached: followed by its state from now on
                    self.watch(sid, attention_of(states[sid], self.index.live))

    def _read_ahead(self, now: datetime) -> None:
        """Read the windows of index rows whose first due time is this close
        (:data:`WINDOW_AHEAD`)."""
        until = now + WINDOW_AHEAD
        while self._beyond is not None and self._beyond <= until:
            self._read_window(self._horizon, max(until, self._beyond + WINDOW))

    def pop_due(self, now: datetime) -> list[str]:
        """The schedules whose attention time has come, each once, earliest first.

        They are off the heap until :meth:`watch` puts them back (the dispatcher does, for
        every schedule of a round, when the round ends): a schedule whose round decided
        nothing, and so keeps its attention time, is looked at again.
        """
        self._read_ahead(now)
        due: list[str] = []
        while self._heap and self._heap[0][0] <= now:
            when, sid = heapq.heappop(self._heap)
            if self._attention.get(sid) == when:
                del self._attention[sid]
                due.append(sid)
        return due

    def first_attention(self) -> datetime | None:
        """When the dispatcher must next look: the earliest attention time on the heap
        (dropping entries that were replaced), or the moment to read the next window or the
        states of the schedules due next (:data:`WINDOW_AHEAD` before)."""
        while self._heap and self._attention.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        first = self._heap[0][0] if self._heap else None
        unread, states = self._unread, self.states
        while unread and unread[0][1] in states:
            unread.popleft()
        window_read = None if self._beyond is None else self._beyond - WINDOW_AHEAD
        states_read = unread[0][0] - WINDOW_AHEAD if unread else None
        return min((t for t in (first, window_read, states_read) if t is not None), default=None)

    @property
    def watching(self) -> frozenset[str]:
        """The schedules whose attention times are on the heap now."""
        return frozenset(self._attention)

    @property
    def next_attention(self) -> datetime | None:
        """The earliest moment a schedule needs the dispatcher."""
        first = min(self._attention.values(), default=None)
        if self._beyond is None or (first is not None and first <= self._beyond):
            return first
        return self._beyond
