"""R3, R5: ``Every`` (a fixed interval from the anchor) and ``Once`` (a single instant)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar

from celery_durable.core.rules._base import (
    _DAY,
    _MAX_INTERVAL,
    _MIN_INTERVAL,
    _MINUTE,
    _SECOND,
    _check_instant,
    _invalid,
    _Rule,
    _show,
    _text_instant,
)


@dataclass(frozen=True, slots=True, init=False)
class Every(_Rule):
    """R3: due at ``anchor + k·interval`` for k = 1, 2, …; 1 s ≤ interval ≤ 366 days.

    >>> str(Every(timedelta(seconds=90)))
    'every 1m30s'
    """

    tag: ClassVar[str] = "every"
    uses_anchor: ClassVar[bool] = True
    interval: timedelta
    end_at: datetime | None
    max_runs: int | None

    def __init__(
        self,
        interval: timedelta,
        *,
        end_at: datetime | None = None,
        max_runs: int | None = None,
    ) -> None:
        if not isinstance(interval, timedelta):
            raise _invalid("Every.interval", f"expected a timedelta, got {_show(interval)}")
        if not _MIN_INTERVAL <= interval <= _MAX_INTERVAL:
            raise _invalid(
                "Every.interval", f"must be between 1 second and 366 days, got {interval}"
            )
        self._set("Every", end_at, max_runs, interval=interval)

    def _next(self, after: datetime, anchor: datetime | None) -> datetime | None:
        if anchor is None:
            raise _invalid("Every.next_after", "needs the anchor (creation or last change)")
        start = _check_instant("next_after.anchor", anchor)
        # Whole intervals already elapsed, counted exactly on microseconds: no loop.
        k = 1 if after < start else (after - start) // self.interval + 1
        return start + k * self.interval

    def _json_fields(self) -> dict[str, Any]:
        whole, part = divmod(self.interval, _SECOND)
        return {"seconds": whole if not part else self.interval / _SECOND}

    def _describe(self) -> str:
        left, text = self.interval, ""
        for unit, size in (("d", _DAY), ("h", timedelta(hours=1)), ("m", _MINUTE)):
            count, left = divmod(left, size)
            text += f"{count}{unit}" if count else ""
        if left:
            seconds = left / _SECOND
            text += f"{seconds:g}s" if left % _SECOND else f"{int(seconds)}s"
        return f"every {text}"


@dataclass(frozen=True, slots=True, init=False)
class Once(_Rule):
    """R5: a single due time ``at`` (aware; kept in UTC)."""

    tag: ClassVar[str] = "once"
    at: datetime
    end_at: datetime | None
    max_runs: int | None

    def __init__(
        self,
        at: datetime,
        *,
        end_at: datetime | None = None,
        max_runs: int | None = None,
    ) -> None:
        self._set("Once", end_at, max_runs, at=_check_instant("Once.at", at))

    def _next(self, after: datetime, anchor: datetime | None) -> datetime | None:
        return self.at if self.at > after else None

    def _json_fields(self) -> dict[str, Any]:
        return {"at": _text_instant(self.at)}

    def _describe(self) -> str:
        return f"once at {_text_instant(self.at)}"
