"""The wire format: what a scheduled run's message carries, and how it is sent again.

One module owns every part of a run's Celery message, so that the dispatcher that writes it,
the worker that reads it and the re-sender that repeats it agree by construction:

* the task id is the run ID (S2, S3);
* the headers :data:`SCHEDULE_HEADER`, :data:`DUE_HEADER`, :data:`RUN_ID_HEADER`,
  :data:`BEAT_HEADER` (as stock beat's), :data:`TRACK_END_HEADER` when the schedule's
  overlap policy must hear of the run's end (D7), and :data:`DEADLINE_HEADER` (with Celery's
  ``expires`` for plain tasks) for a start deadline;
  :data:`OWNER_HEADER` on a durable run's own short-sleep re-send; :data:`PARENT_HEADER` on a
  child run's message (W10);
* a plain task gets the arguments stock beat would send; a durable task one tagged JSON object,
  the :class:`ScheduledRun`;
* the Celery options a schedule may carry (:data:`SCHEDULE_OPTIONS`), of which
  :data:`SEND_OPTIONS` go to ``apply_async`` — all but :data:`NOT_FORWARDED` for a schedule
  imported from ``beat_schedule`` (:data:`BEAT_ENTRY`);
* :class:`Resend`, the stored form of a durable run's message (the run table's ``message``
  column and the ``RunStarted`` event), sent again with the same task id (D8, W4).

Everything here is JSON and pure: no Celery import, no I/O except :meth:`Resend.send`, which is
handed the app.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from celery_durable.core.codec import decode_celery_value, time_from_json, time_to_json
from celery_durable.core.ids import format_due
from celery_durable.core.schedule_aggregate import PendingRun
from celery_durable.core.secrets import (
    SECRETS_OPTION,
    Lookup,
    decode_secrets,
    encode_secrets,
    has_secrets,
    resolve_secrets,
    resolve_value,
)
from celery_durable.errors import SecretUnavailable

SCHEDULE_HEADER = "durable_schedule"
"""The schedule ID of a scheduled run's message."""
DUE_HEADER = "durable_due"
"""The run's due time, in the run ID's UTC form (:func:`~celery_durable.core.ids.format_due`)."""
RUN_ID_HEADER = "durable_run_id"
"""The run ID (also the message's task id)."""
TRACK_END_HEADER = "durable_track_end"
"""Present (``True``) when the worker must record the run's end for the overlap policy (D7)."""
DEADLINE_HEADER = "durable_deadline"
"""A run's start deadline (P1), in the run ID's UTC form: a worker receiving the run later
records it as missed; a durable run that has not started by then never starts."""
OWNER_HEADER = "durable_owner"
"""Message header naming the claim a re-sent delivery takes over (its own, from before)."""
PARENT_HEADER = "durable_parent"
"""Message header of a child run (W10): its parent's run ID, stored in its ``RunStarted``."""
FIRST_SEND_HEADER = "durable_first_send"
"""Present (``True``) on a child run's message as its parent sent it, and on a re-send of a
child nobody has claimed yet (W10): its stream is most likely empty, so the worker claims it
without reading the stream first (a stream that is not empty makes the claim conflict, and
the worker then reads it as for any other delivery)."""
SHOWN_ARGS_HEADER = "durable_shown_args"
"""A plain run whose arguments hold secret values (P5): ``{"argsrepr": …, "kwargsrepr": …}``,
the arguments as Celery may show them (the references). Celery keeps custom headers on a
retry but recomputes ``argsrepr``/``kwargsrepr`` from the values; the worker puts these back
(:mod:`celery_durable.worker.secret_masking`), and hides a debug line that would print the
raw message."""
SHOWN_ARGS_RECEIVER = "celery_durable.secret_masking"
"""The ``dispatch_uid`` of the ``before_task_publish`` receiver that restores them."""

STR_OPTIONS = ("queue", "routing_key", "exchange")
"""Schedule options that are routing names."""
NUMBER_OPTIONS = ("expires", "time_limit", "soft_time_limit")
"""Schedule options that are positive numbers of seconds."""
SCHEDULE_OPTIONS = frozenset(
    ("args", "kwargs", "priority", "headers", *STR_OPTIONS, *NUMBER_OPTIONS)
)
"""Celery options a schedule may carry to each run's message."""
SEND_OPTIONS = (
    "queue",
    "routing_key",
    "exchange",
    "priority",
    "expires",
    "time_limit",
    "soft_time_limit",
)
"""The schedule options passed to ``apply_async`` as they are (in this order)."""

BEAT_HEADER = "celery_beat_task"
"""Set (``True``) on every scheduled run's message, as stock beat marks what it sends (B5)."""

BEAT_ENTRY = "beat_entry"
"""Option marking a schedule imported from ``beat_schedule``; its value is the entry's name.

Such a schedule passes on every option of its entry (B5) and may name a task known only to
the workers, sent by name (B4).
"""
IMPORTED = "imported_from"
"""Option marking a schedule brought over by an importer (I1, I2); its value is
``{"source": "django-celery-beat" | "redbeat", "name": <the row's or entry's name>}``.

Like :data:`BEAT_ENTRY`, such a schedule passes on every option its source scheduler sent,
with typed values (B5), and may name a task known only to the workers (B4).
"""
MARKERS = (BEAT_ENTRY, IMPORTED)
"""Options that say where a schedule came from; stored, never sent."""
NOT_FORWARDED = frozenset(("args", "kwargs", "headers", "retry", SECRETS_OPTION, *MARKERS))
"""Options of a ``beat_schedule`` entry the dispatcher sets itself rather than passing on.

``retry``: a failed send is retried by the dispatcher (D3), never inside the send.
``$secrets``: marks values stored with secret references (P5).
"""

SCHEDULED_RUN_TAG = "celery_durable.ScheduledRun"
"""Key marking the JSON form of a :class:`ScheduledRun` in a message's arguments."""


class ScheduledRun:
    """What a schedule hands to a durable task: its ID, the due time (aware UTC), the input.

    An input holding :class:`~celery_durable.core.secrets.Secret` references (P5) keeps them:
    ``repr``, equality and the JSON form show the references, and each read of :attr:`input`
    returns the input with their values, read then (in the worker, with the lookup the worker
    hands in; without one, from the environment only).
    """

    __slots__ = ("_lookup", "_marked", "_value", "due", "schedule")

    schedule: str
    due: datetime
    _value: Any
    _marked: bool
    _lookup: Lookup | None

    def __init__(
        self, schedule: str, due: datetime, input: Any = None, *, lookup: Lookup | None = None
    ) -> None:
        self._fill(schedule, due, input, has_secrets(input), lookup)

    def _fill(
        self, schedule: str, due: datetime, value: Any, marked: bool, lookup: Lookup | None
    ) -> None:
        object.__setattr__(self, "schedule", schedule)
        object.__setattr__(self, "due", due)
        object.__setattr__(self, "_value", value)
        object.__setattr__(self, "_marked", marked)
        object.__setattr__(self, "_lookup", lookup)

    @classmethod
    def _stored(
        cls, schedule: str, due: datetime, value: Any, marked: bool, lookup: Lookup | None = None
    ) -> ScheduledRun:
        """A run whose input is known to hold secrets (``marked``) or not: no walk over it."""
        run = cls.__new__(cls)
        run._fill(schedule, due, value, marked, lookup)
        return run

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("ScheduledRun is immutable")

    @property
    def input(self) -> Any:
        """The schedule's input, with the values of its secrets (``SecretUnavailable``
        naming a reference that cannot be read)."""
        if not self._marked:
            return self._value
        return resolve_value(self._value, self._lookup or _environment)

    def __repr__(self) -> str:
        return f"ScheduledRun(schedule={self.schedule!r}, due={self.due!r}, input={self._value!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ScheduledRun):
            return NotImplemented
        return (self.schedule, self.due, self._value) == (other.schedule, other.due, other._value)

    __hash__ = None  # type: ignore[assignment]  # the input may be a dict, as before

    def __reduce__(self) -> tuple[Any, ...]:
        return (ScheduledRun, (self.schedule, self.due, self._value))

    def to_json(self) -> dict[str, Any]:
        """The JSON form; with secrets, their references and the ``secrets`` mark (P5)."""
        data = {"schedule": self.schedule, "due": time_to_json(self.due), "input": self._value}
        if self._marked:
            data["input"], _ = encode_secrets(self._value)
            data["secrets"] = 1
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], lookup: Lookup | None = None) -> ScheduledRun:
        """The run :meth:`to_json` wrote; references are read only under the ``secrets``
        mark, so an input sent without it is taken as it is."""
        value, marked = data.get("input"), bool(data.get("secrets"))
        if marked:
            value = decode_secrets(value)
        return cls._stored(data["schedule"], time_from_json(data["due"]), value, marked, lookup)


def _environment(scheme: str, name: str) -> Any:
    """The lookup of a run built without one: environment variables only."""
    if scheme != "env":
        raise KeyError(name)
    return os.environ[name]


def scheduled_message(run: ScheduledRun) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    """``(args, kwargs, headers)`` of the message that starts a durable task for a schedule.

    The ``ScheduledRun`` travels as one tagged JSON object in ``args``, so any Celery
    serializer (json, msgpack, yaml, pickle) carries it; the receiving task turns it back into
    a ``ScheduledRun`` before calling the body.
    """
    return [{SCHEDULED_RUN_TAG: 1, **run.to_json()}], {}, {}


def decode_args(args: tuple[Any, ...] | list[Any], lookup: Lookup | None = None) -> tuple[Any, ...]:
    """The body's arguments: a tagged ``ScheduledRun`` object becomes a ``ScheduledRun``
    (``lookup`` reads its secrets, P5)."""
    return tuple(
        ScheduledRun.from_json(arg, lookup)
        if isinstance(arg, dict) and SCHEDULED_RUN_TAG in arg
        else arg
        for arg in args
    )


def unreadable_secret(
    args: tuple[Any, ...] | list[Any], lookup: Lookup
) -> SecretUnavailable | None:
    """The first secret reference of a durable task's ``ScheduledRun`` that ``lookup`` cannot
    read (the values read are dropped at once), else ``None`` (P5: checked before the body)."""
    for arg in args:
        if isinstance(arg, dict) and SCHEDULED_RUN_TAG in arg and arg.get("secrets"):
            try:
                resolve_secrets(arg.get("input"), lookup)
            except SecretUnavailable as exc:
                return exc
    return None


@dataclass(frozen=True, slots=True)
class Message:
    """What is sent for one run: positional and keyword arguments, options, headers."""

    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    headers: dict[str, Any]


def stored_values(options: Mapping[str, Any]) -> dict[str, Any]:
    """A ``beat_schedule`` schedule's options with their values as Celery would send them.

    The import stores args, kwargs and option values in the typed JSON encoding of B5
    (datetimes, decimals, UUIDs … keep their type); this reads them back.
    """
    return {
        k: v if k in MARKERS else decode_celery_value(v, f"option {k!r}")
        for k, v in options.items()
    }


def passes_through(options: Mapping[str, Any]) -> bool:
    """Whether a schedule's options are sent as its source scheduler sent them (B4, B5):
    imported from ``beat_schedule`` or by an importer (I1, I2)."""
    return BEAT_ENTRY in options or IMPORTED in options  # MARKERS, without a generator


BEAT_ORIGIN = "beat_schedule"
"""The origin of a schedule imported from ``beat_schedule`` (:func:`origin_of`)."""
CELERY_DEFAULT_ENTRY = "celery.backend_cleanup"
"""The entry (and task) Celery's beat installs itself when results expire (B7)."""


def origin_of(options: Mapping[str, Any]) -> str | None:
    """Where a schedule came from, by its marker option: ``"beat_schedule"``, the importer's
    source (``"django-celery-beat"``, ``"redbeat"``), or ``None`` (created at run time).

    Stored in the schedule index's ``origin`` column, so that beat's start-up finds the
    schedules it imported without reading every schedule (D13).
    """
    if BEAT_ENTRY in options:
        return BEAT_ORIGIN
    marker = options.get(IMPORTED)
    if isinstance(marker, Mapping) and isinstance(marker.get("source"), str):
        return str(marker["source"])[:64]
    return None


def origin_label(task: str, options: Mapping[str, Any]) -> str:
    """Where a schedule came from, in a word or two (``schedules list``, the admin's list):
    ``Celery (result_expires)`` for the entry Celery's beat installs itself (B7),
    ``beat_schedule``, an importer's source, or ``API``."""
    entry = options.get(BEAT_ENTRY)
    if entry is not None:
        if entry == CELERY_DEFAULT_ENTRY and task == CELERY_DEFAULT_ENTRY:
            return "Celery (result_expires)"
        return BEAT_ORIGIN
    return origin_of(options) or "API"


def describe_origin(task: str, options: Mapping[str, Any]) -> str:
    """Where a schedule came from, in a sentence (``schedules show``, the admin's page, beat's
    start-up log), so that a schedule nobody created by hand explains itself (B7)."""
    entry = options.get(BEAT_ENTRY)
    if entry is not None:
        if entry == CELERY_DEFAULT_ENTRY and task == CELERY_DEFAULT_ENTRY:
            return (
                "installed by Celery because result_expires is set and the result backend "
                "does not expire results itself (as stock beat does, B7)"
            )
        return f"beat_schedule entry {entry!r}"
    marker = options.get(IMPORTED)
    source = origin_of(options)
    if source is not None and isinstance(marker, Mapping):
        name = marker.get("name")
        return f"imported from {source}" + (f" (row {name!r})" if name else "")
    return "created through the API (or the CLI, the admin)"


def run_message(
    sid: str,
    pending: PendingRun,
    *,
    durable: bool,
    now: datetime | None = None,
    secrets: Lookup | None = None,
) -> Message:
    """The message of a run: as stock beat sends it for plain tasks, a ScheduledRun else.

    A run with a start deadline (P1) expires at it, or earlier when its own ``expires``
    (seconds after ``now``, the moment of sending) says so. Secret inputs (P5): a durable
    task's ScheduledRun carries the references (the worker reads them); a plain task's
    arguments get the values read by ``secrets`` now (``SecretUnavailable`` naming the
    reference), or keep the references when no lookup is given (checks that send nothing).
    """
    options = dict(pending.options)
    passed = passes_through(options)
    if passed:  # B5: every option of the entry, as stock beat passes them
        options = stored_values(options)
    headers = dict(options.get("headers") or {})
    headers[SCHEDULE_HEADER] = sid
    headers[DUE_HEADER] = format_due(pending.due)
    headers[RUN_ID_HEADER] = pending.run_id
    headers[BEAT_HEADER] = True
    if pending.track_end:
        headers[TRACK_END_HEADER] = True
    if passed:
        send_options = {k: v for k, v in options.items() if k not in NOT_FORWARDED}
    else:
        send_options = {k: options[k] for k in SEND_OPTIONS if options.get(k) is not None}
    if pending.deadline is not None:
        headers[DEADLINE_HEADER] = format_due(pending.deadline)
        if not durable:
            # Celery's own ``expires`` header: the worker discards a late message and the
            # revoke is recorded as missed (a broker TTL would drop it unrecorded). A durable
            # run checks the deadline itself: once started it must run on, also when
            # redelivered or woken after the deadline.
            user = send_options.pop("expires", None)
            headers["expires"] = expiry(pending.deadline, user, now)
    marked = SECRETS_OPTION in options
    if durable:
        value = decode_secrets(pending.input) if marked else pending.input
        run = ScheduledRun._stored(sid, pending.due, value, marked)
        args, kwargs, extra = scheduled_message(run)
        headers.update(extra)
        return Message(list(args), dict(kwargs), send_options, headers)
    if "args" in options or "kwargs" in options:
        args = list(options.get("args") or [])
    else:
        args = [] if pending.input is None else [pending.input]
    kwargs = dict(options.get("kwargs") or {})
    if marked and secrets is not None:  # P5: read when the message is built
        # Celery shows argsrepr/kwargsrepr (worker logs, events, Flower) instead of the
        # arguments: those show the references.
        shown = {"argsrepr": repr(decode_secrets(args)), "kwargsrepr": repr(decode_secrets(kwargs))}
        send_options.update(shown)
        headers[SHOWN_ARGS_HEADER] = shown  # kept by Celery on a retry
        args, kwargs = resolve_secrets(args, secrets), resolve_secrets(kwargs, secrets)
    return Message(args, kwargs, send_options, headers)


def expiry(deadline: datetime, expires: float | datetime | None, now: datetime | None) -> str:
    """The message expiry of a run with a start deadline: the earlier of the deadline and a
    user-given ``expires`` (seconds after ``now``, or an instant as a beat entry may give it,
    B5), as ISO text (JSON-safe for re-sends)."""
    if isinstance(expires, datetime):
        if expires.tzinfo is None:  # Celery reads a naive expires in UTC
            expires = expires.replace(tzinfo=timezone.utc)
        deadline = min(deadline, expires)
    elif expires is not None and now is not None:
        deadline = min(deadline, now + timedelta(seconds=expires))
    return deadline.isoformat()


def message_json(
    args: Any, kwargs: Any, options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The stored form of a run's message (the ``message`` column and ``RunStarted``)."""
    return {
        "args": list(args or ()),
        "kwargs": dict(kwargs or {}),
        "options": dict(options or {}),
    }


def sent_parent(message: Mapping[str, Any] | str | None) -> str | None:
    """The parent named in the message a child run was sent with (W10): the run table's
    ``message`` column (JSON text or its value). Until a worker takes that message the
    child's stream is empty, and this is what says who started it (W13)."""
    if not message:
        return None
    value = json.loads(message) if isinstance(message, str) else message
    parent = (value.get("headers") or {}).get(PARENT_HEADER)
    return parent if isinstance(parent, str) and parent else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Resend:
    """What is needed to send a run's message again, with the same task id (S3)."""

    run_id: str
    task: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    """Celery ``apply_async`` options kept from the first delivery (``queue``, ``priority``)."""
    headers: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, run_id: str, task: str, message: Mapping[str, Any]) -> Resend:
        """The re-send of a stored message (:meth:`to_json`, or a ``RunStarted`` event's)."""
        return cls(
            run_id=run_id,
            task=task,
            args=list(message.get("args") or ()),
            kwargs=dict(message.get("kwargs") or {}),
            options=dict(message.get("options") or {}),
            headers=dict(message.get("headers") or {}),
        )

    def to_json(self) -> dict[str, Any]:
        """The stored form, with the headers (the run table's ``message`` column)."""
        return {**message_json(self.args, self.kwargs, self.options), "headers": dict(self.headers)}

    def send(self, app: Any, **overrides: Any) -> Any:
        """``app.send_task`` with the run ID as task id; returns Celery's ``AsyncResult``."""
        options = {**self.options, **overrides}
        if self.headers:
            options.setdefault("headers", dict(self.headers))
        return app.send_task(
            self.task,
            args=list(self.args),
            kwargs=dict(self.kwargs),
            task_id=self.run_id,
            **options,
        )
