"""Configuration read once from ``app.conf`` (``durable_*`` keys) into a frozen object."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from celery_durable.core.codec import DEFAULT_MAX_INPUT_BYTES
from celery_durable.errors import DurableError

DEFAULT_URL = "sqlite:///celery_durable.db"

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


class ConfigError(DurableError, ValueError):
    """A ``durable_*`` setting has a value the library cannot use."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DurableConfig:
    """The settings of one :class:`~celery_durable.Durable`, with their defaults."""

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

    @classmethod
    def from_app(cls, conf: Any, url: str | None = None) -> DurableConfig:
        """Read the settings from a Celery ``app.conf`` (or any mapping with ``get``)."""
        resolved = (
            url or conf.get("durable_url") or os.environ.get("CELERY_DURABLE_URL") or DEFAULT_URL
        )
        synchronous = str(conf.get("durable_sqlite_synchronous") or "FULL").upper()
        if synchronous not in _SYNCHRONOUS:
            raise ConfigError(
                f"durable_sqlite_synchronous must be one of {', '.join(_SYNCHRONOUS)}, "
                f"not {synchronous!r}"
            )
        return cls(
            url=str(resolved),
            check_interval=_positive(conf, "durable_check_interval", 60.0),
            run_lease=_positive(conf, "durable_run_lease", 300.0),
            max_input_bytes=int(
                _positive(conf, "durable_max_input_bytes", DEFAULT_MAX_INPUT_BYTES)
            ),
            sqlite_synchronous=synchronous,
            poll_interval=_positive(conf, "durable_poll_interval", 0.5),
            leader_lease=_positive(conf, "durable_leader_lease", 10.0),
            short_sleep=_positive(conf, "durable_short_sleep", 60.0),
        )


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
