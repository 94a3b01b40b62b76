"""Running a claimed durable run's body, and storing how it ended (W2, W6, W7).

The body runs with the run's context active, so that its steps, primitives and children take
positions in the run's stream. Its return value ends the run ``Finished``; an exception ends it
``Faulted`` (``Cancelled`` when a cancel was asked for); a body that is not the one that wrote
the journal parks the run (W6). Each end is events and the run's row in one unit of work; a
child's end then wakes its parent (W10).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn

from celery.exceptions import Ignore, Reject
from celery.exceptions import Retry as CeleryRetry

from celery_durable.core.codec import check_json_value
from celery_durable.core.outcomes import Outcome, raise_for
from celery_durable.core.retry import type_name
from celery_durable.core.run_aggregate import (
    RUN_CANCELLED,
    RUN_FAULTED,
    RUN_FINISHED,
    RUN_PARKED,
    Mismatch,
    unreached,
)
from celery_durable.errors import DurableError, JournalUnavailable, RunParked
from celery_durable.message import decode_args
from celery_durable.secret_lookup import secret_lookup
from celery_durable.store.runs import CANCELLED, FAULTED, FINISHED, PARKED
from celery_durable.worker.children import wake_parent
from celery_durable.worker.context import LostClaim, Park, RunContext, Suspend

__all__ = ["ended_already", "execute"]

log = logging.getLogger("celery_durable.tasks")


def ended_already(run: RunContext) -> Any:
    """A delivery of a run that has ended: return (or raise) its stored outcome (W1), after
    waking the parent of a child run when the parent is suspended (W10).

    Such a delivery is a child cancelled before it started (its claim stored the end, W12)
    or the broker's redelivery of a child whose worker died after storing the end, maybe
    before it sent the parent the wake-up that the end's unit of work had marked: the
    parent's row then says woken, and no other child's end sends it for
    ``WAKE_AGAIN_AFTER`` seconds. This delivery sends it, so the parent resumes without the
    dispatcher (at worst one wake-up more than needed: the parent suspends again)."""
    wake_parent(run)
    outcome: Outcome | None = run.state.outcome
    if outcome is None:  # pragma: no cover - the claim stored the end
        raise DurableError(f"run {run.run_id!r} ended without an outcome")
    return raise_for(run.run_id, outcome)


def execute(run: RunContext, args: Any, kwargs: Any, body: Callable[..., Any]) -> Any:
    """Run the body of a claimed run and store its end; ``None`` when the claim was lost."""
    token = run.activate()
    try:
        try:
            value = body(*decode_args(args, secret_lookup(run.runtime.app)), **kwargs)
        except (Suspend, LostClaim, CeleryRetry, Ignore, Reject, JournalUnavailable):
            raise
        except Park:
            _park(run)
        except Exception as exc:
            if run.mismatch is not None:
                _park(run)
            if run.state.cancel_requested:
                _end(run, RUN_CANCELLED, CANCELLED, {})
            else:
                _end(
                    run, RUN_FAULTED, FAULTED,
                    {
                        "error_type": type_name(type(exc)),
                        "message": str(exc),
                        "failure": getattr(exc, "kind", None)
                        if isinstance(exc, DurableError)
                        else None,
                    },
                )  # fmt: skip
            raise
        if run.mismatch is not None:
            _park(run)
        left = unreached(run.state, run.position)
        if left is not None:
            run.mismatch = Mismatch(run.position, (left.name, left.kind), ("(end of body)", "end"))
            _park(run)
        try:
            check_json_value(
                value,
                f"the result of run {run.run_id!r}",
                max_bytes=run.max_bytes,
                error=DurableError,
            )
        except DurableError as exc:
            _end(
                run,
                RUN_FAULTED,
                FAULTED,
                {"error_type": type_name(TypeError), "message": str(exc), "failure": None},
            )
            raise
        _end(run, RUN_FINISHED, FINISHED, {"result": value})
        return value
    except LostClaim:
        log.warning("run %r was claimed by another delivery; this one stops (W8)", run.run_id)
        if run.eager:
            return None
        raise Ignore() from None  # (the claiming delivery stores the run's result: delivery.py)
    finally:
        run.deactivate(token)


def _end(run: RunContext, type_: str, status: str, data: dict[str, Any]) -> None:
    run.lease_until = None
    run.append(
        [run.event(type_, **data)],
        {"status": status, "owner": None, "lease_until": None, "wake_at": None},
        wake=run.state.parent,
        # A parent counting down its children's ends (W11) must see one that did not finish
        # at once: it stops starting others.
        wake_at_once=status != FINISHED,
    )
    if run.state.parent:
        run.runtime.fault("after-child-end")  # crash tests: the end is stored, not yet sent
    wake_parent(run)


def _park(run: RunContext) -> NoReturn:
    mismatch = run.mismatch
    if mismatch is None:  # pragma: no cover - callers check
        raise DurableError("park without a mismatch")
    data = {
        "position": mismatch.position,
        "expected": {"name": mismatch.expected[0], "kind": mismatch.expected[1]},
        "found": {"name": mismatch.found[0], "kind": mismatch.found[1]},
        "message": str(mismatch),
    }
    if run.state.parked != {"v": 1, **data}:
        _end(run, RUN_PARKED, PARKED, data)
    raise RunParked(
        str(mismatch),
        run_id=run.run_id,
        position=mismatch.position,
        expected=mismatch.expected,
        found=mismatch.found,
    )
