"""The unit of work: what one transaction of the store writes together (A6, A8, D2, D8).

A durable run's claim, suspension or end is events in its stream *and* its row in the run
table; a dispatcher's round is schedule events, their index rows and the rows of the durable
runs it sent. Each of those is one unit of work: either everything in it is stored or nothing.
The services write through this protocol and never see a database connection; the store
implements it (``store/sql_store.py`` on SQL, ``store/memory/`` in memory) and is the only
place that turns a database error into :class:`~celery_durable.errors.JournalUnavailable`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol

from celery_durable.core.journal import Append, Journal
from celery_durable.core.rules import LiveSchedules
from celery_durable.core.schedule_aggregate import ScheduleState

WAKE_AGAIN_AFTER = 30.0
"""Seconds after which a run marked woken but not claimed since may be woken again (the
wake-up was lost: the waking child's worker died between its commit and the send)."""

RUN_ROW_FIELDS = frozenset(
    {"status", "owner", "lease_until", "wake_at", "wake_after", "task", "message"}
)
"""What :meth:`UnitOfWork.save_run` may change in a run's row (``updated_at`` is ``now``)."""


class SentRun(Protocol):
    """A durable run whose message was sent (``message.Resend`` is one)."""

    @property
    def run_id(self) -> str: ...

    @property
    def task(self) -> str: ...

    def to_json(self) -> dict[str, Any]:
        """The stored form of the run's message (the run row's ``message``)."""
        ...


class UnitOfWork(Protocol):
    """The writes of one transaction; open one with :meth:`Store.unit_of_work`.

    Nothing is visible to other readers before the ``with`` block ends without an exception;
    an exception (an :class:`~celery_durable.errors.AppendConflict` from :meth:`append`
    included) stores nothing of the unit.
    """

    def append(self, appends: Sequence[Append]) -> list[int]:
        """Append to each stream at its expected version; return each stream's new version.

        Raises ``AppendConflict`` naming the first stream whose expected version is not its
        current one (A8); bad input raises ``ValueError``/``TypeError`` before anything is
        written.
        """
        ...

    def save_run(self, run_id: str, values: Mapping[str, Any], *, now: datetime) -> None:
        """Update the run's row with ``values`` (keys of :data:`RUN_ROW_FIELDS`), creating it
        when there is none yet (the dispatcher may record a sent run after a fast worker's
        claim: insert-or-update)."""
        ...

    def record_sent(self, sent: Sequence[SentRun], *, now: datetime, lease: float) -> None:
        """Rows for runs whose message was just sent, queued until a worker claims them
        within ``lease`` seconds (D8); a row that exists already is left alone."""
        ...

    def wake(
        self, run_id: str, *, now: datetime, lease: float, at_once: bool = False
    ) -> SentRun | None:
        """Note that a suspended run is being sent again (a child's end wakes its parent,
        W10): its row's ``lease_until`` is set to ``now + lease`` (a suspended row has none),
        its status and wake time stay. Returns the run's message to send once the unit is
        stored, or ``None`` when the row is not suspended or another wake-up is in flight
        already (its ``lease_until`` is set, less than :data:`WAKE_AGAIN_AFTER` seconds ago):
        of many children ending, only the first sends the parent. The parent's next
        suspension clears the mark.

        A row whose ``wake_after`` countdown is above 1 (a parent that waits for several of
        its children to end, W11) is not woken: the countdown goes down by one, unless
        ``at_once`` (a child that did not finish: the parent must see it now)."""
        ...

    def wait_for(
        self, run_id: str, children: Sequence[str], *, wake_after: int, now: datetime, lease: float
    ) -> SentRun | None:
        """The run, suspended in this unit (its row written by :meth:`save_run` before), waits
        until ``wake_after`` of ``children`` have ended (W11). Under the row's lock, count
        those not ended yet: none left, or ``wake_after`` ended already, and the run is marked
        woken here (its message returned, for the caller to send once the unit is stored);
        otherwise its countdown becomes at most that count, so that the last of them always
        wakes it. A child whose end commits after this look finds the row suspended and
        counts down (its end waited for the row's lock)."""
        ...

    def save_index(
        self, states: Sequence[ScheduleState], *, now: datetime, live: LiveSchedules | None = None
    ) -> None:
        """The index rows of these schedule states (D2); a row never goes back in version.
        ``live`` evaluates ``BeatEntry`` rules where a beat holds their objects (B3)."""
        ...


class Store(Protocol):
    """What the services write through and read from: a journal and its units of work.

    Every method raises :class:`~celery_durable.errors.JournalUnavailable` when the journal
    cannot be reached (its ``__cause__`` is the database layer's error) and
    :class:`~celery_durable.errors.JournalFailed` for any other failure of the database.
    """

    @property
    def journal(self) -> Journal:
        """The event streams (reads, and appends that need nothing else)."""
        ...

    def unit_of_work(self) -> AbstractContextManager[UnitOfWork]:
        """Open a transaction; it commits when the ``with`` block ends without an exception."""
        ...

    def write_run(
        self,
        append: Append,
        run_id: str,
        values: Mapping[str, Any],
        *,
        now: datetime,
        lease: float,
        wake: str | None = None,
        at_once: bool = False,
    ) -> tuple[int, SentRun | None] | None:
        """What a unit of work's ``append([append])``, ``save_run(run_id, values)`` and
        ``wake(wake, at_once=...)`` write, in one step of the store's own where it has a
        cheaper one (a run's claim and end, W11): the stream's new version and the woken
        parent's message (as ``wake``). ``None``: nothing was written, use a unit of work.
        Raises ``AppendConflict`` as ``append`` does, with nothing written."""
        ...

    def close(self) -> None:
        """Release what the store holds. Calling it twice is harmless."""
        ...


def countdown_left(children: int, ended: int, wake_after: int) -> int | None:
    """A parent suspending until ``wake_after`` of its ``children`` end, ``ended`` of them
    ended already (W11): the countdown its row keeps, or ``None`` when it must wake now (that
    many ended, or none is left running). Never more than the children still running, so
    that the last of them always wakes it. The rule of :meth:`UnitOfWork.wait_for`."""
    left = children - ended
    if left <= 0 or ended >= wake_after:
        return None
    return max(1, min(wake_after - ended, left))


def check_run_values(values: Mapping[str, Any]) -> None:
    """Refuse a run-row change naming a column :meth:`UnitOfWork.save_run` does not write."""
    unknown = sorted(set(values) - RUN_ROW_FIELDS)
    if unknown:
        raise ValueError(f"a run row has no field(s) {', '.join(map(repr, unknown))}")


__all__ = [
    "RUN_ROW_FIELDS",
    "WAKE_AGAIN_AFTER",
    "SentRun",
    "Store",
    "UnitOfWork",
    "check_run_values",
    "countdown_left",
]
