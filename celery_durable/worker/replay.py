"""The replay check: ended durable runs replayed against the current code, storing nothing (W6).

Each run's body is called again inside a :class:`ReplayContext`: every position it reaches is
answered from the journal (a stored result, a stored failure, a sleep that is over), no step
function runs, and nothing is appended (an attempt to store stops the replay). The path the
body takes is compared with the stored one by :func:`~celery_durable.core.replay.first_divergence`.
Code outside steps runs as it does on every replay: it must be free of side effects (W2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from celery_durable.core.ids import run_stream
from celery_durable.core.journal import NewEvent
from celery_durable.core.replay import Divergence, OldBranch, Step, first_divergence_at
from celery_durable.core.run_aggregate import Position, PositionId, RunState, fold
from celery_durable.errors import DurableError
from celery_durable.message import decode_args, unreadable_secret
from celery_durable.secret_lookup import secret_lookup
from celery_durable.worker.context import RunContext

if TYPE_CHECKING:
    from celery_durable.runtime import Runtime

AFTER_EVERYTHING = datetime(9999, 1, 1, tzinfo=timezone.utc)
"""The replay's clock: every stored sleep, retry and timeout of an ended run is over."""


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
    """A run context that answers from the journal only and never writes."""

    def __init__(self, runtime: Runtime, run_id: str, task: str, state: RunState) -> None:
        super().__init__(
            runtime,
            run_id=run_id,
            task=task,
            owner="replay-check",
            state=state,
            short_sleep=0.0,
            eager=False,
        )
        self.path: list[tuple[PositionId, Step]] = []
        self.old: list[tuple[PositionId, str]] = []

    def check(
        self, position: PositionId, name: str, kind: str, *, stores: bool = True
    ) -> Position | None:
        record = self.state.positions.get(position)
        if record is None and not stores:
            return None  # a parallel call's own position: nothing is stored there
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
        also: Callable[[Any], None] | None = None,
    ) -> None:
        raise _Stop()

    def now(self) -> datetime:
        return AFTER_EVERYTHING

    def wait(self, seconds: float) -> None:
        return None

    def notify(self, moment: str, position: PositionId, name: str) -> None:
        return None


def replay_run(runtime: Runtime, run_id: str) -> Divergence | None:
    """Replay one ended run against the registered task's current body; ``None`` when the
    body takes the stored path. Runs that have not ended are not replayed (``None``).
    Raises :class:`CannotReplay` for a run whose secret input cannot be read here (P5)."""
    return replay_report(runtime, run_id)[0]


def replay_report(runtime: Runtime, run_id: str) -> tuple[Divergence | None, list[OldBranch]]:
    """:func:`replay_run`, with the ``patched`` markers at which the run takes the old
    branch (W14)."""
    state = fold(runtime.journal.read_stream(run_stream(run_id)))
    if not state.ended or state.message is None:
        return None, []
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
        OldBranch(run_id=run_id, task=task_name, position=position, change_id=change)
        for position, change in context.old
    ]
    found = first_divergence_at(stored, context.path, body_ended=ended)
    if found is None:
        return None, old
    position, expected, asked = found
    return Divergence(
        run_id=run_id, task=task_name, position=position, expected=expected, found=asked
    ), old


def check_runs(runtime: Runtime, **selection: Any) -> list[Divergence]:
    """Replay ended runs (all, one ``run_id``, those of one ``schedule``, those ended
    ``since``; at most ``limit``, last ended first: see :func:`check_report`) and return
    every divergence (W6). Runs that cannot be replayed here are not divergences."""
    return check_report(runtime, **selection)[0]


def check_report(
    runtime: Runtime,
    *,
    schedule: str | None = None,
    run_id: str | None = None,
    since: datetime | None = None,
    limit: int | None = None,
) -> tuple[list[Divergence], list[OldBranch], list[CannotReplay]]:
    """Replay the selected ended runs; every divergence (W6), every run that takes the old
    branch of a ``patched`` marker (W14), and every run that cannot be replayed here."""
    if run_id is not None:
        ids = [run_id]
    else:
        rows = runtime.runs.ended(since=since, limit=None if schedule else limit)
        ids = [rid for rid, _ in rows if schedule is None or rid.startswith(f"{schedule}@")]
        if limit is not None:
            ids = ids[:limit]
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
