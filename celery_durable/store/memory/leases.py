"""The dispatcher lease in memory (D6): which of this process's dispatchers does the work.

The same rules as :class:`~celery_durable.store.lease.Lease` on one stored row per name: the
holder renews it, another owner takes it once it expired, a release frees it at once. A memory
store has one partition (D10), so a dispatcher holds one lease, partition 0's.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from celery_durable.core.partitions import DISPATCHER

if TYPE_CHECKING:
    from celery_durable.store.memory import MemoryStore


class MemoryLease:
    """Acquire, renew and release one named lease of a memory store."""

    def __init__(self, store: MemoryStore, name: str, owner: str, ttl: float) -> None:
        self._store = store
        self.name = name
        self.owner = owner
        self.ttl = timedelta(seconds=ttl)
        self.held = False
        self.expires_at: datetime | None = None
        self.last_tick: datetime | None = None

    def hold(self, now: datetime) -> bool:
        """Take or renew the lease at ``now``; ``True`` while this owner holds it."""
        if self.held and self.expires_at is not None and self.expires_at - now > self.ttl / 2:
            return True  # renewed recently (as the SQL lease: no write on every tick)
        with self._store.lock:
            found = self._store.leases.get(self.name)
            if found is None or found[0] == self.owner or found[1] < now:
                self._store.leases[self.name] = (self.owner, now + self.ttl)
                self.held, self.expires_at = True, now + self.ttl
            else:
                self.held, self.expires_at = False, None
        return self.held

    def release(self) -> None:
        """Give the lease up so another dispatcher takes over at once."""
        if not self.held:
            return
        self.held, self.expires_at = False, None
        with self._store.lock:
            found = self._store.leases.get(self.name)
            if found is not None and found[0] == self.owner:
                del self._store.leases[self.name]


class MemoryLeases:
    """A dispatcher's leases on a memory store: partition 0's alone (D6, D10)."""

    def __init__(self, store: MemoryStore, owner: str, ttl: float) -> None:
        self.leases = {0: MemoryLease(store, DISPATCHER, owner, ttl)}

    @property
    def held(self) -> frozenset[int]:
        """The partitions this dispatcher holds, as of its last renewal."""
        return frozenset(k for k, lease in self.leases.items() if lease.held)

    def hold(self, now: datetime) -> frozenset[int]:
        """Renew or take the lease; the partitions this dispatcher may work."""
        self.leases[0].hold(now)
        return self.held

    def fresh(self, now: datetime) -> bool:
        """Renew the held lease; ``False`` when it was lost meanwhile (fencing)."""
        before = self.held
        for k in before:
            self.leases[k].hold(now)
        return self.held == before

    def ticked(self, now: datetime) -> None:
        """Note a completed tick (a memory store keeps no heartbeat row)."""
        for lease in self.leases.values():
            if lease.held:
                lease.last_tick = now

    def release(self, partitions: Iterable[int] | None = None) -> None:
        """Give the lease up so another dispatcher takes over at once."""
        for k, lease in self.leases.items():
            if partitions is None or k in partitions:
                lease.release()


__all__ = ["MemoryLease", "MemoryLeases"]
