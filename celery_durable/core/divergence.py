"""The replay check's comparison: where a body's path leaves the stored one (W6). Pure.

A durable run's journal records, per position, the name and kind of the step the body asked
for. Replaying a stored run (ended, or still going: W14) against new code yields the path the
new body takes through the stored results; the first position where the two differ is what a
deploy would park (W6).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celery_durable.core.branches import position_order
from celery_durable.core.run_aggregate import PositionId

Step = tuple[str, str]
"""``(name, kind)`` of a position: kind ``step``, ``sleep``, ``signal``, ``now`` …"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Divergence:
    """The first position where a run's body now takes another path than the stored one.

    ``expected`` is what the journal holds there (``None``: the stored run had ended before
    it); ``found`` what the body asks for now (``None``: the body now ends there).
    """

    run_id: str
    task: str
    position: PositionId
    expected: Step | None
    found: Step | None
    detail: str | None = None
    """Set when the run could not be replayed at all (its task is not registered)."""
    status: str | None = None
    """``running`` or ``suspended`` for a run still going (W14); ``None`` for an ended run."""

    def __str__(self) -> str:
        if self.detail is not None:
            return f"run {self.run_id!r} ({_about(self.task, self.status)}): {self.detail}"
        return (
            f"run {self.run_id!r} ({_about(self.task, self.status)}) at position "
            f"{self.position}: " + describe(self.expected, self.found)
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON form the CLI prints with ``--json``."""

        def step(value: Step | None) -> dict[str, str] | None:
            return None if value is None else {"name": value[0], "kind": value[1]}

        return {
            "run_id": self.run_id,
            "task": self.task,
            "position": self.position,
            "expected": step(self.expected),
            "found": step(self.found),
            "status": self.status,
            "message": str(self),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class OldBranch:
    """A run whose body takes the code path from before change ``change_id`` (W14): its
    journal holds another step where ``patched(change_id)`` now stands."""

    run_id: str
    task: str
    position: PositionId
    change_id: str
    status: str | None = None
    """``running`` or ``suspended`` for a run still going (W14); ``None`` for an ended run."""

    def __str__(self) -> str:
        return (
            f"run {self.run_id!r} ({_about(self.task, self.status)}) takes the old branch of "
            f"patch {self.change_id!r} at position {self.position}"
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON form the CLI prints with ``--json``."""
        return {
            "run_id": self.run_id,
            "task": self.task,
            "position": self.position,
            "change_id": self.change_id,
            "status": self.status,
            "message": str(self),
        }


def _about(task: str, status: str | None) -> str:
    """``task``, and ``still suspended`` (or running) for a run that has not ended."""
    return task if status is None else f"{task}, still {status}"


def describe(expected: Step | None, found: Step | None) -> str:
    """The difference at one position, in words."""
    held = "nothing (the run ended before it)" if expected is None else _step(expected)
    asked = "to end there" if found is None else f"for {_step(found)}"
    return f"the journal holds {held} but the body now asks {asked}"


def _step(value: Step) -> str:
    name, kind = value
    return f"{kind} {name!r}"


def first_divergence(
    stored: Mapping[PositionId, Step], replayed: Sequence[Step], *, body_ended: bool
) -> tuple[PositionId, Step | None, Step | None] | None:
    """``(position, expected, found)`` of the first difference, or ``None`` when the paths agree.

    ``replayed``: the positions the new body asked for, in order; ``body_ended``: whether the
    body returned or raised by itself after them (rather than being stopped at a difference).
    A body that ends while stored positions remain diverges at the first of them.
    """
    return first_divergence_at(stored, list(enumerate(replayed)), body_ended=body_ended)


def first_divergence_at(
    stored: Mapping[PositionId, Step],
    replayed: Sequence[tuple[PositionId, Step]],
    *,
    body_ended: bool,
) -> tuple[PositionId, Step | None, Step | None] | None:
    """:func:`first_divergence` for a path of ``(position, step)`` pairs, which may hold
    dotted branch positions (W9) in any order and skip positions (``patched``: W14).

    A stored branch position counts as reached when its parallel call's position was; a race's
    abandoned branches are never asked for again."""
    for position, step in sorted(replayed, key=lambda pair: position_order(pair[0])):
        expected = stored.get(position)
        if expected != tuple(step):
            return position, expected, tuple(step)  # type: ignore[return-value]
    if body_ended:
        reached = {position_order(p)[0] for p, _ in replayed}
        top = max(reached, default=-1)
        left = sorted((p for p in stored if position_order(p)[0] > top), key=position_order)
        if left:
            return left[0], stored[left[0]], None
    return None
