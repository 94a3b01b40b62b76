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
receiver, sent events, eager mode, or task protocol 1.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery import signals
from celery.app.routes import MapRoute
from celery.app.task import Task
from celery.utils.saferepr import saferepr

from celery_durable.message import SHOWN_ARGS_RECEIVER, Message

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
"""Celery's headers that change from run to run of one shape (besides the dispatcher's own)."""

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


class FastPath:
    """Sends plain tasks' messages from templates; see the module's docstring (D12)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._templates: dict[tuple[Any, ...], Template] = {}
        self._declared: set[int] = set()
        self._on_task_call: Any = None

    def usable(self) -> bool:
        """Whether the app's configuration allows the fast path at all (checked per round)."""
        conf = self.app.conf
        if conf.task_always_eager or conf.task_send_sent_event or conf.task_protocol != 2:
            return False
        if (
            _others(signals.before_task_publish.receivers)
            or signals.after_task_publish.receivers
            or signals.task_sent.receivers
        ):
            return False
        return all(isinstance(route, MapRoute) for route in self.app.amqp.router.routes)

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
        size, kwsize, levels = template.repr_size
        headers = dict(template.headers)
        headers["id"] = headers["root_id"] = run_id
        headers["argsrepr"] = shown(args, size, levels)
        headers["kwargsrepr"] = shown(kwargs, kwsize, levels)
        headers.update(message.headers)
        declare = None
        if id(template) not in self._declared:
            self._declared.add(id(template))
            declare = template.declare
        with producer.connection._reraise_as_library_errors():
            if not template.ignore_result:  # the backend as of the round's start
                (self._on_task_call or self.app.backend.on_task_call)(producer, run_id)
            producer.publish(
                (args, kwargs, template.embed),
                headers=headers,
                declare=declare,
                correlation_id=run_id,
                **template.publish,
            )

    def _record(self, task: Any, run_id: str, message: Message, producer: Any) -> Template:
        """Send through ``apply_async`` and keep what it gave ``Producer.publish``."""
        seen: list[tuple[Any, dict[str, Any]]] = []
        real = producer.publish

        def recording(body: Any, **kwargs: Any) -> Any:
            seen.append((body, {**kwargs, "headers": dict(kwargs.get("headers") or {})}))
            return real(body, **kwargs)

        producer.publish = recording
        try:
            send_full(task, run_id, message, producer)
        finally:
            del producer.publish
        if len(seen) != 1:
            raise RuntimeError(f"apply_async published {len(seen)} messages, not one")
        body, kwargs = seen[0]
        headers = {k: v for k, v in kwargs.pop("headers").items() if k not in message.headers}
        for name in PER_RUN_HEADERS:
            headers.pop(name, None)
        declare = kwargs.pop("declare", None)
        kwargs.pop("correlation_id", None)
        conf = self.app.conf
        amqp = self.app.amqp
        return Template(
            headers=headers,
            embed=body[2],
            publish=kwargs,
            declare=declare,
            check=getattr(task, "__header__", None) if task.typing else None,
            ignore_result=bool(message.options.get("ignore_result", task.ignore_result)),
            repr_size=(amqp.argsrepr_maxsize, amqp.kwargsrepr_maxsize, conf.task_repr_maxlevels),
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
