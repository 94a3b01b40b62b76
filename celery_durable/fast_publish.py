"""The publish fast path (D12): a plain task's message from a template Celery built itself.

``Task.apply_async`` spends most of its time on work that is the same for every run of a
schedule: merging the task's options, routing, reading settings, declaring the queue again,
building the header table. The fast path lets Celery's own ``apply_async`` send the first run
of each *shape* (task, send options, header names), records what it handed to
``Producer.publish``, and builds every later message of that shape from the record, changing
only what differs from run to run: the task id (``id``, ``root_id``, ``correlation_id``), the
arguments and their ``argsrepr``/``kwargsrepr``, and the headers the dispatcher sets
(:func:`celery_durable.message.run_message`). The message is therefore Celery's by
construction; ``tests/dispatch/test_fast_publish.py`` compares the two field by field on Redis
and on RabbitMQ.

Anything whose message could depend on more than the shape keeps the full path: a durable
task, a task class that overrides ``apply_async``, ``shadow_name`` or Pydantic argument
dumping, an option outside :data:`FAST_OPTIONS` (``expires`` and ``eta``/``countdown`` are
computed from the clock at each call), a router that is a function (it may look at the
arguments), a connected ``before_task_publish``/``after_task_publish``/``task_sent``
receiver, sent events, eager mode, task protocol 1, or an ``amqp.send_task_message`` that is
not Celery's own (a test harness that counts or holds sends).

:func:`send_resends` does the same for the messages a worker sends by task name through
``app.send_task`` (a parent's children, W11, measured 2026-12-06): the first of each shape in
one call goes through ``send_task``, the others are built from what it published, with the
``root_id`` and ``parent_id`` Celery took from the task the worker is running.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from celery import signals
from celery.app.routes import MapRoute
from celery.app.task import Task
from celery.utils.saferepr import saferepr

from celery_durable.message import SHOWN_ARGS_HEADER, SHOWN_ARGS_RECEIVER, Message, Resend

FAST_OPTIONS = frozenset(
    (
        "queue",
        "routing_key",
        "exchange",
        "exchange_type",
        "priority",
        "time_limit",
        "soft_time_limit",
        "serializer",
        "compression",
        "delivery_mode",
        "ignore_result",
    )
)
"""Send options whose effect on the message does not depend on the moment of sending."""

PER_RUN_HEADERS = ("id", "root_id", "argsrepr", "kwargsrepr")
"""Celery's headers that change from run to run of one shape (besides the dispatcher's own);
``root_id`` only when it is the run's own ID (a message sent from outside a task)."""

_CELERY_SENDER = "AMQP._create_task_sender.<locals>.send_task_message"
"""The qualified name of Celery's own ``app.amqp.send_task_message``."""

_TEMPLATE_LIMIT = 4096
"""Shapes remembered at most; past it the cache starts again (every key is small)."""


@dataclass(frozen=True, slots=True)
class Template:
    """What Celery handed to ``Producer.publish`` for one run of a shape, minus that run."""

    headers: dict[str, Any]
    """Celery's headers without the dispatcher's own (those are set per run)."""
    embed: dict[str, Any]
    publish: dict[str, Any]
    """The other ``Producer.publish`` keywords (exchange, routing key, properties …)."""
    declare: Any
    check: Any
    """The task's argument check (``Task.__header__``) when typing is on, else ``None``."""
    ignore_result: bool
    repr_size: tuple[int, int, int]
    """``argsrepr`` and ``kwargsrepr`` maximum sizes and ``task_repr_maxlevels``."""
    own_root: bool
    """Whether ``root_id`` is the run's own ID (else the recorded one, a worker's task's)."""


class FastPath:
    """Sends plain tasks' messages from templates; see the module's docstring (D12)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._templates: dict[tuple[Any, ...], Template] = {}
        self._declared: set[int] = set()
        self._on_task_call: Any = None

    def usable(self) -> bool:
        """Whether the app's configuration allows the fast path at all (checked per round)."""
        return usable(self.app)

    def start_round(self) -> None:
        """Declare each template's queue again once in the next round (a new connection)."""
        self._declared.clear()
        self._on_task_call = self.app.backend.on_task_call

    def send(self, task: Any, run_id: str, message: Message, producer: Any) -> None:
        """Publish one plain run's message; the first of its shape through ``apply_async``."""
        if not fits(task, message.options):
            send_full(task, run_id, message, producer)
            return
        options = message.options
        key = (
            task.name,
            tuple(sorted((k, repr(v)) for k, v in options.items())) if options else (),
            frozenset(message.headers),
            threading.get_ident(),
        )
        template = self._templates.get(key)
        if template is None:
            template = self._record(task, run_id, message, producer)
            if len(self._templates) >= _TEMPLATE_LIMIT:
                self._templates.clear()
            self._templates[key] = template
            self._declared.add(id(template))
            return
        args = message.args or ()
        kwargs = message.kwargs or {}
        if template.check is not None:
            template.check(*args, **kwargs)
        declare = None
        if id(template) not in self._declared:
            self._declared.add(id(template))
            declare = template.declare
        publish(template, run_id, args, kwargs, message.headers, producer, declare,
                self._on_task_call or self.app.backend.on_task_call)  # fmt: skip

    def _record(self, task: Any, run_id: str, message: Message, producer: Any) -> Template:
        """Send through ``apply_async`` and keep what it gave ``Producer.publish``."""
        template = record(
            self.app, producer, lambda: send_full(task, run_id, message, producer), run_id,
            message.headers,
            check=getattr(task, "__header__", None) if task.typing else None,
            ignore_result=bool(message.options.get("ignore_result", task.ignore_result)),
        )  # fmt: skip
        if template is None:
            raise RuntimeError("apply_async did not publish exactly one message")
        return template


def usable(app: Any) -> bool:
    """Whether the app's configuration allows a template path at all: Celery's own sender,
    protocol 2, no eager mode, no sent events, no publish signal receivers but the library's
    own, only map routers."""
    conf = app.conf
    if conf.task_always_eager or conf.task_send_sent_event or conf.task_protocol != 2:
        return False
    if (
        _others(signals.before_task_publish.receivers)
        or signals.after_task_publish.receivers
        or signals.task_sent.receivers
    ):
        return False
    if getattr(app.amqp.send_task_message, "__qualname__", None) != _CELERY_SENDER:
        return False  # something counts or holds every send (a harness): it must see them all
    return all(isinstance(route, MapRoute) for route in app.amqp.router.routes)


def record(
    app: Any,
    producer: Any,
    send: Callable[[], Any],
    run_id: str,
    own_headers: Collection[str],
    *,
    check: Any,
    ignore_result: bool,
) -> Template | None:
    """Call ``send`` (Celery's full path for ``run_id`` on ``producer``) and keep what it gave
    ``Producer.publish``, less ``run_id``'s own fields and the caller's ``own_headers``;
    ``None`` when it did not publish exactly one message there."""
    seen: list[tuple[Any, dict[str, Any]]] = []
    real = producer.publish

    def recording(body: Any, **kwargs: Any) -> Any:
        seen.append((body, {**kwargs, "headers": dict(kwargs.get("headers") or {})}))
        return real(body, **kwargs)

    producer.publish = recording
    try:
        send()
    finally:
        del producer.publish
    if len(seen) != 1:
        return None
    body, kwargs = seen[0]
    headers = {k: v for k, v in kwargs.pop("headers").items() if k not in own_headers}
    own_root = headers.get("root_id") == run_id
    for name in PER_RUN_HEADERS:
        if name != "root_id" or own_root:
            headers.pop(name, None)
    declare = kwargs.pop("declare", None)
    kwargs.pop("correlation_id", None)
    conf = app.conf
    amqp = app.amqp
    return Template(
        headers=headers,
        embed=body[2],
        publish=kwargs,
        declare=declare,
        check=check,
        ignore_result=ignore_result,
        repr_size=(amqp.argsrepr_maxsize, amqp.kwargsrepr_maxsize, conf.task_repr_maxlevels),
        own_root=own_root,
    )


def publish(
    template: Template,
    run_id: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    own_headers: Mapping[str, Any],
    producer: Any,
    declare: Any,
    on_task_call: Callable[[Any, str], Any],
) -> None:
    """Publish ``run_id``'s message from ``template``: its ID, arguments and shown forms, and
    the caller's ``own_headers``; ``declare`` the template's queue when given."""
    size, kwsize, levels = template.repr_size
    headers = dict(template.headers)
    headers["id"] = run_id
    if template.own_root:
        headers["root_id"] = run_id
    headers["argsrepr"] = shown(args, size, levels)
    headers["kwargsrepr"] = shown(kwargs, kwsize, levels)
    headers.update(own_headers)
    with producer.connection._reraise_as_library_errors():
        if not template.ignore_result:  # the backend as of the template's round
            on_task_call(producer, run_id)
        producer.publish(
            (args, kwargs, template.embed),
            headers=headers,
            declare=declare,
            correlation_id=run_id,
            **template.publish,
        )


def send_resends(app: Any, producer: Any, resends: Sequence[Resend], **overrides: Any) -> None:
    """:meth:`Resend.send` of each of ``resends`` on ``producer`` with ``overrides``: the
    first of each shape (task, options, header names) through ``app.send_task``, the others
    from its template (a worker's sends by name: a parent's children, W11). Celery's
    ``add_to_parent`` is kept: each message's result joins the running task's trail."""
    fast = usable(app)
    templates: dict[tuple[Any, ...], Template | None] = {}
    parent = app.current_worker_task if fast else None
    for resend in resends:
        key = _resend_shape(app, resend, overrides) if fast else None
        if key is None:
            resend.send(app, producer=producer, **overrides)
            continue
        if key not in templates:
            options = {**resend.options, **overrides}
            templates[key] = record(
                app, producer, partial(resend.send, app, producer=producer, **overrides),
                resend.run_id, resend.headers,
                check=None, ignore_result=bool(options.get("ignore_result")),
            )  # fmt: skip
            continue
        template = templates[key]
        if template is None:  # (its first did not publish once: the full path for all)
            resend.send(app, producer=producer, **overrides)
            continue
        publish(template, resend.run_id, list(resend.args), dict(resend.kwargs), resend.headers,
                producer, None, app.backend.on_task_call)  # fmt: skip
        if parent is not None:
            result = app.AsyncResult(resend.run_id)
            result.ignored = template.ignore_result
            parent.add_trail(result)


def _resend_shape(app: Any, resend: Resend, overrides: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The template key of a resend, or ``None`` when it keeps the full path: an option
    outside :data:`FAST_OPTIONS`, a secret's shown arguments, or a registered task whose own
    ``expires`` Celery turns into a time at each send."""
    options = {**resend.options, **overrides}
    if not options.keys() <= FAST_OPTIONS or SHOWN_ARGS_HEADER in resend.headers:
        return None
    task = app._tasks.get(resend.task)
    if task is not None and getattr(task, "expires", None) is not None:
        return None
    return (
        resend.task,
        tuple(sorted((k, repr(v)) for k, v in options.items())),
        frozenset(resend.headers),
    )


_REPR_AS_IS = frozenset((int, float, bool, type(None)))
"""Exact types whose ``saferepr`` token is their ``repr`` (numbers by ``str``, ``None`` by
``repr``: the same text); strings are not among them (``saferepr`` quotes them its own way)."""


def shown(value: Any, size: int | None, levels: int) -> str:
    """``saferepr(value, size, maxlevels=levels)`` (Celery's ``argsrepr``/``kwargsrepr``)
    without its token stream in the common cases: a flat list or tuple of numbers, booleans
    and ``None`` (a schedule's ``[input]``), or an empty dict, whose ``repr`` fits in
    ``size``, reads as its ``repr``, which is what ``saferepr`` writes for it. Anything else
    goes to ``saferepr``."""
    kind = type(value)
    if ((kind is list or kind is tuple) and all(type(item) in _REPR_AS_IS for item in value)) or (
        kind is dict and not value
    ):
        text = repr(value)
        if size is None or len(text) < size:
            return text
    return saferepr(value, size, maxlevels=levels)


def _others(receivers: Any) -> bool:
    """Receivers other than the library's own secret masking (it changes only messages with
    secret arguments, which never take the fast path: their ``argsrepr`` option)."""
    return any(key[0] != SHOWN_ARGS_RECEIVER for key, _ in receivers)


def fits(task: Any, options: Mapping[str, Any]) -> bool:
    """Whether a plain task's run may take the fast path (the class and the options)."""
    cls = type(task)
    return (
        cls.apply_async is Task.apply_async
        and cls.shadow_name is Task.shadow_name
        and getattr(task, "_dump_pydantic_arguments", None) is None
        and not getattr(task, "__durable__", False)
        and options.keys() <= FAST_OPTIONS
    )


def send_full(task: Any, run_id: str, message: Message, producer: Any) -> None:
    """Celery's own ``apply_async``: the full path."""
    task.apply_async(
        message.args,
        message.kwargs,
        task_id=run_id,
        producer=producer,
        headers=message.headers,
        retry=False,
        **message.options,
    )
