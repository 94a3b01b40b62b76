"""Configuration read once from ``app.conf`` (``durable_*`` keys) into a frozen object."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from celery_durable.core.blackouts import Blackout, check_windows
from celery_durable.core.codec import DEFAULT_MAX_INPUT_BYTES
from celery_durable.core.limits import MAX_PERIOD_SECONDS
from celery_durable.errors import DurableError, InvalidSchedule

DEFAULT_URL = "sqlite:///celery_durable.db"

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


class ConfigError(DurableError, ValueError):
    """A ``durable_*`` setting has a value the library cannot use."""


@dataclass(frozen=True, slots=True, kw_only=True, repr=False)
class DurableConfig:
    """The settings of one :class:`~celery_durable.Durable`, with their defaults.

    Its ``repr``/``str`` shows the journal URL with the password masked, like every other
    place the library prints the URL.
    """

    url: str = DEFAULT_URL
    check_interval: float = 60.0
    """``durable_check_interval``: the dispatcher wakes at least this often (seconds, D3)."""
    run_lease: float = 300.0
    """``durable_run_lease``: a started durable run silent this long is sent again (D8)."""
    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES
    """``durable_max_input_bytes``: larger inputs and step results are refused."""
    sqlite_synchronous: str = "FULL"
    """``durable_sqlite_synchronous``: SQLite's ``synchronous`` pragma for the journal."""
    poll_interval: float = 0.5
    """``durable_poll_interval``: how often the dispatcher looks for changes by others (D3)."""
    short_sleep: float = 60.0
    """``durable_short_sleep``: durable sleeps up to this long come back by a broker countdown;
    longer ones are sent again by the dispatcher at their wake time (W4)."""
    leader_lease: float = 10.0
    """``durable_leader_lease``: seconds before a standby takes over a silent dispatcher (D6)."""
    late_after: float = 60.0
    """``durable_late_after``: a run decided more than this after its due time is late (O4)."""
    retention: timedelta = timedelta(days=30)
    """``durable_retention``: runs over and due longer ago than this are removed (O1); a
    ``timedelta`` or seconds."""
    prune_interval: float = 300.0
    """``durable_prune_interval``: seconds between the dispatcher's retention passes (O1)."""
    prune_batch: int = 100
    """``durable_prune_batch``: rows per retention batch, one short transaction each (O1)."""
    partitions: int | None = None
    """``durable_partitions``: the journal's partition count (D10); ``None`` when the app does
    not say, and then the count stored in the journal applies (1 on a new journal)."""
    blackouts: tuple[Blackout, ...] | None = None
    """``durable_blackouts``: blackout windows for every schedule (P4), brought into the
    journal when beat starts; ``None`` when the app does not set it (the journal's list then
    stays as it is, managed with ``durable.blackouts`` and the CLI)."""
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    """``durable_engine_options``: keyword arguments for SQLAlchemy's ``create_engine``
    (``pool_size``, ``pool_recycle``, ``connect_args`` …), over the library's defaults
    (docs/journal.md, "Engine options")."""

    def __repr__(self) -> str:
        from dataclasses import fields

        from celery_durable.store.journal.urls import redact

        def shown_value(name: str) -> str:
            if name == "url":
                return repr(redact(self.url))
            if name == "engine_options":  # values may hold credentials (connect_args)
                return "{" + ", ".join(f"{key!r}: …" for key in self.engine_options) + "}"
            return repr(getattr(self, name))

        shown = [f"{f.name}={shown_value(f.name)}" for f in fields(self)]
        return f"DurableConfig({', '.join(shown)})"

    @classmethod
    def from_app(cls, conf: Any, url: str | None = None) -> DurableConfig:
        """Read the settings from a Celery ``app.conf`` (or any mapping with ``get``)."""
        resolved = journal_url(conf, url)
        synchronous = str(conf.get("durable_sqlite_synchronous") or "FULL").upper()
        if synchronous not in _SYNCHRONOUS:
            raise ConfigError(
                f"durable_sqlite_synchronous must be one of {', '.join(_SYNCHRONOUS)}, "
                f"not {synchronous!r}"
            )
        return cls(
            url=resolved,
            check_interval=_period(conf, "durable_check_interval", 60.0),
            run_lease=_period(conf, "durable_run_lease", 300.0),
            max_input_bytes=_count(
                conf, "durable_max_input_bytes", DEFAULT_MAX_INPUT_BYTES, MAX_INPUT_BYTES
            ),
            sqlite_synchronous=synchronous,
            poll_interval=_period(conf, "durable_poll_interval", 0.5),
            leader_lease=_period(conf, "durable_leader_lease", 10.0),
            short_sleep=_period(conf, "durable_short_sleep", 60.0),
            late_after=_positive(conf, "durable_late_after", 60.0),
            retention=_retention(conf.get("durable_retention")),
            prune_interval=_period(conf, "durable_prune_interval", 300.0),
            prune_batch=_count(conf, "durable_prune_batch", 100, MAX_PRUNE_BATCH),
            partitions=_partitions(conf.get("durable_partitions")),
            blackouts=_blackouts(conf.get("durable_blackouts")),
            engine_options=_engine_options(conf.get("durable_engine_options")),
        )


def journal_url(conf: Any, url: str | None = None) -> str:
    """The journal URL of SPEC §8: ``url``, else ``durable_url``, else ``$CELERY_DURABLE_URL``,
    else ``sqlite:///celery_durable.db``. Reads no other setting, so it cannot fail."""
    return str(
        url or conf.get("durable_url") or os.environ.get("CELERY_DURABLE_URL") or DEFAULT_URL
    )


def url_setting(conf: Any, url: str | None = None) -> str:
    """The setting :meth:`DurableConfig.from_app` takes the journal URL from, as a user names it.

    Messages about a bad URL say where to fix it: ``Durable(app, url)``, ``durable_url``,
    ``$CELERY_DURABLE_URL`` or, when none is given, the default URL.
    """
    if url:
        return "Durable(app, url)"
    if conf.get("durable_url"):
        return "durable_url"
    if os.environ.get("CELERY_DURABLE_URL"):
        return "$CELERY_DURABLE_URL"
    return "the default journal URL"


def _masked_setting(key: Any, value: Any) -> Any:
    if isinstance(key, str) and key.lower().endswith("durable_url") and isinstance(value, str):
        from celery_durable.store.journal.urls import redact

        return redact(value)
    return value


def install_report_filter() -> None:
    """Make Celery's settings dumps mask the journal password (idempotent).

    ``celery report`` and ``app.conf.humanize()``/``table(censored=True)`` pass the settings
    through ``celery.app.utils.filter_hidden_settings``, which masks only keys whose *names* look
    secret (``HIDDEN_SETTINGS``: ``PASS``, ``KEY``, ``DATABASE`` …) and the broker/backend
    URLs. ``durable_url`` matches none, so it is wrapped here: a ``*durable_url`` setting is
    shown as the journal URL with its password masked (host and database stay visible, as
    Celery shows ``broker_url``).
    """
    from celery.app import utils

    original = utils.filter_hidden_settings
    if getattr(original, "celery_durable", False):
        return

    def filter_hidden_settings(conf: Any) -> Any:
        return {key: _masked_setting(key, value) for key, value in original(conf).items()}

    filter_hidden_settings.celery_durable = True  # type: ignore[attr-defined]
    filter_hidden_settings.__doc__ = original.__doc__
    utils.filter_hidden_settings = filter_hidden_settings


MAX_PRUNE_BATCH = 1_000_000
"""The most rows one retention batch may touch (O1: small batches, short transactions)."""

MAX_INPUT_BYTES = 2**31
"""The largest ``durable_max_input_bytes``: 2 GiB, beyond any value a journal row can hold."""

MAX_PERIOD = MAX_PERIOD_SECONDS
"""The longest lease or interval a setting may give, in seconds (100 years: one limit with the
options', :data:`~celery_durable.core.limits.MAX_PERIOD_SECONDS`)."""


def _period(conf: Any, key: str, default: float) -> float:
    """A positive number of seconds that is added to dates: at most :data:`MAX_PERIOD`."""
    number = _positive(conf, key, default)
    if not number <= MAX_PERIOD:  # infinity too
        raise ConfigError(f"{key} must be at most {MAX_PERIOD:,.0f} s (100 years), not {number!r}")
    return number


def _count(conf: Any, key: str, default: int, maximum: int) -> int:
    """A whole number from 1 to ``maximum`` (a row count)."""
    number = _positive(conf, key, default)
    if not float(number).is_integer() or number > maximum:
        raise ConfigError(f"{key} must be a whole number from 1 to {maximum:,}, not {number!r}")
    return int(number)


def _positive(conf: Any, key: str, default: float) -> float:
    value = conf.get(key)
    if value is None:
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be a number, not {value!r}") from None
    if not number > 0:
        raise ConfigError(f"{key} must be positive, not {value!r}")
    return number


def _partitions(value: Any) -> int | None:
    """``durable_partitions``: an integer from 1 to 256, or unset (D10)."""
    if value is None:
        return None
    from celery_durable.core.partitions import PartitionsError, check_partitions

    try:
        return check_partitions(value)
    except PartitionsError as exc:
        raise ConfigError(str(exc)) from None


def _blackouts(value: Any) -> tuple[Blackout, ...] | None:
    """``durable_blackouts``: a list of :class:`~celery_durable.Blackout` windows, or unset."""
    if value is None:
        return None
    try:
        return check_windows(value, "durable_blackouts")
    except InvalidSchedule as exc:
        raise ConfigError(str(exc)) from None  # the message names the setting


def _engine_options(value: Any) -> Mapping[str, Any]:
    """``durable_engine_options``: a mapping of ``create_engine`` keyword names to values."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(
            "durable_engine_options must be a dict of create_engine() keyword arguments, "
            f"not a {type(value).__name__}"
        )
    bad = [key for key in value if not (isinstance(key, str) and key.isidentifier())]
    if bad:
        raise ConfigError(
            f"durable_engine_options keys must be keyword names, not {', '.join(map(repr, bad))}"
        )
    return dict(value)


def _retention(value: Any) -> timedelta:
    """``durable_retention``: a ``timedelta`` or a number of seconds, at least one hour."""
    if value is None:
        return timedelta(days=30)
    if isinstance(value, timedelta):
        retention = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            retention = timedelta(seconds=value)
        except (OverflowError, ValueError):  # NaN, infinity, beyond timedelta's range
            raise ConfigError(
                f"durable_retention must be a finite number of seconds up to "
                f"{timedelta.max.days:,} days, not {value!r}"
            ) from None
    else:
        raise ConfigError(
            f"durable_retention must be a timedelta or a number of seconds, not {value!r}"
        )
    if retention < timedelta(hours=1):
        raise ConfigError(f"durable_retention must be at least one hour, not {retention}")
    return retention


_APP_HOOKS: list[Callable[[Any], None]] = []
_APP_HOOKS_LOCK = threading.Lock()


def register_app_hook(hook: Callable[[Any], None]) -> None:
    """Have ``hook(app)`` called once an app's task modules are imported
    (:func:`import_task_modules`); registering the same hook twice is harmless.

    An integration sets an app up this way without the CLI or the core knowing it: the Django
    app registers the hook that gives the Celery app the journal URL Django resolves.
    """
    with _APP_HOOKS_LOCK:
        if hook not in _APP_HOOKS:
            _APP_HOOKS.append(hook)


def import_task_modules(app: Any) -> None:
    """Import the app's task modules once, as a worker does at start-up.

    ``app.loader.import_default_modules()`` sends Celery's ``import_modules`` signal, on which
    the Django fixup runs ``django.setup()`` (so ``celery_durable.contrib.django`` sets
    ``durable_url`` from the project's settings) and ``autodiscover_tasks()`` imports each
    app's ``tasks`` module; then the ``imports`` and ``include`` modules are imported. Any
    process that reads the journal outside a worker or beat (the CLI, the Django admin) calls
    this before it reads ``durable_*`` settings or looks a task up, so it sees what they see.
    The hooks of :func:`register_app_hook` run after the imports.
    """
    if getattr(app, "_celery_durable_imported", False):
        return
    app.loader.import_default_modules()
    app._celery_durable_imported = True
    with _APP_HOOKS_LOCK:
        hooks = list(_APP_HOOKS)
    for hook in hooks:
        hook(app)
