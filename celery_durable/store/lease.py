"""A named lease in the journal's database: which dispatcher does the work (D6).

Several beat processes may run against one journal. Correctness never depends on the lease —
the journal's ``(stream, version)`` constraint decides every due time once (A8) — but without
it each beat would enqueue every decided run. The holder renews the lease on every tick; when
it dies, another takes over once the lease expires. Times come from each process's clock, so
hosts need synchronised clocks (NTP); the default 10 s lease tolerates small skews.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from datetime import datetime, timedelta

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from celery_durable.store.journal.schema import leases
from celery_durable.store.journal.sql import SqlJournal

log = logging.getLogger("celery_durable.lease")


def default_owner() -> str:
    """A name unique to this process: host, PID and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Lease:
    """Acquire, renew and release one named lease."""

    def __init__(self, journal: SqlJournal, name: str, owner: str, ttl: float) -> None:
        self.journal = journal
        self.name = name
        self.owner = owner
        self.ttl = timedelta(seconds=ttl)
        self.held = False
        self.expires_at: datetime | None = None

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
        with self.journal.transaction() as conn:
            taken = conn.execute(
                update(table)
                .where(
                    table.c.name == self.name,
                    (table.c.owner == self.owner) | (table.c.expires_at < now),
                )
                .values(owner=self.owner, expires_at=expires)
            ).rowcount
        if not taken:
            try:
                with self.journal.transaction() as conn:
                    conn.execute(
                        insert(table).values(name=self.name, owner=self.owner, expires_at=expires)
                    )
                taken = 1
            except IntegrityError:
                taken = 0
        was = self.held
        self.held = bool(taken)
        self.expires_at = expires if self.held else None
        if self.held and not was:
            log.info("dispatcher lease %r taken by %s", self.name, self.owner)
        elif was and not self.held:
            log.warning("dispatcher lease %r lost by %s", self.name, self.owner)
        return self.held

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
