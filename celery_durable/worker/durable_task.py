"""Worker-side durable tasks: the task class and the delivery shell (W1, W8).

Every delivery of a durable task's message reads the run's stream once and decides, with the
pure :func:`~celery_durable.core.run_aggregate.on_delivery`, whether to return a stored outcome,
to leave the run to another delivery, to go back to sleep, or to claim the run and replay the body.
The claim is an event appended at the version read, so of two deliveries at once only one
wins (W8); the other finishes without running a step.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, cast

from celery import Task
from celery.exceptions import Ignore, Reject
from celery.exceptions import Retry as CeleryRetry

from celery_durable.config import ConfigError
from celery_durable.core.codec import check_json_value
from celery_durable.core.ids import run_stream
from celery_durable.core.outcomes import Faulted, Finished, Outcome, raise_for
from celery_durable.core.retry import type_name
from celery_durable.core.run_aggregate import (
    RUN_CANCELLED,
    RUN_FAULTED,
    RUN_FINISHED,
    RUN_PARKED,
    RUN_STARTED,
    Busy,
    Ended,
    NotYet,
    Proceed,
    RunState,
    fold,
    on_delivery,
    unreached,
)
from celery_durable.errors import DurableError, JournalError, JournalUnavailable, RunParked
from celery_durable.message import (
    OWNER_HEADER,
    PARENT_HEADER,
    decode_args,
    message_json,
    unreadable_secret,
)
from celery_durable.secret_lookup import secret_lookup
from celery_durable.store.conflicts import retry_on_conflict
from celery_durable.store.journal.sql import DatabaseError, journal_errors
from celery_durable.store.runs import CANCELLED, FAULTED, FINISHED, PARKED
from celery_durable.worker.children import wake_parent
from celery_durable.worker.context import (
    DeliveryKilled,
    LostClaim,
    Park,
    RunContext,
    Suspend,
    claim_row,
)
from celery_durable.worker.run_ends import (
    MISSED_LATE_DELIVERY,
    past_deadline,
    record_failed_to_start,
    record_missed,
)

if TYPE_CHECKING:
    from celery_durable.runtime import Runtime

log = logging.getLogger("celery_durable.tasks")

DEFAULT_SHORT_SLEEP = 60.0
"""Default of ``durable_short_sleep``: longer waits are left to the dispatcher."""

_EAGER_POLL = 0.2


class DurableTaskMixin:
    """What makes a Celery task durable; combined with the app's task class."""

    __durable__ = True
    runtime: Runtime
    # The broker redelivers the message of a worker that died mid-run (W1): replay is safe.
    acks_late = True
    reject_on_worker_lost = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        task: Any = self
        return deliver(task, args, kwargs, self._body)

    def _body(self, *args: Any, **kwargs: Any) -> Any:
        parent_call = super().__call__  # type: ignore[misc]
        if getattr(parent_call, "__func__", None) is Task.__call__:
            # Task.__call__ would push a second request without the task id; the tracer has
            # pushed the real one already.
            return self.run(*args, **kwargs)  # type: ignore[attr-defined]
        return parent_call(*args, **kwargs)


def durable_task_base(runtime: Runtime) -> type:
    """The task class of durable tasks for ``runtime``'s app, derived from ``app.Task``.

    Deriving from ``app.Task`` keeps what a framework put there (Django's ``DjangoTask``, a
    Flask app-context task). ``acks_late`` with ``reject_on_worker_lost`` makes the broker
    deliver the message again when a worker dies mid-run: the journal makes that replay safe.
    """
    base: type = runtime.app.Task
    return type(
        "DurableTask",
        (DurableTaskMixin, base),
        {"runtime": runtime, "__module__": __name__},
    )


P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class DurableTask(Protocol[P, R_co]):
    """A durable task as a type checker sees it: the body's signature, and Celery's task API.

    ``@durable.task`` returns the Celery task object; this protocol keeps the decorated
    function's parameters for calling it and for ``delay``. Other task attributes are ``Any``.
    """

    name: str

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> Any: ...

    def apply_async(
        self, args: Any = None, kwargs: Any = None, task_id: str | None = None, **options: Any
    ) -> Any: ...

    def __getattr__(self, name: str) -> Any: ...


def make_durable_task(
    runtime: Runtime, base: type, fun: Callable[P, R], options: dict[str, Any]
) -> DurableTask[P, R]:
    """Register ``fun`` as a durable Celery task (every Celery task option passes through)."""
    options = dict(options)
    options.setdefault("base", base)
    # A durable task belongs to this Durable's journal: do not copy it into other apps
    # (Celery's default ``shared=True`` would, with this app's task class and journal).
    options.setdefault("shared", False)
    return cast("DurableTask[P, R]", runtime.app.task(**options)(fun))


def short_sleep_limit(app: Any) -> float:
    """Longest wait sent back by a broker countdown: ``durable_short_sleep`` (60 s), kept under
    half of Redis' visibility timeout, which would otherwise redeliver the waiting message."""
    limit = float(app.conf.get("durable_short_sleep") or DEFAULT_SHORT_SLEEP)
    options = app.conf.get("broker_transport_options") or {}
    visibility = options.get("visibility_timeout") if isinstance(options, Mapping) else None
    if visibility:
        limit = min(limit, float(visibility) / 2)
    return limit


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def owner_alive(owner: str) -> bool:
    """False only when ``owner`` ran on this host in a process that no longer exists.

    A worker killed mid-run leaves a live-looking claim until its lease passes. When the
    broker redelivers its message to a worker on the same host, the dead process is seen at
    once and the run is taken over without waiting for the lease. Claims from other hosts
    are trusted until their lease passes.
    """
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return True
    pid = int(pid_text)
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def deliver(
    task: Any, args: tuple[Any, ...], kwargs: dict[str, Any], body: Callable[..., Any]
) -> Any:
    """Run one delivery of a durable task's message (the task's ``__call__``)."""
    request = task.request
    run_id = request.id
    if run_id is None or request.called_directly:
        # A plain function call, not a Celery execution: no run, steps are plain calls.
        return body(*decode_args(args, secret_lookup(task.app)), **kwargs)
    eager = bool(request.is_eager)
    # A delivery sent again because the journal was away keeps the claim it had (W8).
    owner = getattr(request, OWNER_HEADER, None) or _owner()
    while True:
        try:
            return _deliver_once(task, run_id, args, kwargs, body, eager, owner)
        except Suspend as suspend:
            until = suspend.until
        except _Later as later:
            until = later.until
        except DeliveryKilled:
            # A simulated worker crash: nothing more is stored and the claim stays, as after
            # kill -9. The message is dropped as on a broker that does not redeliver; the
            # dispatcher sends the run again once its lease has passed (D8).
            log.warning("run %r: delivery killed (simulated crash)", run_id)
            raise Reject("delivery killed (simulated crash)", requeue=False) from None
        except _NotClaimed as away:
            # Nothing of the run has happened in this delivery: the message must go back to
            # the broker, never be acknowledged as done (W1). apply() has no message: the
            # caller gets the error.
            if eager:
                raise away.error from None
            retries = _retries(task)
            delay = journal_backoff(retries)
            log.log(
                logging.WARNING if isinstance(away.error, JournalUnavailable) else logging.ERROR,
                "run %r: the journal cannot be used before the run is claimed (%s: %s); "
                "nothing has run, the message is sent again in %.0f s (attempt %d)",
                run_id, type(away.error).__name__, away.error, delay, retries + 1,
            )  # fmt: skip
            raise _send_again(task, delay, retries=retries + 1) from None
        except JournalUnavailable as exc:
            # Nothing is lost: what was stored stays, the rest is replayed. Come back later.
            retries = _retries(task)
            delay = journal_backoff(retries)
            log.warning(
                "run %r: %s; the message is sent again in %.0f s (attempt %d)",
                run_id, exc, delay, retries + 1,
            )  # fmt: skip
            if eager:
                time.sleep(delay)
                continue
            raise _send_again(
                task, delay, headers={OWNER_HEADER: owner}, retries=retries + 1
            ) from None
        runtime: Runtime = task.runtime
        now = runtime.now()
        wait = None if until is None else max(0.0, (until - now).total_seconds())
        if eager:
            # apply(): nobody would send the task again, so wait here and look again.
            time.sleep(min(_EAGER_POLL, wait) if wait is not None else _EAGER_POLL)
            continue
        if wait is not None and wait <= short_sleep_limit(task.app):
            raise _send_again(task, wait)
        # Long (or signal) waits: the run's row tells the dispatcher when to send it again.
        return None


JOURNAL_BACKOFF_MAX = 30.0
"""Longest countdown of a delivery sent again because the journal could not be used."""


def journal_backoff(retries: int) -> float:
    """Countdown before the next delivery after ``retries`` journal failures in a row:
    1, 2, 4, 8, 16, then every 30 s, for as long as it takes (no attempt limit)."""
    return min(2.0 ** min(retries, 5), JOURNAL_BACKOFF_MAX)


def _retries(task: Any) -> int:
    return int(getattr(task.request, "retries", 0) or 0)


def _send_again(
    task: Any,
    countdown: float,
    headers: dict[str, Any] | None = None,
    *,
    retries: int | None = None,
) -> CeleryRetry | Reject:
    """Publish the same message again (same task id) with a countdown; return the Celery
    ``Retry`` to raise, which makes the worker acknowledge this delivery. Unlike
    ``task.retry`` it has no retry limit: a durable run may sleep any number of times.

    The copy is published before this delivery is acknowledged, so the broker always holds
    one of them. If publishing fails, the delivery is rejected with ``requeue=True`` instead:
    the broker keeps the message (W1).
    """
    extra: dict[str, Any] = {"headers": headers} if headers else {}
    if retries is not None:
        extra["retries"] = retries
    signature = task.signature_from_request(task.request, countdown=countdown, **extra)
    try:
        signature.apply_async()
    except Exception as exc:
        log.error(
            "run %r: cannot publish the message again (%s: %s); it is rejected and requeued",
            task.request.id, type(exc).__name__, exc,
        )  # fmt: skip
        return Reject(exc, requeue=True)
    return CeleryRetry(f"durable run waits {countdown:.3f} s", when=countdown, sig=signature)


class _NotClaimed(Exception):
    """The journal failed before this delivery stored its claim: nothing of the run ran."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


class _Later(Exception):
    def __init__(self, until: datetime | None) -> None:
        super().__init__(until)
        self.until = until


def _deliver_once(
    task: Any,
    run_id: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    body: Callable[..., Any],
    eager: bool,
    owner: str,
) -> Any:
    try:
        run = _claimed(task, run_id, args, kwargs, eager, owner)
    except (JournalError, DatabaseError, ConfigError) as exc:
        # ConfigError: a durable_* setting the journal cannot be opened with.
        raise _NotClaimed(exc) from exc
    if run is None:
        return None
    if isinstance(run, Ended):
        return raise_for(run_id, run.outcome)
    if run.state.ended:  # cancelled before it started (W12)
        wake_parent(run)
        return raise_for(run_id, run.state.outcome)  # type: ignore[arg-type]
    return _execute(run, args, kwargs, body)


def _claimed(
    task: Any,
    run_id: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    eager: bool,
    owner: str,
) -> RunContext | Ended | None:
    """Read the run and store this delivery's claim: the claimed run, the run's end when it
    has ended already, or ``None`` when another live delivery owns it (W8)."""
    runtime: Runtime = task.runtime
    journal = runtime.journal
    stream = run_stream(run_id)
    with journal_errors():
        state = fold(journal.read_stream(stream))
    run = RunContext(
        runtime,
        run_id=run_id,
        task=task.name,
        owner=owner,
        state=state,
        short_sleep=short_sleep_limit(task.app),
        eager=eager,
    )
    if not state.started and past_deadline(task.request, runtime.now()):
        # P1: a run that has not started by its start deadline never starts.
        record_missed(runtime, task, task.request, MISSED_LATE_DELIVERY)
        return None
    if not state.started:
        # P5, D5: every secret of the input is read before the body runs; one that cannot be
        # read fails the run's start (the body never sees a half-resolved input).
        unreadable = unreadable_secret(args, secret_lookup(task.app))
        if unreadable is not None:
            record_failed_to_start(runtime, task, task.request, f"SecretUnavailable: {unreadable}")
            return None

    def claim() -> tuple[bool, Ended | None]:
        """``(True, what to return)`` when this delivery is done, ``(False, None)`` once claimed."""
        now = runtime.now()
        decision = on_delivery(state, now, owner_alive, owner=owner)
        if isinstance(decision, Ended):
            log.info("run %r has ended already; returning its stored outcome", run_id)
            return True, decision
        if isinstance(decision, Busy):
            limit = run.short_sleep
            if (decision.until - now).total_seconds() <= limit:
                raise _Later(decision.until)
            log.info(
                "run %r is owned by %s; this delivery does nothing (W8)", run_id, decision.owner
            )
            return True, None
        if isinstance(decision, NotYet):
            raise _Later(decision.until)
        if not isinstance(decision, Proceed):
            raise DurableError(f"run {run_id!r}: unexpected delivery decision {decision!r}")
        with journal_errors():
            _claim(run, task, args, kwargs, now)
        return False, None

    def reread() -> None:
        with journal_errors():
            fold(journal.read_stream(stream, state.version), state)

    try:
        done, value = retry_on_conflict(claim, reread=reread, what=f"run {run_id!r}: claim")
    except JournalError:
        raise
    except DurableError as exc:
        # No claim stored, so nothing of the run ran: keep the message (W1).
        raise JournalUnavailable(str(exc)) from exc
    return value if done else run


def _claim(run: RunContext, task: Any, args: Any, kwargs: Any, now: datetime) -> None:
    claim, until = run.claim_event(now)
    events = []
    row = claim_row(run.owner, until)
    if not run.state.started:
        check_json_value(list(args), f"the arguments of run {run.run_id!r}", error=DurableError)
        check_json_value(
            dict(kwargs), f"the keyword arguments of run {run.run_id!r}", error=DurableError
        )
        message = message_json(args, kwargs, _options_of(task.request))
        parent = getattr(task.request, PARENT_HEADER, None)
        started: dict[str, Any] = {"task": task.name, **message}
        if isinstance(parent, str) and parent:
            started["parent"] = parent
        events.append(run.event(RUN_STARTED, **started))
        if "parent" in started:
            message["headers"] = {PARENT_HEADER: parent}
        row.update(task=task.name, message=message)
    events.append(claim)
    if not run.state.started and run.state.cancel_requested:
        # A child cancelled before it started (W12): it ends without running its body.
        events.append(run.event(RUN_CANCELLED))
        row.update(status=CANCELLED, owner=None, lease_until=None)
    version = run.state.version
    with run.journal.transaction() as conn:
        from celery_durable.core.journal import Append
        from celery_durable.store.runs import RunStore

        run.journal.append_in(
            conn, [Append(stream=run.stream, expected_version=version, events=events)]
        )
        RunStore.save_in(conn, run.run_id, now=now, **row)
    for offset, new in enumerate(events, start=1):
        from celery_durable.core.run_aggregate import apply

        apply(run.state, version + offset, new.type, new.data)
    run.lease_until = until


def _options_of(request: Any) -> dict[str, Any]:
    """Routing kept for a re-send: the queue (routing key) and priority of this delivery."""
    info = getattr(request, "delivery_info", None) or {}
    options: dict[str, Any] = {}
    if info.get("routing_key"):
        options["queue"] = info["routing_key"]
    if info.get("priority") is not None:
        options["priority"] = info["priority"]
    return options


def _execute(run: RunContext, args: Any, kwargs: Any, body: Callable[..., Any]) -> Any:
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
            from celery_durable.core.run_aggregate import Mismatch

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
        return None
    finally:
        run.deactivate(token)


def _end(run: RunContext, type_: str, status: str, data: dict[str, Any]) -> None:
    run.lease_until = None
    run.append(
        [run.event(type_, **data)],
        {"status": status, "owner": None, "lease_until": None, "wake_at": None},
    )
    wake_parent(run)


def _park(run: RunContext) -> None:
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


def stored_outcome(state: RunState) -> Outcome | None:
    """The outcome of a run's state, a parked run reported as ``Faulted`` (kind ``parked``)."""
    if state.outcome is not None:
        return state.outcome
    if state.parked is not None:
        return Faulted(
            str(state.parked.get("message", "")), "celery_durable.errors.RunParked", "parked"
        )
    return None


__all__ = [
    "DurableTask",
    "DurableTaskMixin",
    "Finished",
    "deliver",
    "durable_task_base",
    "make_durable_task",
    "stored_outcome",
]
