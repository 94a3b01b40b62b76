"""Child runs in the pure core (W10-W13): their run IDs, events, and what a fan-out starts next.

A child run is an ordinary durable run whose run ID is its parent's run ID, a ``:``, and the
parent's position (``:position.index`` for one input of ``map_children``). The parent's journal
holds one ``ChildStarted`` when a child's start is stored and one ``ChildEnded`` when the parent
has seen the child's outcome: O(1) events per child, never the whole fan-out in one event.
Nothing here performs I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from celery_durable.core.outcomes import Cancelled, Faulted, Finished, Outcome

CHILD_STARTED = "ChildStarted"
"""Parent stream: a child's start is stored (``position``, ``name``, ``kind``, ``child``,
``index`` for a fan-out)."""
CHILD_ENDED = "ChildEnded"
"""Parent stream: the parent has seen a child's outcome (``outcome``: :func:`outcome_json`)."""
FAN_OUT_STARTED = "FanOutStarted"
"""Parent stream: ``map_children`` reached its position (``total``, ``at_most``)."""

CHILD = "child"
"""Position kind of ``child``/``start_child``, and the ``StepFailed`` kind of a faulted child."""
CHILDREN = "children"
"""Position kind of ``map_children``."""
MAX_RUN_ID_LENGTH = 255 - len("run/")
"""The longest run ID a child may get: its journal stream ``run/<run ID>`` must fit the
255-character stream column (the run table's ``run_id`` column holds 255 too)."""
CHILD_WAIT = "child"
"""``RunSuspended`` reason of a parent waiting for a child: any delivery resumes it."""


@dataclass(frozen=True, slots=True)
class ChildHandle:
    """A started child run (W10): pass it to ``durable.wait_child`` to wait for its result."""

    run_id: str


@dataclass(slots=True)
class FanOut:
    """What a parent's journal says about one ``map_children`` position."""

    total: int
    at_most: int
    started: dict[int, str] = field(default_factory=dict)
    """Index of each input whose child's start is stored → that child's run ID."""
    ended: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Index → the child's outcome (:func:`outcome_json`) as the parent recorded it."""
    failed: set[int] = field(default_factory=set)
    """Indices of the children seen ended without finishing."""
    flying: dict[int, str] = field(default_factory=dict)
    """The part of :attr:`started` not yet seen ended (kept as events are folded, so that a
    wake-up of a fan-out of 10,000 children looks at ``at_most`` of them, not at all)."""

    def in_flight(self) -> list[tuple[int, str]]:
        """``(index, run ID)`` of the children started and not yet seen ended, by index."""
        return sorted(self.flying.items())

    def start(self, index: int, child: str) -> None:
        """Record that the child of input ``index`` was started (the fold)."""
        self.started[index] = child
        if index not in self.ended:
            self.flying[index] = child

    def to_start(self) -> range:
        """The indices to start now: the next ones in input order, so that at most
        ``at_most`` are started and not ended."""
        first = len(self.started)
        room = self.at_most - (len(self.started) - len(self.ended))
        return range(first, min(self.total, first + max(0, room)))

    def done(self) -> bool:
        return len(self.ended) == self.total

    def first_failure(self) -> tuple[int, str, dict[str, Any]] | None:
        """``(index, run ID, outcome)`` of the lowest-numbered child seen ended without
        finishing (faulted, cancelled, parked), or ``None``."""
        if not self.failed:
            return None
        index = min(self.failed)
        return index, self.started.get(index, ""), self.ended[index]

    def end(self, index: int, outcome: dict[str, Any]) -> None:
        """Record that the child of input ``index`` ended with ``outcome`` (the fold)."""
        self.ended[index] = outcome
        self.flying.pop(index, None)
        if outcome.get("state") != "finished":
            self.failed.add(index)

    def results(self) -> list[Any]:
        """The finished children's results in input order (once every child finished)."""
        return [self.ended[i].get("result") for i in range(self.total)]


def child_run_id(parent: str, position: int, index: int | None = None) -> str:
    """``parent:position`` (W10), or ``parent:position.index`` for a fan-out's input (W11)."""
    return f"{parent}:{position}" if index is None else f"{parent}:{position}.{index}"


def child_position(parent: str, child: str) -> int | None:
    """The parent position a ``child()``/``start_child`` child was started at, or ``None``
    when ``child`` is not such a child of ``parent``."""
    prefix = f"{parent}:"
    if not child.startswith(prefix):
        return None
    tail = child[len(prefix) :]
    return int(tail) if tail.isdigit() else None


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    """The stored form of a child's outcome inside ``ChildEnded``."""
    if isinstance(outcome, Finished):
        return {"state": "finished", "result": outcome.value}
    if isinstance(outcome, Faulted):
        return {
            "state": "faulted",
            "error_type": outcome.error_type,
            "message": outcome.error,
            "failure": outcome.kind,
        }
    return {"state": "cancelled"}


def outcome_from_json(data: dict[str, Any]) -> Outcome:
    """The outcome stored by :func:`outcome_json`."""
    state = data.get("state")
    if state == "finished":
        return Finished(data.get("result"))
    if state == "faulted":
        message = str(data.get("message", ""))
        return Faulted(message, str(data.get("error_type", "Exception")), data.get("failure"))
    return Cancelled()


def child_error(child: str, data: dict[str, Any]) -> dict[str, Any]:
    """The ``StepFailed`` error of the parent's step for a child that did not finish: kind
    ``child`` with the child's error inside, or kind ``cancelled`` (W10)."""
    if data.get("state") == "cancelled":
        return {
            "failure": "cancelled",
            "error_type": "celery_durable.errors.RunCancelled",
            "message": f"child run {child!r} was cancelled",
        }
    return {
        "failure": CHILD,
        "error_type": str(data.get("error_type", "Exception")),
        "message": f"child run {child!r} faulted: {data.get('message', '')}",
    }
