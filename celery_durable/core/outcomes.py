"""How a durable run ended (W7): ``Finished``, ``Faulted`` or ``Cancelled``, from the journal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery_durable.errors import RunCancelled, RunFaulted


@dataclass(frozen=True, slots=True)
class Finished:
    """The body returned ``value`` (the JSON value stored in the journal)."""

    value: Any = None


@dataclass(frozen=True, slots=True)
class Faulted:
    """The body raised, or the run was parked (W6).

    ``error`` is the message, ``error_type`` the exception's ``module.QualName``, ``kind`` the
    ``StepFailed`` kind when the body let a step failure escape, ``"parked"`` for a parked run.
    """

    error: str
    error_type: str = "Exception"
    kind: str | None = None


@dataclass(frozen=True, slots=True)
class Cancelled:
    """``durable.cancel`` was asked and the body did not return a value afterwards."""


Outcome = Finished | Faulted | Cancelled


def raise_for(run_id: str, outcome: Outcome) -> Any:
    """The value of a finished run; ``RunFaulted`` or ``RunCancelled`` otherwise."""
    if isinstance(outcome, Finished):
        return outcome.value
    if isinstance(outcome, Faulted):
        raise RunFaulted(
            f"run {run_id!r} faulted: {outcome.error_type}: {outcome.error}",
            run_id=run_id,
            error=outcome.error,
            error_type=outcome.error_type,
            kind=outcome.kind,
        )
    raise RunCancelled(f"run {run_id!r} was cancelled", run_id=run_id)
