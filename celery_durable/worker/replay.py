"""The replay check: stored durable runs replayed against the current code, storing nothing
(W6, W14).

Each run's body is called again inside a :class:`ReplayContext`: every position it reaches is
answered from the journal (a stored result, a stored failure, a sleep that is over), no step
function runs, nothing is appended and nothing is sent (an attempt to store stops the replay).
The path the body takes is compared with the stored one by
:func:`~celery_durable.core.divergence.first_divergence_at`.

Ended runs and runs still going (running, suspended: a sleep, a signal wait, a parent waiting
for its children) are replayed alike. A run still going stops at its first position with
nothing stored, the one it will reach next: that is not a divergence, its path agrees so far.
A cancel request not yet delivered is left out (the check asks whether the code follows the
stored path, and must not cancel children). Code outside steps runs as it does on every
replay: it must be free of side effects (W2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from celery_durable.core.branches import BRANCHES_STOPPED
from celery_durable.core.divergence import Divergence, OldBranch, Step, first_divergence_at
from celery_durable.core.ids import run_stream
from celery_durable.core.journal import NewEvent
from celery_durable.core.run_aggregate import Position, PositionId, RunState, apply, fold
from celery_durable.core.unit_of_work import SentRun
from celery_durable.errors import DurableError
from celery_durable.message import decode_args, unreadable_secret
from celery_durable.secret_lookup import secret_lookup
from celery_durable.store.runs import RUNNING, SUSPENDED
from celery_durable.worker.context import RunContext, WaitFor

if TYPE_CHECKING:
    from celery_durable.runtime import Runtime

AFTER_EVERYTHING = datetime(9999, 1, 1, tzinfo=timezone.utc)
"""The replay's clock: every stored sleep, retry and timeout is over."""

LIVE = (SUSPENDED, RUNNING)
"""Run-table statuses of the runs still going that the check replays (W14)."""


class _Stop(BaseException):
    """The body left the stored path (or would store something): the replay ends here."""


class CannotReplay(DurableError):
    """A run this process cannot replay, for a reason that says nothing of the code: a secret
    input (P5) that cannot be read here. Not a divergence (W6): the run was not checked."""

    def __init__(self, run_id: str, task: str, reason: str) -> None:
        super().__init__(f"run {run_id!r} ({task}): cannot replay: {reason}")
        self.run_id, self.task, self.reason = run_id, task, reason

    def to_json(self) -> dict[str, str]:
        """The JSON form the CLI prints with ``--json``."""
        return {"run_id": self.run_id, "task": self.task, "reason": self.reason}


class ReplayContext(RunContext):
    """A run context that answers from the journal only, never writes and never sends."""

    sends = False
    """Children whose start may not have been sent are not sent again (W10)."""

    def __init__(self, runtime: Runtime, run_id: str, task: str, state: RunState) -> None:
        if state.cancel_pending:
            state.cancel_requested = False  # not delivered yet: no cancel of children here
        super().__init__(
            runtime,
            run_id=run_id,
            task=task,
            owner="replay-check",
            state=state,
            short_sleep=0.0,
            eager=False,
        )
        self.live = not state.ended and state.parked is None
        self.path: list[tuple[PositionId, Step]] = []
        self.old: list[tuple[PositionId, str]] = []

    def check(
        self, position: PositionId, name: str, kind: str, *, stores: bool = True
    ) -> Position | None:
        record = self.state.positions.get(position)
        if record is None and not stores:
            return None  # a group call stored before its marker existed (W9)
        if record is None and self.live:
            raise _Stop()  # where a run still going will go next: its path agrees so far
        self.path.append((position, (name, kind)))
        if record is None or (record.name, record.kind) != (name, kind):
            raise _Stop()
        return record

    def old_branch(self, position: PositionId, change_id: str) -> None:
        self.old.append((position, change_id))

    def append(
        self,
        events: Sequence[NewEvent],
        row: dict[str, Any] | None = None,
        *,
        abort_if: Callable[[], bool] | None = None,
        sent: Sequence[SentRun] = (),
        wake: str | None = None,
        wake_at_once: bool = False,
        wait_for: WaitFor | None = None,
    ) -> None:
        if events and all(new.type == BRANCHES_STOPPED for new in events):
            # A group stored before its markers stops again on replay (W9): bookkeeping,
            # not a step; kept in memory so that the replay goes on.
            for new in events:
                apply(self.state, self.state.version, new.type, new.data)
            return
        raise _Stop()

    def now(self) -> datetime:
        return AFTER_EVERYTHING

    def wait(self, seconds: float) -> None:
        return None

    def notify(self, moment: str, position: PositionId, name: str) -> None:
        return None


def replay_run(runtime: Runtime, run_id: str) -> Divergence | None:
    """Replay one run (ended or still going) against the registered task's current body;
    ``None`` when the body takes the stored path (so far, for a run still going).
    Raises :class:`CannotReplay` for a run whose secret input cannot be read here (P5)."""
    return replay_report(runtime, run_id)[0]


def replay_report(runtime: Runtime, run_id: str) -> tuple[Divergence | None, list[OldBranch]]:
    """:func:`replay_run`, with the ``patched`` markers at which the run takes the old
    branch (W14). A run that has not started (no journal yet) is not replayed."""
    state = fold(runtime.journal.read_stream(run_stream(run_id)))
    if state.message is None:
        return None, []
    status = None if state.ended or state.parked is not None else _live_status(state)
    task_name = state.task or ""
    stored = {pos: (p.name, p.kind) for pos, p in state.positions.items()}
    task = runtime.app.tasks.get(task_name)
    if task is None or not getattr(task, "__durable__", False):
        return Divergence(
            run_id=run_id,
            task=task_name,
            position=0,
            expected=stored.get(0),
            found=None,
            detail=f"task {task_name!r} is not a durable task registered in this app",
            status=status,
        ), []
    context = ReplayContext(runtime, run_id, task_name, state)
    lookup = secret_lookup(runtime.app)  # P5: run.input reads env: and setting: as the worker
    stored_args = state.message.get("args") or []
    unreadable = unreadable_secret(stored_args, lookup)
    if unreadable is not None:
        raise CannotReplay(run_id, task_name, str(unreadable))
    args = decode_args(stored_args, lookup)
    kwargs = dict(state.message.get("kwargs") or {})
    token = context.activate()
    ended = True
    try:
        task._body(*args, **kwargs)
    except _Stop:
        ended = False
    except Exception:
        pass  # the body raised (a stored failure raised again): its path ends there
    finally:
        context.deactivate(token)
    old = [
        OldBranch(run_id=run_id, task=task_name, position=position, change_id=change, status=status)
        for position, change in context.old
    ]
    found = first_divergence_at(stored, context.path, body_ended=ended)
    if found is None:
        return None, old
    position, expected, asked = found
    return Divergence(
        run_id=run_id,
        task=task_name,
        position=position,
        expected=expected,
        found=asked,
        status=status,
    ), old


def _live_status(state: RunState) -> str:
    return SUSPENDED if state.suspended else RUNNING


def check_runs(runtime: Runtime, **selection: Any) -> list[Divergence]:
    """Replay the selected runs (see :func:`check_report`) and return every divergence (W6).
    Runs that cannot be replayed here are not divergences."""
    return check_report(runtime, **selection)[0]


def selected_runs(
    runtime: Runtime,
    *,
    schedule: str | None = None,
    run_id: str | None = None,
    since: datetime | None = None,
    limit: int | None = None,
) -> list[str]:
    """The run IDs the check replays: ``run_id`` alone, or every run still going (running or
    suspended: W14) and then the ended ones, last ended first, ``since`` an instant and at
    most ``limit`` of them; only those of ``schedule`` when given."""
    if run_id is not None:
        return [run_id]

    def ours(rid: str) -> bool:
        return schedule is None or rid.startswith(f"{schedule}@")

    live = [
        str(row["run_id"])
        for status in LIVE
        for row in runtime.runs.list(status=status)
        if ours(str(row["run_id"]))
    ]
    rows = runtime.runs.ended(since=since, limit=None if schedule else limit)
    ended = [rid for rid, _ in rows if ours(rid)]
    if limit is not None:
        ended = ended[:limit]
    return sorted(live) + ended


def check_report(
    runtime: Runtime,
    *,
    schedule: str | None = None,
    run_id: str | None = None,
    since: datetime | None = None,
    limit: int | None = None,
) -> tuple[list[Divergence], list[OldBranch], list[CannotReplay]]:
    """Replay the selected runs (:func:`selected_runs`): every divergence (a run that would
    park, W6), every run that takes the old branch of a ``patched`` marker (W14), and every
    run that cannot be replayed here."""
    ids = selected_runs(runtime, schedule=schedule, run_id=run_id, since=since, limit=limit)
    found: list[Divergence] = []
    old: list[OldBranch] = []
    cannot: list[CannotReplay] = []
    for rid in ids:
        try:
            divergence, branches = replay_report(runtime, rid)
        except CannotReplay as exc:
            cannot.append(exc)
            continue
        if divergence is not None:
            found.append(divergence)
        old.extend(branches)
    return found, old, cannot
