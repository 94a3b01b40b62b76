"""Parallel branches inside one durable run (W9) and ``patched`` markers (W14).

A ``parallel``, ``race`` or ``gather`` call takes one position of the body, say ``3``; branch
``i`` then reaches its own positions ``3.i.0``, ``3.i.1`` … (S4), so replay hands every branch
its own stored results whatever order the branches finished in. Branches run in threads of a
pool made for the call; each thread sees a :class:`BranchRun`, a view of the delivery's
:class:`~celery_durable.worker.context.RunContext` with its own position counter, that shares
the run's state and journal writes (one lock per run).

Stopping: once a branch fails (or a race has its winner), no branch of the call starts a step
that has no stored result; stored results still replay, so a replayed call reaches the same
failures as the first one. A race stores its winner at its own position (``StepCompleted``,
kind ``race``, result ``{"winner": i}``) and replay runs that branch alone. Durable sleeps
longer than a second and signal waits are refused inside a branch (a branch cannot give the
worker back on its own); retry back-offs wait inside the worker thread.

Outside a durable run (and inside a step) the three are plain concurrent calls in threads.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime
from typing import Any, TypeVar

from celery_durable.core.run_aggregate import STEP_COMPLETED, Position, PositionId
from celery_durable.errors import DurableError
from celery_durable.worker.context import RunContext, Suspend, current_run
from celery_durable.worker.traced import branch_span, traced

T = TypeVar("T")
R = TypeVar("R")

MAX_THREADS = 32
"""Threads of one ``parallel``/``race`` call at most (more branches wait for a free thread)."""


class Abandoned(BaseException):
    """A branch stopped at a step it may no longer start (another branch failed or won)."""


class _Group:
    """The branches of one ``parallel``, ``race`` or ``gather`` call."""

    def __init__(self, parent: _Group | None, *, drop_writes: bool) -> None:
        self.parent = parent
        self.drop_writes = drop_writes
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set() or (self.parent is not None and self.parent.stopped)


class BranchRun(RunContext):
    """One branch's view of a delivery: its own positions, step context and stop signal;
    everything else (state, journal, lock, clock) is the delivery's."""

    inline_waits = True

    def __init__(self, root: RunContext, prefix: str, group: _Group) -> None:
        # The delivery's attributes are read through __getattr__; only these are the branch's.
        self.root = root
        self.prefix = prefix
        self.group = group
        self.position = 0
        self.step = None
        self.in_step = False
        self.last: PositionId = prefix

    def __getattr__(self, name: str) -> Any:
        return getattr(self.root, name)

    def at(self, index: int) -> PositionId:
        return f"{self.prefix}.{index}"

    def reach(
        self, name: str, kind: str, *, stores: bool = True
    ) -> tuple[PositionId, Position | None]:
        position = self.at(self.position)
        if kind == "signal":
            raise DurableError(
                f"wait_signal({name!r}) at position {position} of run {self.run_id!r}: a "
                "parallel branch cannot wait for a signal (wait before or after the parallel call)"
            )
        self.position += 1
        self.last = position
        record = self.root.check(position, name, kind, stores=stores)
        settled = record is not None and record.status in ("completed", "failed")
        if self.group.stopped and not settled:
            raise Abandoned()
        return position, record

    def check(
        self, position: PositionId, name: str, kind: str, *, stores: bool = True
    ) -> Position | None:
        return self.root.check(position, name, kind, stores=stores)

    def peek(self) -> tuple[PositionId, Position | None]:
        position = self.at(self.position)
        return position, self.root.state.positions.get(position)

    def old_branch(self, position: PositionId, change_id: str) -> None:
        self.root.old_branch(position, change_id)

    def append(self, *args: Any, **kwargs: Any) -> None:
        """Store through the delivery; refused once the branch lost its race."""
        if self.group.drop_writes and self.group.stopped:
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
    return list(branches)


def _at_most(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"gather: at_most must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"gather: at_most must be at least 1, not {value}")
    return value


# -- running branches -------------------------------------------------------------------------


def _start(
    pool: ThreadPoolExecutor, run: RunContext | None, prefix: str, group: _Group | None,
    index: int, branch: Callable[[], T],
) -> Future[T]:  # fmt: skip
    """Submit one branch, in a copy of the caller's context, seeing its own :class:`BranchRun`."""
    context = contextvars.copy_context()

    def call() -> T:
        if run is None or group is None:
            return branch()
        view = BranchRun(_root(run), f"{prefix}.{index}", group)
        token = view.activate()
        try:
            with branch_span(view, f"{prefix}.{index}"):
                return branch()
        finally:
            view.deactivate(token)

    return pool.submit(context.run, call)


def _root(run: RunContext) -> RunContext:
    return run.root if isinstance(run, BranchRun) else run


def _scope(run: RunContext | None) -> RunContext | None:
    """The run branches journal into; ``None`` outside a run and inside a step (plain calls)."""
    return None if run is None or run.in_step else run


def _group_of(run: RunContext, *, drop_writes: bool) -> _Group:
    return _Group(run.group if isinstance(run, BranchRun) else None, drop_writes=drop_writes)


def _outcome(futures: Sequence[Future[Any]]) -> list[Any]:
    """The branches' results in order, or the first branch's failure (a delivery-level stop,
    e.g. a lost claim or a park, before an ordinary exception; never :class:`Abandoned`)."""
    errors = [f.exception() for f in futures]
    stops = [e for e in errors if e is not None and not isinstance(e, Exception | Abandoned)]
    if stops:
        raise stops[0]
    failures = [e for e in errors if isinstance(e, Exception)]
    if failures:
        raise failures[0]
    abandoned = [e for e in errors if e is not None]
    if abandoned:
        raise abandoned[0]  # an enclosing call stopped: stop this branch too
    return [f.result() for f in futures]


def _run_all(
    run: RunContext | None, kind: str, branches: Sequence[Callable[[], Any]], threads: int
) -> list[Any]:
    scope = _scope(run)
    prefix = ""
    group = None
    if scope is not None:
        position, _ = scope.reach(kind, kind, stores=False)
        prefix = str(position)
        group = _group_of(scope, drop_writes=False)
    if not branches:
        return []
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"durable-{kind}") as pool:
        futures = [
            _start(pool, scope, prefix, group, i, branch) for i, branch in enumerate(branches)
        ]
        pending: set[Future[Any]] = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            if group is not None and any(f.exception() is not None for f in done):
                group.stop()  # no new step in any branch; the ones in flight finish
    return _outcome(futures)


@traced("parallel")
def parallel(*branches: Callable[[], Any]) -> list[Any]:
    """Run ``branches`` (callables without arguments) together; their results in order (W9).

    Inside a durable run each branch's steps are journaled at dotted positions (S4). When a
    branch fails, no branch starts another step, and the failure of the lowest-numbered
    failing branch is raised once the steps in flight have ended.
    """
    checked = _callables(branches, "parallel")
    return _run_all(current_run(), "parallel", checked, min(len(checked), MAX_THREADS) or 1)


@traced("gather")
def gather(fn: Callable[[T], R], items: Iterable[T], at_most: int = MAX_THREADS) -> list[R]:
    """``fn(item)`` for every item, at most ``at_most`` at a time; results in item order (W9)."""
    if not callable(fn):
        raise TypeError(f"gather: fn must be callable, not {type(fn).__name__}")
    limit = _at_most(at_most)
    values = list(items)
    branches = [(lambda item=item: fn(item)) for item in values]
    return _run_all(current_run(), "gather", branches, min(limit, len(values)) or 1)


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
    position, record = scope.reach("race", "race")
    group = _group_of(scope, drop_writes=True)
    if record is not None and record.status == "completed":
        winner = int((record.result or {})["winner"])
        view = BranchRun(_root(scope), f"{position}.{winner}", group)
        token = view.activate()
        try:
            return checked[winner]()
        finally:
            view.deactivate(token)
    pool = ThreadPoolExecutor(
        max_workers=min(len(checked), MAX_THREADS), thread_name_prefix="durable-race"
    )
    try:
        futures = [_start(pool, scope, str(position), group, i, b) for i, b in enumerate(checked)]
        first = _first(futures)
        group.stop()
        error = first.exception()
        if error is not None and not isinstance(error, Exception):
            raise error  # the delivery stops (lost claim, park, crash): no winner is stored
        winner = futures.index(first)
        scope.append(
            [
                scope.event(
                    STEP_COMPLETED, position, name="race", kind="race", result={"winner": winner}
                )
            ]
        )
        return first.result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _first(futures: Sequence[Future[Any]]) -> Future[Any]:
    """The first future to end other than by :class:`Abandoned` (in branch order on a tie)."""
    pending = set(futures)
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        for future in sorted(done, key=futures.index):
            if not isinstance(future.exception(), Abandoned):
                return future
    raise Abandoned()  # every branch was stopped by an enclosing call


def _race_plain(branches: Sequence[Callable[[], Any]]) -> Any:
    pool = ThreadPoolExecutor(max_workers=min(len(branches), MAX_THREADS))
    try:
        futures = [_start(pool, None, "", None, i, b) for i, b in enumerate(branches)]
        return _first(futures).result()
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
