"""What Celery shows of a plain task's arguments never holds a secret value (P5).

Beat reads a plain task's secrets when it builds the message, and sets the message's
``argsrepr``/``kwargsrepr`` (what the worker logs, Celery's events, Flower and ``celery
inspect`` show) to the arguments with their references, plus the header
:data:`~celery_durable.message.SHOWN_ARGS_HEADER` holding the same. Two places in Celery
would still show the values, and :func:`install` closes both in every process that makes a
:class:`~celery_durable.Durable`:

* ``Task.retry`` publishes the message again with ``argsrepr``/``kwargsrepr`` recomputed from
  the values; it keeps custom headers, so a ``before_task_publish`` receiver puts the shown
  forms back from the header.
* At ``DEBUG`` the pool logs ``TaskPool: Apply … (args: …)`` with the raw message (its body
  holds the values), cut to 1,024 characters; a filter on the ``celery.pool`` logger hides
  the arguments of a message that carries the header.
* ``celery inspect active``, ``reserved``, ``scheduled`` and ``query_task`` answer with
  ``Request.info()``, which gives the arguments themselves, not ``argsrepr``; in a worker,
  ``Request.info`` is wrapped to give the shown forms for a request that carries the header
  (every other request is answered as before).

What stays out of reach: the message body itself (the worker needs the values), a result
backend with ``result_extended = True`` (it stores the arguments), and, with
``task_send_sent_event = True``, the ``task-sent`` event of a retry, which Celery builds from
the values before any receiver runs.

The publish fast path (D12) never sees such a message (its ``argsrepr`` option keeps it on the
full path), so this receiver does not turn the fast path off (``fast_publish.usable``).
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

from celery import signals

from celery_durable.message import SHOWN_ARGS_HEADER, SHOWN_ARGS_RECEIVER

HIDDEN = "(hidden: the message carries secret values, P5)"
"""What the pool's debug line shows in place of the arguments of such a message."""

_LOCK = threading.Lock()
_installed = False


def restore_shown_args(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """``before_task_publish``: a message with the header shows its references again."""
    shown = None if headers is None else headers.get(SHOWN_ARGS_HEADER)
    if headers is None or not isinstance(shown, dict):
        return
    for key in ("argsrepr", "kwargsrepr"):
        if isinstance(shown.get(key), str):
            headers[key] = shown[key]


class HideSecretArguments(logging.Filter):
    """Hides the arguments in a log record whose text would print a message with secrets."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(
            isinstance(a, str) and SHOWN_ARGS_HEADER in a for a in args
        ):
            record.args = tuple(HIDDEN if isinstance(a, str) else a for a in args)
        return True


def shown_info(info: Any) -> Any:
    """``Request.info`` giving the shown forms for a request that carries the header."""

    def wrapped(self: Any, safe: bool = False) -> Any:
        data = info(self, safe)
        shown = (getattr(self, "request_dict", None) or {}).get(SHOWN_ARGS_HEADER)
        if isinstance(shown, dict) and isinstance(data, dict):
            data["args"], data["kwargs"] = shown.get("argsrepr"), shown.get("kwargsrepr")
        return data

    wrapped.celery_durable = True  # type: ignore[attr-defined]
    wrapped.__doc__ = info.__doc__
    return wrapped


def wrap_request_info(**_: Any) -> None:
    """Wrap ``celery.worker.request.Request.info`` once (in a worker: ``worker_init``)."""
    from celery.worker.request import Request

    with _LOCK:
        if not getattr(Request.info, "celery_durable", False):
            Request.info = shown_info(Request.info)


def install() -> None:
    """Connect the receivers and add the log filter, once per process."""
    global _installed
    with _LOCK:
        if _installed:
            return
        signals.before_task_publish.connect(
            restore_shown_args, weak=False, dispatch_uid=SHOWN_ARGS_RECEIVER
        )
        logging.getLogger("celery.pool").addFilter(HideSecretArguments())
        # Only a worker answers ``celery inspect``; elsewhere Celery's worker modules stay
        # unimported (they cost beat and the CLI 30 ms).
        signals.worker_init.connect(
            wrap_request_info, weak=False, dispatch_uid="celery_durable.request_info"
        )
        _installed = True
    if "celery.worker.request" in sys.modules:
        wrap_request_info()


__all__ = [
    "HIDDEN",
    "HideSecretArguments",
    "install",
    "restore_shown_args",
    "shown_info",
    "wrap_request_info",
]
