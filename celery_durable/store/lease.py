"""A named lease in the journal's database: which dispatcher does the work (D6).

Several beat processes may run against one journal. Correctness never depends on the lease —
the journal's ``(stream, version)`` constraint decides every due time once (A8) — but without
it each beat would enqueue every decided run. The holder renews the lease on every tick; when
it dies, another takes over once the lease expires. Times come from each process's clock, so
hosts need synchronised clocks (NTP); the default 10 s lease tolerates small skews.

Beside the lease row the holder keeps a heartbeat row (O3): when it took the lease and when
it last completed a tick. ``celery durable health`` reads both (:func:`read_lease`).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from celery_durable.store.journal.errors import translating
from celery_durable.store.journal.schema import heartbeats, leases
from celery_durable.store.journal.sql import SqlJournal

log = logging.getLogger("celery_durable.lease")


def default_owner() -> str:
    """A name unique to this process: host, PID and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@translating
class Lease:
    """Acquire, renew and release one named lease."""

    def __init__(self, journal: SqlJournal, name: str, owner: str, ttl: float) -> None:
        self.journal = journal
        self.name = name
        self.owner = owner
        self.ttl = timedelta(seconds=ttl)
        self.held = False
        self.expires_at: datetime | None = None
        self.last_tick: datetime | None = None
        """When this holder last completed a tick; stored with the next renewal (O3)."""
        self._tick_stored = False

    def hold(self, now: datetime) -> bool:
        """Take or renew the lease at ``now``; ``True`` while this owner holds it."""
        expires = now + self.ttl
        table = leases
        if self.held and self.expires_at is not None and self.expires_at - now > self.ttl / 2:
            return True  # renewed recently: no write on every tick
        if not self.held:
            # A standby polls every second: read first, write only when the lease is free.
            self.journal.ensure_ready()
            with self.journal.engine.connect() as conn:
                row = conn.execute(
                    select(table.c.owner, table.c.expires_at).where(table.c.name == self.name)
                ).first()
            if row is not None and row.owner != self.owner and row.expires_at >= now:
                return False
        was = self.held
        with self.journal.transaction() as conn:
            taken = conn.execute(
                update(table)
                .where(
                    table.c.name == self.name,
                    (table.c.owner == self.owner) | (table.c.expires_at < now),
                )
                .values(owner=self.owner, expires_at=expires)
            ).rowcount
            if taken:
                self._beat(conn, now, taking=not was)
        if not taken:
            try:
                with self.journal.transaction() as conn:
                    conn.execute(
                        insert(table).values(name=self.name, owner=self.owner, expires_at=expires)
                    )
                    self._beat(conn, now, taking=True)
                taken = 1
            except IntegrityError:
                taken = 0
        self.held = bool(taken)
        self.expires_at = expires if self.held else None
        if self.held and not was:
            log.info("dispatcher lease %r taken by %s", self.name, self.owner)
        elif was and not self.held:
            log.warning("dispatcher lease %r lost by %s", self.name, self.owner)
        return self.held

    def ticked(self, now: datetime) -> None:
        """Note a completed tick: stored with the next renewal, at once after taking the lease.

        So the heartbeat costs no write of its own, except once per taking (a health check
        right after start-up then sees the first tick, not a missing one).
        """
        self.last_tick = now
        if self.held and not self._tick_stored:
            with self.journal.transaction() as conn:
                self._beat(conn, now, taking=False)

    def _beat(self, conn: Connection, now: datetime, *, taking: bool) -> None:
        """Write the heartbeat row in the lease's transaction (O3)."""
        if taking:
            self.last_tick = None
            values = {"owner": self.owner, "taken_at": now, "ticked_at": None}
        else:
            values = {"ticked_at": self.last_tick}
        self._tick_stored = self.last_tick is not None
        where = heartbeats.c.name == self.name
        if not taking:
            where &= heartbeats.c.owner == self.owner
        if conn.execute(update(heartbeats).where(where).values(**values)).rowcount == 0 and taking:
            conn.execute(insert(heartbeats).values(name=self.name, **values))

    def release(self) -> None:
        """Give the lease up so another process takes over at once."""
        if not self.held:
            return
        self.held = False
        self.expires_at = None
        with self.journal.transaction() as conn:
            conn.execute(
                delete(leases).where(leases.c.name == self.name, leases.c.owner == self.owner)
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseFacts:
    """A lease as stored: its holder, expiry, and the holder's heartbeat (O3)."""

    owner: str
    expires_at: datetime
    taken_at: datetime | None = None
    """When ``owner`` took the lease (``None``: the holder predates heartbeats)."""
    ticked_at: datetime | None = None
    """When ``owner`` last completed a tick, as of its last renewal."""


@translating
def read_lease(journal: SqlJournal, name: str = "dispatcher") -> LeaseFacts | None:
    """The stored lease ``name`` and its holder's heartbeat; ``None`` when nobody holds it."""
    journal.ensure_ready()
    with journal.engine.connect() as conn:
        row = conn.execute(
            select(leases.c.owner, leases.c.expires_at).where(leases.c.name == name)
        ).first()
        if row is None:
            return None
        beat = conn.execute(
            select(heartbeats.c.taken_at, heartbeats.c.ticked_at).where(
                heartbeats.c.name == name, heartbeats.c.owner == row.owner
            )
        ).first()
    return LeaseFacts(
        owner=row.owner,
        expires_at=row.expires_at,
        taken_at=None if beat is None else beat.taken_at,
        ticked_at=None if beat is None else beat.ticked_at,
    )
