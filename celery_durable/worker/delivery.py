"""One delivery of a durable task's message, from Celery's call to its acknowledgement (W1).

:func:`deliver` is the task's ``__call__``: it claims the run (:mod:`.claim`), runs its body
(:mod:`.body`) and turns what stops a delivery into what the broker must do: a short wait is a
copy of the message with a countdown, a long one is left to the dispatcher (the run's row says
when), a journal that cannot be used sends the message again with a growing countdown, for as
long as it takes. Nothing of a run is ever acknowledged as done before the journal says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery.exceptions import Ignore, Reject
from celery.exceptions import Retry as CeleryRetry

from celery_durable.config import ConfigError
from celery_durable.errors import JournalError, JournalUnavailable
from celery_durable.message import OWNER_HEADER, decode_args
from celery_durable.secret_lookup import secret_lookup
from celery_durable.worker.body import ended_already, execute
from celery_durable.worker.claim import Later, OwnedElsewhere, claimed, short_sleep_limit
from celery_durable.worker.context import DeliveryKilled, Suspend
from celery_durable.worker.owners import new_owner

if TYPE_CHECKING:
    from celery_durable.runtime import Runtime

__all__ = ["JOURNAL_BACKOFF_MAX", "deliver", "journal_backoff"]

log = logging.getLogger("celery_durable.tasks")

_EAGER_POLL = 0.2

JOURNAL_BACKOFF_MAX = 30.0
"""Longest countdown of a delivery sent again because the journal could not be used."""


def journal_backoff(retries: int) -> float:
    """Countdown before the next delivery after ``retries`` journal failures in a row:
    1, 2, 4, 8, 16, then every 30 s, for as long as it takes (no attempt limit)."""
    return min(2.0 ** min(retries, 5), JOURNAL_BACKOFF_MAX)


class _NotClaimed(Exception):
    """The journal failed before this delivery stored its claim: nothing of the run ran."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


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
    owner = getattr(request, OWNER_HEADER, None) or new_owner()
    while True:
        try:
            return _deliver_once(task, run_id, args, kwargs, body, eager, owner)
        except Suspend as suspend:
            until = suspend.until
        except Later as later:
            until = later.until
        except OwnedElsewhere:
            # W8: the owner's delivery stores the run's result in Celery's backend; a result
            # stored by this one (None) would be final there and hide it.
            if eager:
                return None
            raise Ignore() from None
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
                "run %r: journal unavailable (%s); the message is sent again in %.0f s "
                "(attempt %d)",
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
        # Ignore: the message is acknowledged and no result is stored, so Celery's backend
        # gets the run's value from the delivery that ends it (a stored ``SUCCESS None``
        # would be final there), and no link or chain goes on before the run has ended.
        raise Ignore()


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
        run = claimed(task, run_id, args, kwargs, eager, owner)
    except (JournalError, ConfigError) as exc:
        # ConfigError: a durable_* setting the journal cannot be opened with. The store turns
        # every failure of the database into a JournalError (its cause kept).
        raise _NotClaimed(exc) from exc
    if run is None:
        return None
    if run.state.ended:  # ended before (W1), or cancelled before it started (W12)
        return ended_already(run)
    return execute(run, args, kwargs, body)
