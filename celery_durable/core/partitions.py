"""Partitions: which beat works which schedules (SPEC D10). Pure: no I/O, no clock.

A schedule belongs to partition ``slot_of(id) % N``. The slot is a CRC-32 of the ID's UTF-8
bytes folded into :data:`SLOTS` values, stored in the schedule index (so a beat reads only its
partitions' rows) and the same in every process and every Python version — never ``hash()``,
which is salted per process.

Sharing the leases is :func:`plan`: each live beat aims at a target (the partitions split as
evenly as the beats allow, by the sorted beat names), takes free partitions up to it, and
gives up its surplus only when another live beat is below its own target — so nothing is
handed back and forth, and nothing stays unheld while someone has room.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celery_durable.errors import DurableError

SLOTS = 65536
"""Hash values stored per schedule; a partition is ``slot % N``."""

MAX_PARTITIONS = 256
"""The most partitions a journal may have (each is a lease, renewed by its holder)."""

DISPATCHER = "dispatcher"
"""The lease name of the only partition when there is one (D6's lease, unchanged)."""

PROJECTION = "schedule_index"
"""The progress row of the index projection when there is one partition (D2)."""


class PartitionsError(DurableError, ValueError):
    """A partition count the journal cannot use, or a change it cannot make now."""


def slot_of(schedule_id: str) -> int:
    """The stable hash slot of a schedule ID (CRC-32 of its UTF-8 bytes, mod :data:`SLOTS`)."""
    return zlib.crc32(schedule_id.encode("utf-8")) % SLOTS


def partition_of(schedule_id: str, partitions: int) -> int:
    """The partition of a schedule when the journal has ``partitions`` of them."""
    return slot_of(schedule_id) % partitions


def check_partitions(value: Any, where: str = "durable_partitions") -> int:
    """``value`` as a partition count, or :class:`PartitionsError` naming ``where`` and it."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise PartitionsError(
            f"{where} must be an integer from 1 to {MAX_PARTITIONS}, not {_shown(value)}"
        )
    if not 1 <= value <= MAX_PARTITIONS:
        raise PartitionsError(f"{where} must be from 1 to {MAX_PARTITIONS}, not {value}")
    return value


def _shown(value: Any) -> str:
    """``repr`` of a refused value, a long text cut with its length (named, not echoed)."""
    if isinstance(value, str) and len(value) > 80:
        return f"{value[:80]!r}… ({len(value):,} characters)"
    text = repr(value)
    return text if len(text) <= 100 else text[:100] + "…"


def lease_name(partition: int, partitions: int) -> str:
    """The lease row of a partition: ``dispatcher`` alone, else ``dispatcher/<k>``."""
    return DISPATCHER if partitions == 1 else f"{DISPATCHER}/{partition}"


def progress_name(partition: int, partitions: int) -> str:
    """The index progress row of a partition: ``schedule_index`` alone, else ``…/<k>``."""
    return PROJECTION if partitions == 1 else f"{PROJECTION}/{partition}"


def targets(beats: Collection[str], partitions: int) -> dict[str, int]:
    """How many partitions each live beat should hold: as even as possible, ⌈N/beats⌉ at most.

    The beats sorted by name take the remainder first, so every beat computes the same split.
    """
    ordered = sorted(beats)
    if not ordered:
        return {}
    base, extra = divmod(partitions, len(ordered))
    return {name: base + (1 if rank < extra else 0) for rank, name in enumerate(ordered)}


@dataclass(frozen=True, slots=True)
class Plan:
    """What one beat does with the partition leases this round."""

    take: tuple[int, ...]
    """Free partitions to try to take, lowest first."""
    release: tuple[int, ...]
    """Held partitions to give up (surplus someone else needs), highest first."""


def plan(me: str, partitions: int, beats: Collection[str], holders: Mapping[int, str]) -> Plan:
    """This beat's moves, given the live beats and each partition's unexpired holder.

    ``holders`` leaves out free partitions (no row, or expired). ``me`` counts as live.
    """
    live = set(beats) | {me}
    target = targets(live, partitions)
    held = sorted(p for p, owner in holders.items() if owner == me)
    counts = {name: 0 for name in live}
    for owner in holders.values():
        if owner in counts:
            counts[owner] += 1
    someone_below = any(counts[b] < target[b] for b in live if b != me)
    free = [p for p in range(partitions) if p not in holders]
    mine = target[me]
    room = mine - len(held)
    if room <= 0 and not someone_below:
        # Nobody else has room: keep nothing unheld, up to the ceiling of D10.
        ceiling = -(-partitions // len(live))
        room = ceiling - len(held)
    take = tuple(free[: max(room, 0)])
    release: tuple[int, ...] = ()
    if len(held) > mine and someone_below:
        release = tuple(sorted(held, reverse=True)[: len(held) - mine])
    return Plan(take=take, release=release)


def partitions_of(schedule_ids: Sequence[str], partitions: int) -> dict[int, list[str]]:
    """Schedule IDs grouped by partition."""
    out: dict[int, list[str]] = {}
    for sid in schedule_ids:
        out.setdefault(partition_of(sid, partitions), []).append(sid)
    return out


__all__ = [
    "DISPATCHER",
    "MAX_PARTITIONS",
    "PROJECTION",
    "SLOTS",
    "PartitionsError",
    "Plan",
    "check_partitions",
    "lease_name",
    "partition_of",
    "partitions_of",
    "plan",
    "progress_name",
    "slot_of",
    "targets",
]
