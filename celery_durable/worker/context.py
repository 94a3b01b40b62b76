"""The context of one delivery of a durable run: its in-memory state and its journal writes.

One :class:`RunContext` exists per delivery of a run's message. It reads the run's stream once,
keeps the stream's version in memory, and appends each step's event at that version, so a step
costs one INSERT and its commit and no read (on PostgreSQL the INSERT commits itself:
autocommit, no BEGIN or COMMIT round trip). The ``(stream, version)`` constraint makes a second
delivery that claimed the run meanwhile (or a signal sent from outside) show up as an
``AppendConflict``: the context then reads what was added, and either carries on (a signal, a
cancel request) or stops without storing anything (another delivery owns the run: W8).
"""

from __future__ import annotations

import contextvars
import copy
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from celery_durable import tracing
from celery_durable.core.codec import time_to_json
from celery_durable.core.ids import idempotency_key, run_stream
from celery_durable.core.journal import Append, NewEvent
from celery_durable.core.run_aggregate import (
    FORMAT,
    RUN_CLAIMED,
    RUN_SUSPENDED,
    Mismatch,
    Position,
    PositionId,
    RunState,
    apply,
    fold,
    stored_at,
)
from celery_durable.core.unit_of_work import SentRun
from celery_durable.errors import DurableError, JournalUnavailable
from celery_durable.store.conflicts import retry_on_conflict
from celery_durable.store.runs import RUNNING, SUSPENDED

if TYPE_CHECKING:
    from celery_durable.runtime import Runtime

log = logging.getLogger("celery_durable.runs")


@dataclass(frozen=True, slots=True)
class StepContext:
    """What a running step may know about itself (W2, S4)."""

    run_id: str
    position: PositionId
    attempt: int
    idempotency_key: str
    task: str


class Suspend(BaseException):
    """Give the worker back until ``until`` (``None``: until a signal or cancel arrives).

    A ``BaseException`` so that ``except Exception`` in a body does not swallow it.
    """

    def __init__(self, until: datetime | None) -> None:
        super().__init__(until)
        self.until = until


class LostClaim(BaseException):
    """Another delivery owns the run now: stop without storing anything (W8)."""


class DeliveryKilled(BaseException):
    """Stop this delivery on the spot, as a killed worker would: nothing more is stored, the
    claim stays until its lease passes (raised by a step hook of ``celery_durable.testing``)."""


class Changed(Exception):
    """Events stored by others meanwhile change the decision: decide again."""


class Park(BaseException):
    """The body is not the one that wrote the journal (W6): park the run."""

    def __init__(self, mismatch: Mismatch) -> None:
        super().__init__(str(mismatch))
        self.mismatch = mismatch


_RUN: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "celery_durable_run", default=None
)


def current_run() -> RunContext | None:
    """The durable run executing in this thread, or ``None`` outside a durable task."""
    return _RUN.get()


def step_context() -> StepContext:
    """The running step's run ID, position, attempt (1-based) and idempotency key (W2, S4).

    Raises :class:`DurableError` outside a durable step.
    """
    run = _RUN.get()
    step = None if run is None else run.step
    if step is None:
        raise DurableError("step_context() is only available inside a durable step")
    return step


class RunContext:
    """The state and the writes of one delivery of one durable run."""

    inline_waits = False
    """Whether retry back-offs wait inside the worker whatever their length (a parallel
    branch cannot give the worker back on its own: W9)."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        run_id: str,
        task: str,
        owner: str,
        state: RunState,
        short_sleep: float,
        eager: bool,
    ) -> None:
        self.runtime = runtime
        self.journal = runtime.journal
        self.run_id = run_id
        self.task = task
        self.stream = run_stream(run_id)
        self.owner = owner
        self.state = state
        self.lease = runtime.config.run_lease
        self.half_lease = timedelta(seconds=self.lease / 2)
        """The lease is renewed with the first write after this much of it has passed."""
        self.max_bytes = runtime.config.max_input_bytes
        self.short_sleep = short_sleep
        self.eager = eager
        self.lease_until: datetime | None = None
        self.position = 0
        self.step: StepContext | None = None
        self.in_step = False
        self.mismatch: Mismatch | None = None
        self.pristine: RunState | None = None
        """The same state, folded from copies of the events, whose values no body holds:
        what a parent waiting for its children leaves to the next delivery
        (:mod:`.parent_states`); ``None`` for other runs."""
        self.last_stored: NewEvent | None = None
        """The event this delivery stored last (at the state's version once stored)."""
        self.woke: SentRun | None = None
        """The parent's message when this run's end marked its parent woken (``wake=``)."""
        self.wake_known = False
        """Whether the stored end's unit of work looked at the parent's row (``wake=``)."""
        self.woke_self: SentRun | None = None
        """This run's own message when its suspension found the children it waits for
        ended already (``wait_for=``): the caller sends it once the suspension is stored."""
        self.tracer = tracing.tracer()
        """The tracer of this delivery's step spans (``None``: untraced), asked once: a
        provider set while the delivery runs is used from the next one."""
        self.lock = threading.RLock()
        """Held around every append: steps of parallel branches store from several threads
        (W9). Reads of a position take no lock (one dict lookup, atomic in CPython)."""

    # -- activation ------------------------------------------------------------------------

    def activate(self) -> contextvars.Token[RunContext | None]:
        return _RUN.set(self)

    @staticmethod
    def deactivate(token: contextvars.Token[RunContext | None]) -> None:
        _RUN.reset(token)

    def now(self) -> datetime:
        return self.runtime.now()

    def wait(self, seconds: float) -> None:
        """Wait in the worker (short waits only); a test clock skips the wait."""
        if seconds > 0:
            self.runtime.sleep(seconds)

    def retry_wait(self, seconds: float) -> None:
        """Wait in the worker before a step's next attempt (a parallel branch overrides it)."""
        self.wait(seconds)

    def notify(self, moment: str, position: PositionId, name: str) -> None:
        """Tell the runtime's step hooks (tests) that a step is ``"call"``-ed or ``"stored"``."""
        hooks = self.runtime.step_hooks
        if hooks:
            for hook in list(hooks):
                hook(moment, self.run_id, position, name)

    # -- positions ---------------------------------------------------------------------------

    def at(self, index: int) -> PositionId:
        """The position id of the ``index``-th position reached by this body (S4)."""
        return index

    def peek(self) -> tuple[PositionId, Position | None]:
        """The next position and what the journal holds there, without taking it (W14)."""
        position = self.at(self.position)
        return position, self.state.positions.get(position)

    def reach(
        self, name: str, kind: str, *, stores: bool = True
    ) -> tuple[PositionId, Position | None]:
        """Take the next position and return what the journal holds there (W6 check).

        ``stores=False``: the position of a parallel call, which stores nothing itself."""
        position = self.at(self.position)
        self.position += 1
        return position, self.check(position, name, kind, stores=stores)

    def check(
        self, position: PositionId, name: str, kind: str, *, stores: bool = True
    ) -> Position | None:
        """What the journal holds at ``position``; parks on another name or kind (W6)."""
        try:
            return stored_at(self.state, position, name, kind)
        except Mismatch as mismatch:
            self.mismatch = mismatch
            raise Park(mismatch) from None

    def old_branch(self, position: PositionId, change_id: str) -> None:
        """``patched(change_id)`` at ``position`` answered ``False`` (W14); the replay check
        records it."""

    def key(self, position: PositionId) -> str:
        return idempotency_key(self.task, self.run_id, position)

    # -- writing -----------------------------------------------------------------------------

    def event(self, type_: str, position: PositionId | None = None, **data: Any) -> NewEvent:
        body: dict[str, Any] = {"v": FORMAT}
        if position is not None:
            body["position"] = position
        body.update(data)
        return NewEvent(type=type_, data=body)

    def claim_event(self, now: datetime) -> tuple[NewEvent, datetime]:
        until = now + timedelta(seconds=self.lease)
        return (
            self.event(RUN_CLAIMED, owner=self.owner, lease_until=time_to_json(until)),
            until,
        )

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
        """Append ``events`` at the version in memory; fold them into the state.

        ``row``: values for the run's row in the run table, and ``sent``: rows for runs just
        sent (children being started), written in the same unit of work; ``wake``: a parent
        to mark woken in it too (a child's end, W10: :attr:`woke` then holds the parent's
        message when this unit is the one that woke it; ``wake_at_once``: whatever the
        parent's countdown of its children's ends); ``wait_for``: this run, suspended by
        ``row``, waits for some of its children to end (:attr:`woke_self` then holds its own
        message when they have ended already). The lease is renewed
        in the same commit once half of it has passed.
        Raises :class:`LostClaim` when another delivery claimed the run meanwhile, and
        :class:`Changed` when, after a conflict, ``abort_if()`` says the events no longer fit.
        """

        def attempt() -> None:
            now = self.now()
            batch = list(events)
            values = None if row is None else dict(row)
            renewing = self.lease_until is not None and now >= self.lease_until - self.half_lease
            if renewing:
                claim, until = self.claim_event(now)
                batch.append(claim)
                values = values or {}
                values.setdefault("lease_until", until)
                values.setdefault("owner", self.owner)
            self.stored(batch, self._write(batch, values, now, sent, wake, wake_at_once, wait_for))
            if renewing:
                self.lease_until = self.state.claim.lease_until if self.state.claim else None

        def reread() -> None:
            self.catch_up()
            if abort_if is not None and abort_if():
                raise Changed() from None

        with self.lock:
            retry_on_conflict(attempt, reread=reread, what=f"run {self.run_id!r}")

    def stored(self, batch: Sequence[NewEvent], version: int) -> None:
        """Fold ``batch``, just stored at the version in memory, into the state (``version``:
        the stream's version after it)."""
        start = self.state.version
        for offset, new in enumerate(batch, start=1):
            apply(self.state, start + offset, new.type, new.data)
        self.state.version = version
        if batch:
            self.last_stored = batch[-1]
        pristine = self.pristine
        if pristine is not None:
            if pristine.version != start:
                self.pristine = None
            else:
                for offset, new in enumerate(batch, start=1):
                    apply(pristine, start + offset, new.type, copy.deepcopy(new.data))
                pristine.version = version

    def _write(
        self,
        batch: list[NewEvent],
        values: dict[str, Any] | None,
        now: datetime,
        sent: Sequence[SentRun] = (),
        wake: str | None = None,
        wake_at_once: bool = False,
        wait_for: WaitFor | None = None,
    ) -> int:
        """Store ``batch``; a connection that dies under it is replaced once before the
        delivery gives up (a step's side effect has happened: its result must not be lost
        to a server restart between two steps)."""
        try:
            return self.write(batch, values, now, sent, wake, wake_at_once, wait_for)
        except JournalUnavailable as exc:
            if not exc.connection_lost:
                raise
            log.warning(
                "run %r: the journal connection was lost while storing %s; "
                "storing it again on a fresh connection",
                self.run_id, ", ".join(new.type for new in batch), extra={"run_id": self.run_id},
            )  # fmt: skip
            self.pristine = None
            landed = self._landed(batch)
            # (landed: whether it marked the parent is unknown; wake_known stays False)
            if landed is not None:
                if wait_for is not None:
                    # Whether its children had ended is unknown: look again (waking itself
                    # at worst once more than needed).
                    self.woke_self = self.runtime.runs.resend_of(self.run_id)
                return landed
            return self.write(batch, values, now, sent, wake, wake_at_once, wait_for)

    def _landed(self, batch: list[NewEvent]) -> int | None:
        """The stream's version if ``batch`` was committed although its reply was lost."""
        stored = self.journal.read_stream(self.stream, self.state.version)
        head = stored[: len(batch)]
        if len(head) == len(batch) and all(
            (s.type, s.data) == (new.type, new.data) for s, new in zip(head, batch, strict=True)
        ):
            return self.state.version + len(batch)
        return None

    def write(
        self,
        batch: Sequence[NewEvent],
        values: dict[str, Any] | None,
        now: datetime,
        sent: Sequence[SentRun] = (),
        wake: str | None = None,
        wake_at_once: bool = False,
        wait_for: WaitFor | None = None,
    ) -> int:
        """The one write of a run's events and its row: ``batch`` at the version in memory,
        the row's ``values``, the rows of runs ``sent``, the mark of a parent woken
        (``wake``) and this run's wait for its children (``wait_for``), in one unit of work
        (events alone, a step's result: the journal's ``append``, its own transaction); the
        stream's new version. ``AppendConflict`` when another writer got there first."""
        if values is None and not sent and wake is None:
            return self.journal.append(self.stream, self.state.version, batch)
        append = Append(stream=self.stream, expected_version=self.state.version, events=batch)
        woke = woke_self = None
        if values is not None and not sent and wait_for is None:
            # A claim, an end: one statement where the store has one (W11's fan-out).
            done = self.runtime.store.write_run(
                append, self.run_id, values, now=now, lease=self.lease, wake=wake,
                at_once=wake_at_once,
            )  # fmt: skip
            if done is not None:
                version, woke = done
                if wake is not None:
                    self.woke, self.wake_known = woke, True
                self.woke_self = None
                return version
        with self.runtime.store.unit_of_work() as unit:
            version = unit.append([append])[0]
            if values is not None:
                unit.save_run(self.run_id, values, now=now)
            if sent:
                unit.record_sent(sent, now=now, lease=self.lease)
            if wake is not None:
                woke = unit.wake(wake, now=now, lease=self.lease, at_once=wake_at_once)
            if wait_for is not None:
                woke_self = unit.wait_for(
                    self.run_id,
                    wait_for.children,
                    wake_after=wait_for.wake_after,
                    now=now,
                    lease=self.lease,
                )
        if wake is not None:
            self.woke, self.wake_known = woke, True
        self.woke_self = woke_self
        return version

    def catch_up(self) -> None:
        """Fold what others appended; raise :class:`LostClaim` if the run is no longer ours."""
        self.pristine = None  # (what others stored is not folded into it)
        fold(self.journal.read_stream(self.stream, self.state.version), self.state)
        claim = self.state.claim
        if claim is None or claim.owner != self.owner or self.state.ended:
            raise LostClaim()

    # -- suspending ------------------------------------------------------------------------

    def suspend(
        self,
        until: datetime | None,
        reason: str,
        events: Sequence[NewEvent] = (),
        *,
        wait: str | None = None,
        wake_at: datetime | None = None,
        wait_for: WaitFor | None = None,
    ) -> Suspend:
        """Store ``events`` and a ``RunSuspended`` (releasing the claim); return the
        :class:`Suspend` to raise. Short waits come back by a broker countdown; the run's
        row tells the dispatcher when to send it again (at once for long waits, one lease
        later for short ones, in case the countdown message is lost). ``wake_at``: when the
        dispatcher sends a run without a wake time again (a parent waiting for children, in
        case the child's wake-up is lost); ``wait_for``: the children whose ends wake it
        (:meth:`append`)."""
        now = self.now()
        wake_at = until if wake_at is None else wake_at
        if until is not None and (until - now).total_seconds() <= self.short_sleep:
            wake_at = until + timedelta(seconds=self.lease)
        suspended = self.event(
            RUN_SUSPENDED,
            until=None if until is None else time_to_json(until),
            reason=reason,
            wait=wait,
        )
        saved_lease = self.lease_until
        self.lease_until = None  # no renewal on the suspension itself
        try:
            self.append(
                [*events, suspended],
                {
                    "status": SUSPENDED, "wake_at": wake_at, "owner": None, "lease_until": None,
                    "wake_after": None if wait_for is None else wait_for.wake_after,
                },
                abort_if=lambda: self.must_wake(wait),
                wait_for=wait_for,
            )  # fmt: skip
        except BaseException:
            self.lease_until = saved_lease
            raise
        return Suspend(until)

    def must_wake(self, wait: str | None) -> bool:
        """Whether something stored meanwhile (a cancel request, the awaited signal) means
        the run must not go to sleep."""
        state = self.state
        return state.cancel_pending or (wait is not None and state.pending_signal(wait) is not None)


@dataclass(frozen=True)
class WaitFor:
    """A parent's suspension waits for ``wake_after`` of ``children`` to end (W11)."""

    children: Sequence[str]
    wake_after: int


def claim_row(owner: str, lease_until: datetime) -> dict[str, Any]:
    """The run row of a freshly claimed run."""
    return {"status": RUNNING, "owner": owner, "lease_until": lease_until, "wake_at": None}
