"""Parallel branches in the pure core (W9): the group markers and the bookkeeping of one call.

A ``parallel``, ``race`` or ``gather`` call takes one position of the body, say ``3``, and its
branch ``i`` numbers its own positions ``3.i.0``, ``3.i.1`` … (S4). The call's own position
holds a *group marker*:

* ``BranchesStarted`` (``position``, ``name`` = :func:`group_name`, ``kind`` = ``parallel`` /
  ``race`` / ``gather``, ``branches``) when the call is first reached, so that a body that now
  makes another call there (a step instead of a ``parallel``, ``gather`` instead of
  ``parallel``, one branch more or less) parks with the usual W6 error;
* ``BranchesStopped`` (the same fields and ``branch``) when a branch's failure stopped the
  group, so that a replay starts the group stopped and starts no step that did not start the
  first time;
* a race's winner stays the ``StepCompleted`` of kind ``race`` it always was
  (``{"winner": i}``).

:class:`Group` is what one delivery knows about one call: its branches' next positions, whether
it is stopped and by which branch, a race's winner. It is a plain value with no lock and no
thread: the worker calls it under a lock, the property tests drive it directly. Nothing here
performs I/O.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

BRANCHES_STARTED = "BranchesStarted"
"""Run stream: a group call reached its position (``position``, ``name``, ``kind``,
``branches``)."""
BRANCHES_STOPPED = "BranchesStopped"
"""Run stream: the failure of branch ``branch`` stopped the group at ``position``."""

PARALLEL = "parallel"
RACE = "race"
GATHER = "gather"
KINDS = frozenset((PARALLEL, RACE, GATHER))
"""The position kinds of group calls."""

LEGACY_RACE = "race"
"""The ``name`` of a race position stored before the markers (its winner only)."""

GroupPosition = int | str
"""The position of a group call: an int on the body's line, a dotted str inside a branch."""


def group_name(count: int) -> str:
    """The stored ``name`` of a group call of ``count`` branches: W6 compares it, so a call
    with another number of branches (or items) at a stored position parks the run."""
    return f"{count} branch" if count == 1 else f"{count} branches"


def branch_position(call: GroupPosition, branch: int, index: int) -> str:
    """Position ``index`` of branch ``branch`` of the call at ``call`` (S4: ``3.1.0``)."""
    return f"{call}.{branch}.{index}"


def under(call: GroupPosition, position: GroupPosition) -> bool:
    """Whether ``position`` lies in a branch of the call at ``call`` (at any depth)."""
    return isinstance(position, str) and position.startswith(f"{call}.")


def calls_of(position: str) -> list[GroupPosition]:
    """The group calls a dotted position lies in, outermost first: ``"3.1.0.2.0"`` lies in
    branch 1 of the call at ``3`` and in branch 2 of the call at ``"3.1.0"``."""
    parts = position.split(".")
    found: list[GroupPosition] = [int(parts[0])]
    found.extend(".".join(parts[:end]) for end in range(3, len(parts) - 1, 2))
    return found


def legacy(
    call: GroupPosition, kind: str, stored: Any, branch_calls: Container[GroupPosition]
) -> bool:
    """Whether the call at ``call`` was stored before the markers existed (SPEC §9): a race
    whose winner is stored under the old name, or no marker while positions of its branches
    are stored. Such a call replays as before, without a check of its branch count.

    ``stored``: the record at ``call`` (``None``: nothing); ``branch_calls``: the calls that
    have stored branch positions (:func:`calls_of` of each)."""
    if stored is not None:
        return kind == RACE and stored.kind == RACE and stored.name == LEGACY_RACE
    return call in branch_calls


def legacy_stopped(call: GroupPosition, positions: Mapping[Any, Any]) -> bool:
    """Whether a call stored before the markers had stopped: a branch's failure is stored and
    the body went on past the call (so every step the call started is stored, and a position
    of it with nothing stored was never started). A replay begins such a group stopped, as
    ``BranchesStopped`` would say. ``positions``: the stored records by position."""
    line = position_order(call)
    prefix, index = line[:-1], line[-1]
    went_on = failed = False
    for position, record in positions.items():
        order = position_order(position)
        if order[: len(prefix)] == prefix and len(order) > len(prefix):
            went_on = went_on or order[len(prefix)] > index
        failed = failed or (under(call, position) and record.status == "failed")
        if went_on and failed:
            return True
    return False


def position_order(position: GroupPosition) -> tuple[int, ...]:
    """Sort key of positions: ``2 < "2.0.0" < "2.0.1" < "2.1.0" < 3`` (also exported by
    ``core.run_aggregate``)."""
    if isinstance(position, int):
        return (position,)
    return tuple(int(part) for part in position.split("."))


@dataclass(slots=True, eq=False)
class Group:
    """The bookkeeping of one group call in one delivery (W9).

    ``stopped_by``: the branch whose failure stopped the group (stored by ``BranchesStopped``,
    or found stored when the delivery began). ``winner``: a race's first branch to end.
    ``halted``: stopped for a reason that is not stored (the delivery itself stops: a crash, a
    lost claim, a park). ``closed``: a group stored before the markers that had stopped
    (:func:`legacy_stopped`). A stopped group, or one inside a stopped group, starts no step
    that has no stored result; stored results still replay.
    """

    position: GroupPosition
    kind: str
    count: int
    parent: Group | None = None
    stopped_by: int | None = None
    winner: int | None = None
    halted: bool = False
    closed: bool = False
    reached: list[int] = field(default_factory=list)
    """How many positions each branch has taken."""

    @classmethod
    def begin(
        cls,
        position: GroupPosition,
        kind: str,
        count: int,
        *,
        stored_stop: int | None = None,
        stored_winner: int | None = None,
        closed: bool = False,
        parent: Group | None = None,
    ) -> Group:
        """The group of a call reached now; a stored stop or winner (or ``closed``, see
        :func:`legacy_stopped`) makes it start stopped."""
        if kind not in KINDS:
            raise ValueError(f"unknown group kind {kind!r}")
        if count < 0:
            raise ValueError(f"a group has no negative number of branches: {count}")
        for what, value in (("stopped branch", stored_stop), ("winner", stored_winner)):
            if value is not None and not 0 <= value < count:
                raise ValueError(f"stored {what} {value} of a group of {count} branches")
        return cls(
            position=position,
            kind=kind,
            count=count,
            parent=parent,
            stopped_by=stored_stop,
            winner=stored_winner,
            closed=closed,
            reached=[0] * count,
        )

    # -- positions ------------------------------------------------------------------------------

    def position_of(self, branch: int, index: int) -> str:
        """Position ``index`` of ``branch`` (without taking it)."""
        self._branch(branch)
        return branch_position(self.position, branch, index)

    def take(self, branch: int) -> str:
        """The next position of ``branch``, taken."""
        self._branch(branch)
        index = self.reached[branch]
        self.reached[branch] = index + 1
        return branch_position(self.position, branch, index)

    def _branch(self, branch: int) -> None:
        if not 0 <= branch < self.count:
            raise ValueError(f"branch {branch} of a group of {self.count} branches")

    # -- stopping -------------------------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        """No step without a stored result may start (in this group or a group inside it)."""
        group: Group | None = self
        while group is not None:
            if (
                group.halted
                or group.closed
                or group.stopped_by is not None
                or group.winner is not None
            ):
                return True
            group = group.parent
        return False

    @property
    def refuses_writes(self) -> bool:
        """A decided race drops what its losers (and groups inside them) would store."""
        group: Group | None = self
        while group is not None:
            if group.kind == RACE and (group.winner is not None or group.halted):
                return True
            group = group.parent
        return False

    def may_start(self, settled: bool) -> bool:
        """Whether a branch may go on at a position: always when the position's result (or
        failure, or a group marker) is stored, else only while the group is not stopped."""
        return settled or not self.stopped

    def failed(self, branch: int) -> bool:
        """``branch`` ended with an error. ``True`` when that stops the group now (the first
        failure of a ``parallel`` or ``gather``): store ``BranchesStopped`` for it. A race's
        branch that fails ends the race as a result would (see :meth:`ended`)."""
        self._branch(branch)
        if self.kind == RACE:
            return False
        if self.stopped_by is not None or self.halted or self.closed:
            return False
        self.stopped_by = branch
        return True

    def ended(self, branch: int) -> bool:
        """``branch`` of a race ended (with a result or an error): ``True`` when it is the
        first, the winner to store."""
        self._branch(branch)
        if self.kind != RACE or self.winner is not None or self.halted:
            return False
        self.winner = branch
        return True

    def halt(self) -> None:
        """The delivery stops (crash, lost claim, park): no branch starts another step."""
        self.halted = True


# -- what a call raises or returns ----------------------------------------------------------

VALUE = "value"
FAILED = "failed"
ABANDONED = "abandoned"
HALTED = "halted"


def to_raise(ends: Sequence[str]) -> int | None:
    """Which branch's end a ``parallel``/``gather`` raises, given how each branch ended
    (``value``, ``failed``: an ordinary exception, ``abandoned``: stopped at a step it could not
    start, ``halted``: the delivery stops); ``None`` when every branch has a value.

    A delivery-level stop first (it must reach the delivery), then the lowest-numbered failure,
    then an abandonment (an enclosing group stopped: the call stops too)."""
    for kind in (HALTED, FAILED, ABANDONED):
        for index, end in enumerate(ends):
            if end == kind:
                return index
    return None
