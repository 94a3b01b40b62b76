"""The journal's partition count and the beats sharing its partition leases (D10, D11).

The count is a setting of the journal (table ``celery_durable_settings``, row ``partitions``):
every process reads the same value. The first beat started with ``durable_partitions`` stores
it; a beat configured with another value refuses to start, naming both; ``celery durable
partitions set N`` changes it while no beat holds a lease. Without the setting anywhere the
journal has one partition, D6's single lease, exactly as before partitions existed.

:class:`PartitionLeases` is a beat's side: one :class:`~.lease.Lease` per partition, a
presence lease ``beat/<hash of owner>`` through which the beats see each other, and the moves
of :func:`celery_durable.core.partitions.plan` once per poll.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, insert, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from celery_durable.core.codec import dumps
from celery_durable.core.partitions import (
    DISPATCHER,
    PROJECTION,
    PartitionsError,
    check_partitions,
    lease_name,
    plan,
)
from celery_durable.store.journal.errors import translating
from celery_durable.store.journal.schema import heartbeats, leases, progress, settings
from celery_durable.store.journal.sql import SqlJournal
from celery_durable.store.lease import Lease

log = logging.getLogger("celery_durable.lease")

SETTING = "partitions"
BEAT = "beat/"
"""Name prefix of the presence leases."""


@translating
def stored_partitions(journal: SqlJournal, conn: Connection | None = None) -> int | None:
    """The partition count stored in the journal, ``None`` when none was ever stored."""
    query = select(settings.c.value).where(settings.c.name == SETTING)
    if conn is None:
        journal.ensure_ready()
        with journal.engine.connect() as c:
            text = c.execute(query).scalar()
    else:
        text = conn.execute(query).scalar()
    return None if text is None else int(text)


@translating
def partition_count(journal: SqlJournal) -> int:
    """The journal's partition count (1 when none is stored)."""
    return stored_partitions(journal) or 1


def _refuse_sqlite(journal: SqlJournal, count: int) -> None:
    if count > 1 and journal.database.serialises_writers:
        raise PartitionsError(
            f"durable_partitions = {count} needs PostgreSQL or MySQL: a SQLite journal has "
            "one writer process, so it keeps one partition (set durable_partitions = 1)"
        )


@translating
def resolve_partitions(journal: SqlJournal, configured: int | None, now: datetime) -> int:
    """The count a beat works with: the stored one, else ``configured`` (then stored).

    Refuses a configured count that differs from the stored one, naming both values and the
    command that changes it, and more than one partition on SQLite.
    """
    if configured is not None:
        _refuse_sqlite(journal, configured)
    stored = stored_partitions(journal)
    if stored is None:
        if configured is None:
            return 1
        try:
            with journal.transaction() as conn:
                if configured != 1:
                    _refuse_while_one_partition_is_worked(journal, conn, configured, now)
                conn.execute(
                    insert(settings).values(name=SETTING, value=dumps(configured), updated_at=now)
                )
            log.info("journal partitions set to %d (durable_partitions)", configured)
            return configured
        except IntegrityError:  # another beat stored it first: compare with its value
            stored = stored_partitions(journal)
            assert stored is not None
    if configured is not None and configured != stored:
        raise PartitionsError(
            f"durable_partitions is {configured} in the app's configuration but the journal "
            f"{journal.url} has {stored} partition(s); set durable_partitions = {stored}, or "
            f"stop every beat and run `celery durable partitions set {configured}`"
        )
    return stored


def _refuse_while_one_partition_is_worked(
    journal: SqlJournal, conn: Connection, configured: int, now: datetime
) -> None:
    """No count stored means one partition: while a beat holds its lease, storing another
    count would have two beats work the same schedules, so it is refused as a mismatch is."""
    holder = conn.execute(
        select(leases.c.owner).where(leases.c.name == DISPATCHER, leases.c.expires_at >= now)
    ).scalar()
    if holder is not None:
        raise PartitionsError(
            f"durable_partitions is {configured} in the app's configuration but the journal "
            f"{journal.url} has 1 partition, worked by the beat {holder!r}; set "
            f"durable_partitions = 1, or stop every beat and run "
            f"`celery durable partitions set {configured}`"
        )


def _partition_leases() -> Any:
    return or_(leases.c.name == DISPATCHER, leases.c.name.like(f"{DISPATCHER}/%"))


@dataclass(frozen=True, slots=True)
class Change:
    """What ``celery durable partitions set`` did."""

    before: int
    after: int
    position: int
    """The index position every partition continues from."""


@translating
def set_partitions(journal: SqlJournal, count: int, now: datetime) -> Change:
    """Store a new partition count; refuses while any beat holds a lease (D10).

    The index progress rows of the old partitions become one row at their lowest position,
    so every new partition reads the events it may not have folded; the old partitions'
    heartbeats go. Nothing else changes: a schedule's partition is computed from its slot.
    """
    count = check_partitions(count, "the partition count")
    _refuse_sqlite(journal, count)
    journal.ensure_ready()
    with journal.transaction() as conn:
        holders = conn.execute(
            select(leases.c.name, leases.c.owner).where(
                or_(_partition_leases(), leases.c.name.like(f"{BEAT}%")),
                leases.c.expires_at >= now,
            )
        ).all()
        if holders:
            owners = sorted({owner for _, owner in holders})
            shown = ", ".join(owners[:5]) + (" …" if len(owners) > 5 else "")
            raise PartitionsError(
                f"cannot change the partition count while beats hold leases ({shown}): stop "
                "every beat, wait for their leases to expire, then run this again"
            )
        before = stored_partitions(journal, conn) or 1
        rows = conn.execute(
            select(progress.c.name, progress.c.position).where(_projection_rows())
        ).all()
        position = min((int(p) for _, p in rows), default=0)
        if before > 1 and len(rows) < before and PROJECTION not in {n for n, _ in rows}:
            position = 0  # a partition never saved: its rows may lag everything
        conn.execute(delete(progress).where(_projection_rows()))
        if rows:
            conn.execute(insert(progress).values(name=PROJECTION, position=position))
        conn.execute(delete(leases).where(_partition_leases()))
        conn.execute(
            delete(heartbeats).where(
                or_(heartbeats.c.name == DISPATCHER, heartbeats.c.name.like(f"{DISPATCHER}/%"))
            )
        )
        value = dumps(count)
        done = conn.execute(
            update(settings).where(settings.c.name == SETTING).values(value=value, updated_at=now)
        ).rowcount
        if not done:
            conn.execute(insert(settings).values(name=SETTING, value=value, updated_at=now))
    log.info("journal partitions changed from %d to %d", before, count)
    return Change(before=before, after=count, position=position)


def _projection_rows() -> Any:
    return or_(progress.c.name == PROJECTION, progress.c.name.like(f"{PROJECTION}/%"))


def presence_name(owner: str) -> str:
    """The presence lease of a beat (a short hash: owner names may be long)."""
    return BEAT + hashlib.blake2b(owner.encode("utf-8"), digest_size=12).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRow:
    """One stored lease, with its holder's heartbeat."""

    name: str
    owner: str
    expires_at: datetime
    taken_at: datetime | None
    ticked_at: datetime | None


@translating
def read_leases(journal: SqlJournal) -> list[LeaseRow]:
    """Every partition and presence lease with its heartbeat, expired ones included."""
    journal.ensure_ready()
    query = (
        select(
            leases.c.name,
            leases.c.owner,
            leases.c.expires_at,
            heartbeats.c.taken_at,
            heartbeats.c.ticked_at,
        )
        .select_from(
            leases.outerjoin(
                heartbeats,
                (heartbeats.c.name == leases.c.name) & (heartbeats.c.owner == leases.c.owner),
            )
        )
        .where(or_(_partition_leases(), leases.c.name.like(f"{BEAT}%")))
    )
    with journal.engine.connect() as conn:
        return [LeaseRow(**row._mapping) for row in conn.execute(query)]


def partition_of_lease(name: str) -> int | None:
    """The partition of a lease name (``dispatcher`` → 0), ``None`` for a presence lease."""
    if name == DISPATCHER:
        return 0
    if name.startswith(DISPATCHER + "/"):
        return int(name.split("/", 1)[1])
    return None


@translating
class PartitionLeases:
    """A beat's partition leases: which partitions it works now (D10).

    With one partition it is D6's lease alone. With more, every call to :meth:`hold` renews
    what is held (a write at most every half lease) and, once per ``poll_interval``, reads
    the lease table and makes the moves of :func:`~celery_durable.core.partitions.plan`.
    """

    def __init__(
        self, journal: SqlJournal, owner: str, ttl: float, partitions: int, poll_interval: float
    ) -> None:
        self.journal = journal
        self.owner = owner
        self.count = partitions
        self.poll_interval = poll_interval
        self.leases = {
            k: Lease(journal, lease_name(k, partitions), owner, ttl) for k in range(partitions)
        }
        self.presence = Lease(journal, presence_name(owner), owner, ttl) if partitions > 1 else None
        self._next_look: datetime | None = None

    @property
    def held(self) -> frozenset[int]:
        """The partitions this beat holds, as of its last renewal."""
        return frozenset(k for k, lease in self.leases.items() if lease.held)

    def hold(self, now: datetime) -> frozenset[int]:
        """Renew what is held, rebalance once per poll; the partitions this beat may work."""
        if self.presence is None:
            self.leases[0].hold(now)
            return self.held
        self.presence.hold(now)
        for lease in self.leases.values():
            if lease.held:
                lease.hold(now)
        if self._next_look is None or now >= self._next_look:
            self._next_look = now + timedelta(seconds=self.poll_interval)
            self._rebalance(now)
        return self.held

    def _rebalance(self, now: datetime) -> None:
        rows = read_leases(self.journal)
        live = [r for r in rows if r.expires_at >= now]
        beats = {r.owner for r in live if r.name.startswith(BEAT)}
        holders = {}
        for r in live:
            k = partition_of_lease(r.name)
            if k is not None and k < self.count:
                holders[k] = r.owner
        moves = plan(self.owner, self.count, beats, holders)
        for k in moves.release:
            log.info("giving partition %d to a beat below its share (%s)", k, self.owner)
            self.leases[k].release()
        for k in moves.take:
            self.leases[k].hold(now)

    def fresh(self, now: datetime) -> bool:
        """Renew the held leases that are half spent; ``False`` when one was lost (fencing:
        a beat stops deciding a partition before its lease can pass to another)."""
        before = self.held
        for k in before:
            self.leases[k].hold(now)
        return self.held == before

    def ticked(self, now: datetime) -> None:
        """Note a completed tick in every held lease's heartbeat and the presence's (O3)."""
        for lease in self.leases.values():
            if lease.held:
                lease.ticked(now)
        if self.presence is not None and self.presence.held:
            self.presence.ticked(now)

    def release(self, partitions: Iterable[int] | None = None) -> None:
        """Give leases up (every one, and the presence, by default) so others take over."""
        if partitions is not None:
            for k in partitions:
                self.leases[k].release()
            return
        for lease in self.leases.values():
            lease.release()
        if self.presence is not None:
            self.presence.release()


__all__ = [
    "Change",
    "LeaseRow",
    "PartitionLeases",
    "partition_count",
    "partition_of_lease",
    "presence_name",
    "read_leases",
    "resolve_partitions",
    "set_partitions",
    "stored_partitions",
]
