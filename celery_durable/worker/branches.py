"""Parallel branches inside one durable run (W9) and ``patched`` markers (W14).

A ``parallel``, ``race`` or ``gather`` call takes one position of the body, say ``3``, and
stores its group marker there (``BranchesStarted``: its kind and number of branches); branch
``i`` then reaches its own positions ``3.i.0``, ``3.i.1`` … (S4), so replay hands every branch
its own stored results whatever order the branches finished in, and a body that now makes
another call at ``3`` parks (W6). Branches run in threads of a pool made for the call; each
thread sees a :class:`BranchRun`, a view of the delivery's
:class:`~celery_durable.worker.context.RunContext` that shares the run's state and journal
writes (one lock per run). What a call knows (its branches' positions, whether it is stopped
and by which branch, a race's winner) is a pure :class:`~celery_durable.core.branches.Group`,
changed under the call's lock.

Stopping: the thread of a branch that fails stops the group at once and stores
``BranchesStopped`` naming the branch (the first failure only). From then on no branch of the
call starts a step that has no stored result; stored results still replay. A replay begins a
stopped group stopped, so it reaches the same failures as the first delivery and starts no step
that the first did not start. A race stores its winner at its own position (``StepCompleted``,
kind ``race``, result ``{"winner": i}``) and replay runs that branch alone. The losers'
threads may outlive the call (it returns without waiting for them); whatever they would
store is refused under the run's lock, so nothing of theirs follows the winner's record in
the journal. Durable sleeps longer than a second, signal waits and child runs are refused
inside a branch (a branch cannot give the worker back on its own); retry back-offs wait inside
the worker thread.

Calls stored before the markers existed (no marker at the call's position) replay without the
check of their kind and branch count; one with a stored failure that the body went on past
begins stopped (:func:`~celery_durable.core.branches.legacy_stopped`).

Outside a durable run (and inside a step) the three are plain concurrent calls in threads.
"""

from __future__ import annotations

import contextvars
import inspect
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime
from typing import Any, TypeVar

from celery_durable.core.branches import (
    ABANDONED,
    BRANCHES_STARTED,
    BRANCHES_STOPPED,
    FAILED,
    GATHER,
    HALTED,
    KINDS,
    LEGACY_RACE,
    PARALLEL,
    RACE,
    VALUE,
    Group,
    group_name,
    legacy,
    legacy_stopped,
    to_raise,
)
from celery_durable.core.run_aggregate import STEP_COMPLETED, Position, PositionId
from celery_durable.errors import DurableError
from celery_durable.worker.context import RunContext, Suspend, current_run
from celery_durable.worker.traced import branch_span, traced

T = TypeVar("T")
R = TypeVar("R")

MAX_THREADS = 32
"""Threads of one ``parallel``/``race`` call at most (more branches wait for a free thread)."""

RETRY_WAIT_SLICE = 0.05
"""Seconds a branch waiting to retry a step sleeps between looks at its group's stop."""


class Abandoned(BaseException):
    """A branch stopped at a step it may no longer start (another branch failed or won)."""


class _Call:
    """One group call in one delivery: its core :class:`Group`, the lock its branches'
    threads change it under, and the context the call was made in (which stores its
    markers)."""

    def __init__(self, scope: RunContext, group: Group, name: str) -> None:
        self.scope = scope
        self.group = group
        self.name = name
        self.lock = threading.Lock()


class BranchRun(RunContext):
    """One branch's view of a delivery: its own positions, step context and stop signal;
    everything else (state, journal, lock, clock) is the delivery's."""

    inline_waits = True

    def __init__(self, root: RunContext, call: _Call, branch: int) -> None:
        # The delivery's attributes are read through __getattr__; only these are the branch's.
        self.root = root
        self.call = call
        self.group = call.group
        self.branch = branch
        self.prefix = f"{call.group.position}.{branch}"
        self.position = 0
        """Positions this branch has taken (its next one is :meth:`at` of it)."""
        self.step = None
        self.in_step = False
        self.last: PositionId = self.prefix

    def __getattr__(self, name: str) -> Any:
        return getattr(self.root, name)

    def at(self, index: int) -> PositionId:
        return self.group.position_of(self.branch, index)

    def reach(
        self, name: str, kind: str, *, stores: bool = True
    ) -> tuple[PositionId, Position | None]:
        if kind == "signal":
            raise DurableError(
                f"wait_signal({name!r}) at position {self.at(self.position)} of run "
                f"{self.run_id!r}: a parallel branch cannot wait for a signal (wait before or "
                "after the parallel call)"
            )
        with self.call.lock:
            position = self.group.take(self.branch)
        self.position += 1
        self.last = position
        # A stored result or failure replays; so does a stored group inside this one (its
        # own branches then replay what they stored and stop at the rest). A stopped group
        # goes no further: the position is not even asked for (the replay check's path
        # ends where the delivery's does).
        stored = self.root.state.positions.get(position)
        settled = stored is not None and (
            stored.status in ("completed", "failed") or stored.kind in KINDS
        )
        with self.call.lock:
            allowed = self.group.may_start(settled)
        if not allowed:
            raise Abandoned()
        return position, self.root.check(position, name, kind, stores=stores)

    def check(
        self, position: PositionId, name: str, kind: str, *, stores: bool = True
    ) -> Position | None:
        return self.root.check(position, name, kind, stores=stores)

    def peek(self) -> tuple[PositionId, Position | None]:
        position = self.at(self.position)
        return position, self.root.state.positions.get(position)

    def old_branch(self, position: PositionId, change_id: str) -> None:
        self.root.old_branch(position, change_id)

    def retry_wait(self, seconds: float) -> None:
        """Wait for a step's next attempt, looking at the group's stop meanwhile: once another
        branch failed (or a race was decided) the next attempt would be a step started after
        the stop, so the branch stops here instead (W9), and ``parallel`` raises the failure
        without waiting out the back-off (up to a minute between attempts). A replay begins
        the group stopped and stops this branch at the same step, whose attempts are not
        settled."""
        left = seconds
        while True:
            with self.call.lock:
                if self.group.stopped:
                    raise Abandoned()
            if left <= 0:
                return
            piece = min(left, RETRY_WAIT_SLICE)
            self.root.wait(piece)
            left -= piece

    def append(self, *args: Any, **kwargs: Any) -> None:
        """Store through the delivery; refused once the branch lost its race.

        The refusal is decided under the run's lock, the one the race's winner record is
        stored under: a race is decided before its winner is stored, so a loser's write
        lands before that record or not at all. Looked at before taking the lock, a loser
        that had just finished its step could be held up between the look and the write
        (a busy CPU) and store its result after the winner, even after the delivery had
        ended, renewing a claim nobody held any more (W9)."""
        with self.root.lock:
            if self.group.refuses_writes:
                raise Abandoned()
            self.root.append(*args, **kwargs)

    def suspend(self, until: datetime | None, reason: str, *_: Any, **__: Any) -> Suspend:
        """Refused: a branch cannot give the worker back while the others run."""
        raise DurableError(
            f"a durable {reason} at position {self.last} of run {self.run_id!r} would give the "
            "worker back, which a parallel branch cannot do on its own: sleep at most 1 s "
            "inside a branch, or sleep before or after the parallel call"
        )


# -- input checks -----------------------------------------------------------------------------


def _callables(branches: Sequence[Any], what: str) -> list[Callable[[], Any]]:
    for index, branch in enumerate(branches):
        if not callable(branch):
            raise TypeError(
                f"{what}: branch {index} must be a callable without arguments, "
                f"not {type(branch).__name__}"
            )
        problem = _call_problem(branch)
        if problem is not None:
            raise TypeError(
                f"{what}: branch {index} must be a callable without arguments: {problem}"
            )
    return list(branches)


def _call_problem(fn: Callable[..., Any], *args: Any) -> str | None:
    """Why ``fn(*args)`` cannot be called, or ``None``. Checked before the call's position is
    taken: run as a branch, the ``TypeError`` would be a branch's failure, stored with the
    group (W9). A callable without a readable signature (some builtins) is not checked."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*args)
    except TypeError as exc:
        return str(exc)
    return None


def _at_most(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"gather: at_most must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"gather: at_most must be at least 1, not {value}")
    return value


# -- the group of a call ------------------------------------------------------------------------


def _root(run: RunContext) -> RunContext:
    return run.root if isinstance(run, BranchRun) else run


def _scope(run: RunContext | None) -> RunContext | None:
    """The run branches journal into; ``None`` outside a run and inside a step (plain calls)."""
    return None if run is None or run.in_step else run


def _begin(scope: RunContext, kind: str, count: int) -> _Call:
    """Take the call's position, check it against the journal (W6: kind and branch count),
    store its marker when it is reached for the first time, and make its :class:`Group`: a
    group the journal says was stopped begins stopped, a race with a stored winner begins
    decided."""
    position, stored = scope.peek()
    old = legacy(position, kind, stored, scope.state.branch_calls)
    name = LEGACY_RACE if old and stored is not None else group_name(count)
    position, record = scope.reach(name, kind, stores=not old)
    if record is None and not old:
        scope.append(
            [scope.event(BRANCHES_STARTED, position, name=name, kind=kind, branches=count)]
        )
    winner = None
    if kind == RACE and record is not None and record.status == "completed":
        winner = int((record.result or {})["winner"])
    closed = old and record is None and legacy_stopped(position, scope.state.positions)
    group = Group.begin(
        position,
        kind,
        count,
        stored_stop=None if record is None else record.stopped_by,
        stored_winner=winner,
        closed=closed,
        parent=scope.group if isinstance(scope, BranchRun) else None,
    )
    return _Call(scope, group, name)


def _ended(view: BranchRun, error: BaseException | None) -> None:
    """In the branch's own thread, as the branch ends: a race has its winner; a failure
    stops the group at once (no other branch starts a step from now) and is stored for
    replay; a delivery-level stop (crash, lost claim, park) stops it without being stored."""
    call = view.call
    group = call.group
    with call.lock:
        if error is not None and not isinstance(error, Exception):
            group.halt()
            return
        group.ended(view.branch)
        stops = error is not None and group.failed(view.branch)
    if stops:
        call.scope.append(
            [
                call.scope.event(
                    BRANCHES_STOPPED, group.position, name=call.name, kind=group.kind,
                    branches=group.count, branch=view.branch,
                )
            ]
        )  # fmt: skip


def _start(
    pool: ThreadPoolExecutor, call: _Call | None, index: int, branch: Callable[[], T]
) -> Future[T]:
    """Submit one branch, in a copy of the caller's context, seeing its own :class:`BranchRun`."""
    context = contextvars.copy_context()

    def run_branch() -> T:
        if call is None:
            return branch()
        view = BranchRun(_root(call.scope), call, index)
        token = view.activate()
        try:
            with branch_span(view, view.prefix):
                value = branch()
        except Abandoned:
            raise
        except BaseException as exc:
            _ended(view, exc)
            raise
        else:
            _ended(view, None)
            return value
        finally:
            view.deactivate(token)

    return pool.submit(context.run, run_branch)


def _end_of(future: Future[Any]) -> str:
    error = future.exception()
    if error is None:
        return VALUE
    if isinstance(error, Abandoned):
        return ABANDONED
    return FAILED if isinstance(error, Exception) else HALTED


def _outcome(futures: Sequence[Future[Any]]) -> list[Any]:
    """The branches' results in order, or what :func:`~celery_durable.core.branches.to_raise`
    picks (a delivery-level stop, then the lowest-numbered failure, then an abandonment)."""
    index = to_raise([_end_of(f) for f in futures])
    if index is not None:
        raise futures[index].exception()  # type: ignore[misc]
    return [f.result() for f in futures]


def _run_all(
    run: RunContext | None, kind: str, branches: Sequence[Callable[[], Any]], threads: int
) -> list[Any]:
    scope = _scope(run)
    call = None if scope is None else _begin(scope, kind, len(branches))
    if not branches:
        return []
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"durable-{kind}") as pool:
        futures = [_start(pool, call, i, branch) for i, branch in enumerate(branches)]
        wait(futures)
    return _outcome(futures)


@traced("parallel")
def parallel(*branches: Callable[[], Any]) -> list[Any]:
    """Run ``branches`` (callables without arguments) together; their results in order (W9).

    Inside a durable run each branch's steps are journaled at dotted positions (S4). When a
    branch fails, no branch starts another step, and the failure of the lowest-numbered
    failing branch is raised once the steps in flight have ended.
    """
    checked = _callables(branches, "parallel")
    return _run_all(current_run(), PARALLEL, checked, min(len(checked), MAX_THREADS) or 1)


@traced("gather")
def gather(fn: Callable[[T], R], items: Iterable[T], at_most: int = MAX_THREADS) -> list[R]:
    """``fn(item)`` for every item, at most ``at_most`` at a time; results in item order (W9)."""
    if not callable(fn):
        raise TypeError(f"gather: fn must be callable, not {type(fn).__name__}")
    problem = _call_problem(fn, None)
    if problem is not None:
        raise TypeError(f"gather: fn must take one item as its argument: {problem}")
    limit = _at_most(at_most)
    values = list(items)
    branches = [(lambda item=item: fn(item)) for item in values]
    return _run_all(current_run(), GATHER, branches, min(limit, len(values)) or 1)


@traced("race")
def race(*branches: Callable[[], Any]) -> Any:
    """The result (or the failure) of the first of ``branches`` to end; the others are
    abandoned: none of their steps starts or is stored any more (W9). The winner is stored,
    so a replay runs that branch alone and returns its result again."""
    checked = _callables(branches, "race")
    if not checked:
        raise ValueError("race: give at least one branch")
    scope = _scope(current_run())
    if scope is None:
        return _race_plain(checked)
    call = _begin(scope, RACE, len(checked))
    group = call.group
    if group.winner is not None:
        view = BranchRun(_root(scope), call, group.winner)
        token = view.activate()
        try:
            return checked[group.winner]()
        finally:
            view.deactivate(token)
    pool = ThreadPoolExecutor(
        max_workers=min(len(checked), MAX_THREADS), thread_name_prefix="durable-race"
    )
    try:
        futures = [_start(pool, call, i, b) for i, b in enumerate(checked)]
        winner = _winner(call, futures)
        # Named "race" as before the markers: a worker of that version, which skips the
        # marker, still finds the race it expects here (the record keeps the marker's name).
        scope.append(
            [
                scope.event(
                    STEP_COMPLETED, group.position, name=LEGACY_RACE, kind=RACE,
                    result={"winner": winner},
                )
            ]
        )  # fmt: skip
        return futures[winner].result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _winner(call: _Call, futures: Sequence[Future[Any]]) -> int:
    """The race's winner once its future is done; raises the stop of a branch that halted
    the delivery first (no winner is stored then), or :class:`Abandoned` when an enclosing
    call stopped every branch."""
    pending = set(futures)
    while True:
        with call.lock:
            winner = call.group.winner
            halted = call.group.halted
        if winner is not None:
            wait([futures[winner]])
            return winner
        if halted or not pending:
            wait(futures)
            index = to_raise([_end_of(f) for f in futures])
            raise futures[index if index is not None else 0].exception() or Abandoned()
        _done, pending = wait(pending, return_when=FIRST_COMPLETED)


def _race_plain(branches: Sequence[Callable[[], Any]]) -> Any:
    pool = ThreadPoolExecutor(max_workers=min(len(branches), MAX_THREADS))
    try:
        futures = [_start(pool, None, i, b) for i, b in enumerate(branches)]
        done, _ = wait(futures, return_when=FIRST_COMPLETED)
        return min(done, key=futures.index).result()  # in branch order on a tie
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


# -- W14 ---------------------------------------------------------------------------------------


def patched(change_id: str) -> bool:
    """Whether the body takes the new code path of change ``change_id`` (W14).

    The first time a run reaches it, a marker step is stored and ``True`` returned. A run
    whose journal holds another step at this position was started by the code before the
    change: ``False``, and the position is not taken, so its later positions do not move.
    Outside a durable run (and in a step) it is ``True``: new work takes the new path.
    """
    if not isinstance(change_id, str) or not change_id or change_id != change_id.strip():
        raise TypeError(
            f"patched: change_id must be a non-empty str without edge spaces: {change_id!r}"
        )
    scope = _scope(current_run())
    if scope is None:
        return True
    position, record = scope.peek()
    if record is not None and (record.kind, record.name) != ("patch", change_id):
        scope.old_branch(position, change_id)
        return False
    position, record = scope.reach(change_id, "patch")
    if record is None:
        scope.append(
            [scope.event(STEP_COMPLETED, position, name=change_id, kind="patch", result=True)]
        )
    return True
