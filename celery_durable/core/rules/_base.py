"""What every rule shares: the checks of their fields, local times under R7, and ``_Rule``."""

from __future__ import annotations

import importlib.resources
import re
from datetime import datetime, time, timedelta, timezone, tzinfo
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar, Protocol
from zoneinfo import ZoneInfo

from celery_durable.errors import InvalidSchedule

if TYPE_CHECKING:
    from celery_durable.core.rules import Rule

UTC = timezone.utc
_MINUTE = timedelta(minutes=1)
_DAY = timedelta(days=1)
_SECOND = timedelta(seconds=1)
_MIN_INTERVAL, _MAX_INTERVAL = _SECOND, timedelta(days=366)


def _show(value: object) -> str:
    text = value[:40] + "…" if isinstance(value, str) and len(value) > 40 else value
    return f"{type(value).__name__} {text!r}"


def _invalid(where: str, problem: str) -> InvalidSchedule:
    return InvalidSchedule(f"{where}: {problem}", field=where)


_ZONE_NAME = re.compile(r"[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+)*\Z")


@lru_cache(maxsize=256)
def _zone(name: str) -> tzinfo:
    if name in ("UTC", "Etc/UTC"):
        return UTC
    try:
        node = importlib.resources.files("tzdata").joinpath("zoneinfo")
    except ModuleNotFoundError:  # pragma: no cover - tzdata is a dependency
        return ZoneInfo(name)
    for part in name.split("/"):
        node = node.joinpath(part)
    if not node.is_file():
        raise LookupError(name)
    with node.open("rb") as data:
        return ZoneInfo.from_file(data, key=name)


def _check_zone(where: str, name: object) -> tzinfo:
    if not isinstance(name, str):
        raise _invalid(where, f"expected an IANA time zone name, got {_show(name)}")
    if len(name) <= 100 and _ZONE_NAME.match(name):
        try:
            return _zone(name)
        except Exception:  # unreadable or missing file: reported as unknown below
            pass
    raise _invalid(where, f"unknown time zone {_short(name)}")


def _short(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "…")


_TIME = re.compile(r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{6}))?)?\Z")


def _check_time(where: str, value: object) -> time:
    if isinstance(value, str):
        match = _TIME.match(value) if len(value) <= 20 else None
        if match is None:
            raise _invalid(where, f"expected 'HH:MM' or 'HH:MM:SS', got {_short(value)}")
        hour, minute, second, micro = (int(part or 0) for part in match.groups())
        try:
            return time(hour, minute, second, micro)
        except ValueError as exc:
            raise _invalid(where, f"{_short(value)} is not a time of day ({exc})") from None
    if not isinstance(value, time):
        raise _invalid(where, f"expected a datetime.time or 'HH:MM', got {_show(value)}")
    if value.tzinfo is not None:
        raise _invalid(where, "must be a naive time (the zone says where it is)")
    return value.replace(fold=0)


def _check_instant(where: str, value: object) -> datetime:
    """An aware datetime, returned as a plain ``datetime`` in UTC."""
    if type(value) is datetime and value.tzinfo is UTC:
        return value  # already what is returned below: the common case, without a copy
    if not isinstance(value, datetime):
        raise _invalid(where, f"expected an aware datetime, got {_show(value)}")
    try:
        offset = value.utcoffset()
        utc = value.astimezone(UTC) if offset is not None else None
    except OverflowError:
        from celery_durable.core.limits import RANGE_TEXT

        raise _invalid(where, f"{value.isoformat()} is outside {RANGE_TEXT}") from None
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise _invalid(where, f"cannot be read as an instant ({exc})") from None
    if utc is None:
        raise _invalid(where, "must be an aware datetime (naive datetimes have no instant)")
    return datetime(*utc.timetuple()[:6], utc.microsecond, tzinfo=UTC)


def _text_instant(value: datetime) -> str:
    return value.replace(tzinfo=None).isoformat() + "Z"


# R7: from a local wall-clock time to an instant.


def _resolve(local: datetime, zone: tzinfo) -> datetime:
    """The instant (aware UTC) at which ``local`` (aware in ``zone``, fold 0) is due under R7.

    Fold 0 already picks the first of two occurrences. A local time exists exactly when the
    round trip through UTC gives it back; otherwise it lies in a gap.
    """
    due = local.astimezone(UTC)
    if due.astimezone(zone) == local:  # same tzinfo: compares the wall-clock fields
        return due
    return _gap_end(due, zone, local.utcoffset())


def _gap_end(inside: datetime, zone: tzinfo, before: timedelta | None) -> datetime:
    """The first instant after the gap that skips a local time.

    Fold 0 reads a skipped time with ``before``, the offset from before the clock change, which
    puts ``inside`` after the change by less than the jump. Bisect on whole seconds (zone
    transitions fall on whole seconds) between ``inside - jump`` and ``inside``.
    """
    after = inside.astimezone(zone).utcoffset()
    if after is None or before is None:  # pragma: no cover - zoneinfo always answers
        raise InvalidSchedule(f"time zone {zone} has no UTC offset at {inside}")
    low, high = inside - (after - before), inside
    low -= timedelta(microseconds=low.microsecond)
    while high - low > _SECOND:
        middle = low + (high - low) // 2
        middle -= timedelta(microseconds=middle.microsecond)
        if middle.astimezone(zone).utcoffset() == after:
            high = middle
        else:
            low = middle
    return high


class LiveSchedules(Protocol):
    """The schedule objects of ``beat_schedule`` entries, as a beat process holds them (B3).

    The core keeps no live objects: whoever holds them (the beat's runtime) passes this in,
    as it passes the clock. ``next_due`` is ``None`` for an entry it does not hold.
    """

    def next_due(self, entry: str, after: datetime) -> datetime | None:
        """The entry's next due time after its last run at ``after``, asked of its object."""
        ...

    def as_of(self, now: datetime) -> LiveSchedules:
        """The same objects asked as of ``now``, the moment a decision is made."""
        ...


class _Rule:
    """What every rule shares: bounds, ``next_after``, JSON, a human form, pickling as JSON."""

    __slots__ = ()
    tag: ClassVar[str]
    uses_anchor: ClassVar[bool] = False
    """Whether ``next_after`` reads the anchor (only :class:`Every` does)."""
    asks_live: ClassVar[bool] = False
    """Whether ``next_after`` asks the live objects (only :class:`BeatEntry` does)."""
    end_at: datetime | None
    max_runs: int | None

    def _set(self, owner: str, end_at: object, max_runs: object, **values: object) -> None:
        """Store checked values on the frozen instance, plus the bounds every rule has (R6)."""
        if end_at is not None:
            end_at = _check_instant(f"{owner}.end_at", end_at)
        if max_runs is not None and (type(max_runs) is not int or max_runs < 1):
            raise _invalid(
                f"{owner}.max_runs", f"expected an int >= 1 or None, got {_show(max_runs)}"
            )
        for name, value in (*values.items(), ("end_at", end_at), ("max_runs", max_runs)):
            object.__setattr__(self, name, value)

    def next_after(
        self,
        after: datetime,
        *,
        anchor: datetime | None = None,
        live: LiveSchedules | None = None,
    ) -> datetime | None:
        """The first due time strictly after ``after`` (aware UTC), or ``None`` (R8a).

        ``after`` may carry any UTC offset; naive datetimes raise :class:`InvalidSchedule`.
        A due time equal to ``end_at`` is allowed, a later one is not. ``max_runs`` is not
        applied here: the schedule counts its runs. Only :class:`Every` uses ``anchor``, only
        :class:`BeatEntry` uses ``live``.
        """
        # The usual caller passes a UTC datetime: skip the general check for it.
        if not (type(after) is datetime and after.tzinfo is UTC) and (
            not isinstance(after, datetime) or after.utcoffset() is None
        ):
            raise _invalid("next_after.after", f"must be an aware datetime, got {_show(after)}")
        try:
            due = self._next_live(after, anchor, live)
        except OverflowError:  # past the last representable datetime
            return None
        if due is None or (self.end_at is not None and due > self.end_at):
            return None
        return due

    def _next(self, after: datetime, anchor: datetime | None) -> datetime | None:
        raise NotImplementedError

    def _next_live(
        self, after: datetime, anchor: datetime | None, live: LiveSchedules | None
    ) -> datetime | None:
        return self._next(after, anchor)

    def to_json(self) -> dict[str, Any]:
        """The stored form: a ``type`` tag, the rule's fields, ``end_at`` and ``max_runs``."""
        end = None if self.end_at is None else _text_instant(self.end_at)
        return {"type": self.tag, **self._json_fields(), "end_at": end, "max_runs": self.max_runs}

    def _json_fields(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_json(cls, data: object) -> Rule:
        """Rebuild a rule of this class from :meth:`to_json` output (see :func:`rule_from_json`)."""
        from celery_durable.core.rules._json import rule_from_json

        rule = rule_from_json(data)
        if not isinstance(rule, cls):
            raise _invalid("rule JSON", f"expected type {cls.tag!r}, got {rule.tag!r}")
        return rule

    def describe(self) -> str:
        """A short human form, e.g. ``daily at 02:00 Europe/Oslo``."""
        text = self._describe()
        if self.end_at is not None:
            text += f", until {_text_instant(self.end_at)}"
        if self.max_runs is not None:
            text += f", at most {self.max_runs} run{'s' if self.max_runs != 1 else ''}"
        return text

    def _describe(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.describe()

    def __reduce__(self) -> tuple[Any, ...]:
        from celery_durable.core.rules._json import rule_from_json  # it imports every rule

        return (rule_from_json, (self.to_json(),))
