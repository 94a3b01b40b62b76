"""The exceptions of celery_durable: one root, attributes kept, pickle-safe.

Celery ships exceptions between processes with pickle or JSON, so every class here
rebuilds itself from ``args`` (``__reduce__``) and keeps its fields as attributes.
"""

from __future__ import annotations

from typing import Any


class DurableError(Exception):
    """Root of every error this library raises on purpose.

    The message says what is wrong in words; ``rule`` names the SPEC rule broken (``"A7"``,
    ``"S1"`` …) when there is one, for logs and programs, never as a prefix of the message.
    """

    rule: str | None = None

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        for key, value in fields.items():
            setattr(self, key, value)
        self._fields = fields

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self._fields))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[DurableError], message: str, fields: dict[str, Any]) -> DurableError:
    return cls(message, **fields)


class InvalidSchedule(DurableError, ValueError):
    """A schedule ID, rule, policy or input breaks a rule of the specification (S1, R1-R8, A1)."""


class ScheduleConflict(DurableError):
    """The command does not fit the schedule's current state (A1-A4)."""


class ScheduleNotFound(ScheduleConflict):
    """The schedule was never created (a ``ScheduleConflict``: A2–A4 name that case a conflict)."""


class UnknownTask(DurableError, LookupError):
    """The task is not registered in the Celery app (A7)."""


class SolarUnavailable(DurableError, ImportError):
    """A Solar rule's due time is needed and the ``ephem`` package is not installed (B3)."""


class AppendConflict(DurableError):
    """Another writer appended to the stream first; re-read and decide again (A8)."""


class JournalError(DurableError):
    """The journal cannot be used: unreadable format, newer schema, bad URL."""


class StepFailed(DurableError):
    """A durable step failed; raised again on replay with the stored type name and message.

    ``kind`` is one of ``"error"``, ``"timeout"``, ``"cancelled"``, ``"not_retryable"``.
    """


class RunFaulted(DurableError):
    """``durable.result`` of a run that ended with an error."""


class RunCancelled(DurableError):
    """``durable.result`` of a run that was cancelled."""


class RunParked(DurableError):
    """A replay met a different step than the one stored at its position (W6)."""


class RunEnded(DurableError):
    """The durable run has ended: it takes no more signals or cancel requests."""


class AttemptTimeout(DurableError, TimeoutError):
    """One attempt of a step ran longer than its policy's ``timeout`` (W3)."""


class JournalUnavailable(JournalError):
    """The journal could not be reached (connection lost, server down, database locked).

    A durable task that meets it while storing its own progress is delivered again later; the
    run is not ended by it. The database layer's error is the ``__cause__``.
    """

    connection_lost: bool = False
    """Whether the connection died under a statement (the server closed it, the network
    dropped it): the statement may be tried once more on a fresh connection."""


class JournalFailed(JournalError):
    """The database refused or failed a statement for another reason than being away (a
    missing table, a constraint): the database layer's error is the ``__cause__``. Beat logs
    it and tries again, as for an outage; a delivery that meets it before its claim is stored
    sends its message again (W1)."""


class SecretUnavailable(DurableError, LookupError):
    """A secret input's reference names no value here (P5); ``reference`` is the reference."""
