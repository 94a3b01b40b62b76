"""The working dispatcher's retention passes (O1), in a background thread.

Deciding never waits for a pass: the tick only starts one (at most every
``durable_prune_interval``, the first one interval after start-up) and returns. The pass works
in batches of ``durable_prune_batch`` rows, each one short transaction, and stops before the
next batch when this process no longer holds the dispatcher lease (another beat took over) or
the dispatcher closes. The job keeps the pass's :class:`TailMemory`: the first pass reads the
whole journal once, later ones only what was stored since, plus the late records remembered.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta

from celery_durable.errors import JournalError
from celery_durable.runtime import Runtime
from celery_durable.store.index import ScheduleIndex
from celery_durable.store.retention import Pruner, PruneReport, TailMemory
from celery_durable.store.sql_store import SqlStore
from celery_durable.store.stores import AnyIndex, AnyLease

__all__ = ["PruneJob"]

log = logging.getLogger("celery_durable.dispatcher")

BATCH_PAUSE = 0.02
"""Seconds between two batches: on SQLite the dispatcher's writes get the journal in between."""


class PruneJob:
    """Starts a retention pass when one is due; one pass at a time."""

    def __init__(self, runtime: Runtime, index: AnyIndex, lease: AnyLease | None = None) -> None:
        config = runtime.config
        store = runtime.store
        self.pruner: Pruner | None = (
            store.pruner(index, batch=config.prune_batch, fault=runtime.fault)
            if isinstance(store, SqlStore) and isinstance(index, ScheduleIndex)
            else None  # a memory store keeps everything (no retention)
        )
        self.retention = config.retention
        self.interval = timedelta(seconds=config.prune_interval)
        self.lease = lease
        """The lease whose holder prunes (the dispatcher's partition 0, D10)."""
        self.clock = runtime.now
        self.last: PruneReport | None = None
        self.tail = TailMemory()
        """How far the passes read the journal's tail, and the late records found there (O1)."""
        self._next: datetime | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()

    def use_lease(self, lease: AnyLease) -> None:
        """Prune while this lease is held (the dispatcher's partition 0, D10)."""
        self.lease = lease

    def poke(self, now: datetime) -> None:
        """Start a pass if one is due and none is running (the tick holds the lease).

        The first pass comes one interval after the first tick: start-up and its catch-up
        have the journal to themselves, and start-up reads only recent events (D2).
        """
        if self.pruner is None:
            return
        if self._next is None:
            self._next = now + self.interval
            return
        if now < self._next:
            return
        if self._thread is not None and self._thread.is_alive():
            return
        self._next = now + self.interval
        self._closing.clear()
        self._thread = threading.Thread(
            target=self._run, args=(now,), name="celery_durable-prune", daemon=True
        )
        self._thread.start()

    def _holds_lease(self) -> bool:
        lease = self.lease
        if lease is None:
            return False
        expires = lease.expires_at
        return (
            not self._closing.is_set()
            and lease.held
            and expires is not None
            and expires > self.clock()
        )

    def _run(self, now: datetime) -> None:
        if self.pruner is None:  # pragma: no cover - poke starts no pass then
            return
        try:
            self.last = self.pruner.prune(
                now, self.retention, keep_going=self._holds_lease, pause=BATCH_PAUSE, tail=self.tail
            )
        except JournalError as exc:  # away or closed: the next pass tries again
            log.warning("retention pass stopped: %s", exc)
        except Exception:  # the next pass tries again; deciding goes on meanwhile
            log.warning("retention pass failed", exc_info=True)

    def wait(self, timeout: float | None = None) -> PruneReport | None:
        """Wait for the running pass (if any) and return the last report."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self.last

    def close(self, timeout: float = 10.0) -> None:
        """Stop the running pass before its next batch and wait for it."""
        self._closing.set()
        self.wait(timeout)
