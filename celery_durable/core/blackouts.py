"""Blackout windows (P4): named stretches of time in which no run of a schedule starts. Pure.

A window is either recurring — it opens at each due time of a ``Daily``, ``Weekly``, ``Cron``
or ``Crontab`` start rule (R7 applies to that start) and stays open for a wall-clock
``duration`` in the start's zone — or a fixed UTC range. A window covers ``[start, end)``:
a due time at its start is inside, one at its end is not.

What a schedule does with a run that would start inside a window is its ``on_blackout``
choice: skip it (recorded as skipped with the reason ``blackout <name>``) or defer it (one
run, sent when the blackout ends). The aggregate asks :func:`blocking`; the global windows of
the journal are passed in, as the clock is. Beside this module: ``blackout_plan.py`` (the due
time and the send moment are both checked: no run starts inside a window), ``blackout_text.py``
(the text form the CLI and the admin read and show) and ``global_blackouts.py`` (the global
windows' stream).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from celery_durable.core.codec import time_from_json, time_to_json
from celery_durable.core.ids import check_text, first_control
from celery_durable.core.rules import Cron, Crontab, Daily, Weekly, rule_from_json
from celery_durable.core.rules._base import UTC, _check_instant, _check_zone, _resolve, _zone
from celery_durable.errors import InvalidSchedule

StartRule = Daily | Weekly | Cron | Crontab
"""The rules a recurring window may open at."""

MAX_NAME_LENGTH = 100
MAX_DURATION = timedelta(days=366)
MAX_WINDOWS = 100
"""At most this many windows per schedule, and as many global ones."""

_SLACK = timedelta(days=1)
"""How much longer than its duration a window can be in UTC (a clock change; zone history)."""
_CHAIN = 100
"""At most this many overlapping windows are followed to find where a blackout ends."""
_FIRST_PROBE = timedelta(minutes=1)


class OnBlackout(str, Enum):
    """What happens to a due time inside a blackout window (P4)."""

    SKIP = "skip"
    """Recorded as skipped with the reason ``blackout <name>`` (default)."""
    DEFER = "defer"
    """One run, sent when the blackout ends (several due times inside it: still one run)."""

    @classmethod
    def parse(cls, value: object) -> OnBlackout:
        """An ``OnBlackout`` from itself or its name/value (``"skip"``, ``"DEFER"``)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            for member in cls:
                if value.lower() in (member.value, member.name.lower()):
                    return member
        raise InvalidSchedule(
            f"on_blackout must be 'skip' or 'defer', not {_shown(value)}", field="on_blackout"
        )


def _breaks_line(text: str) -> bool:
    """A line or paragraph separator (U+2028, U+2029): a window is one line of text."""
    return any(unicodedata.category(c) in ("Zl", "Zp") for c in text)


def _length(span: timedelta) -> str:
    if abs(span) >= timedelta(days=1):
        return f"{span / timedelta(days=1):.1f} days"
    return f"{span.total_seconds():g} s"


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "…"


@dataclass(frozen=True, slots=True)
class Blackout:
    """A named blackout window (P4).

    ``Blackout(name, start=Daily("02:00", "Europe/Oslo"), duration=timedelta(hours=2))``
    recurs; ``start`` may also be a cron expression text with ``zone`` (default UTC).
    ``Blackout.between(name, start, end)`` is one fixed range of instants. Raises
    ``InvalidSchedule`` for an empty name, a duration not above zero, an unknown zone, an end
    before the start.

    >>> Blackout("backups", "0 2 * * *", timedelta(hours=2), zone="Europe/Oslo").describe()
    'backups;cron 0 2 * * *;2h;Europe/Oslo'

    A name cannot hold ``;`` (the separator of the text form).
    """

    name: str
    start: StartRule | datetime
    duration: timedelta
    zone: str | None = None

    def __post_init__(self) -> None:
        name = check_text(self.name, "blackout name", max_length=MAX_NAME_LENGTH)
        if name != name.strip() or first_control(name) is not None or _breaks_line(name):
            raise InvalidSchedule(
                f"blackout name {_shown(name)} has leading or trailing whitespace, a "
                "control character or a line break",
                field="blackout.name",
            )
        if ";" in name:  # the text form separates its parts with ";" (blackout_text.py)
            raise InvalidSchedule(
                f"blackout name {_shown(name)} holds ';', which separates the parts of a "
                "window's text form",
                field="blackout.name",
            )
        where = f"blackout {name!r}"
        duration = self.duration
        if isinstance(duration, bool) or not isinstance(duration, (timedelta, int, float)):
            raise InvalidSchedule(
                f"{where}: duration must be a timedelta or seconds, not {_shown(duration)}",
                field="blackout.duration",
            )
        if not isinstance(duration, timedelta):
            # Checked before timedelta sees it: NaN, infinity and 1e300 would raise its
            # ValueError or OverflowError instead of naming the window.
            if not 0 < duration <= MAX_DURATION.total_seconds():
                raise InvalidSchedule(
                    f"{where}: duration must be more than 0 s and at most 366 days, "
                    f"not {duration:g} s",
                    field="blackout.duration",
                )
            duration = timedelta(seconds=duration)
        start, zone = self.start, self.zone
        if not timedelta(0) < duration <= MAX_DURATION:
            if isinstance(start, datetime):  # Blackout.between: the range's end minus its start
                raise InvalidSchedule(
                    f"{where}: a fixed range must end after it starts and span at most 366 "
                    f"days, not {_length(duration)}",
                    field="blackout.end",
                )
            raise InvalidSchedule(
                f"{where}: duration must be more than 0 s and at most 366 days, "
                f"not {_length(duration)}",
                field="blackout.duration",
            )
        if isinstance(start, str):
            start = Cron(start, "UTC" if zone is None else zone)
        if isinstance(start, datetime):
            if zone is not None:
                raise InvalidSchedule(
                    f"{where}: a fixed range is in UTC; give no zone", field="blackout.zone"
                )
            start = _check_instant(f"{where}.start", start)
        elif isinstance(start, (Daily, Weekly, Cron, Crontab)):
            if start.max_runs is not None:
                raise InvalidSchedule(
                    f"{where}: the start rule must not have max_runs", field="blackout.start"
                )
            if zone is not None:
                _check_zone(f"{where}.zone", zone)
                if zone != start.zone:
                    raise InvalidSchedule(
                        f"{where}: zone {zone!r} differs from the start rule's zone "
                        f"{start.zone!r}; give one of them",
                        field="blackout.zone",
                    )
            zone = start.zone
        else:
            raise InvalidSchedule(
                f"{where}: start must be a Daily, Weekly, Cron or Crontab rule, a cron text "
                f"or an aware datetime, not {type(start).__name__}",
                field="blackout.start",
            )
        for attr, value in (("name", name), ("start", start), ("duration", duration)):
            object.__setattr__(self, attr, value)
        object.__setattr__(self, "zone", zone)

    @classmethod
    def between(cls, name: str, start: datetime, end: datetime) -> Blackout:
        """One fixed range ``[start, end)`` of instants (aware datetimes)."""
        first = _check_instant(f"blackout {name!r}.start", start)
        last = _check_instant(f"blackout {name!r}.end", end)
        if last <= first:
            raise InvalidSchedule(
                f"blackout {name!r}: end {time_to_json(last)} is not after start "
                f"{time_to_json(first)}",
                field="blackout.end",
            )
        return cls(name, start=first, duration=last - first)

    @property
    def fixed(self) -> bool:
        """A fixed UTC range, not a recurring window."""
        return isinstance(self.start, datetime)

    def covering(self, instant: datetime) -> datetime | None:
        """The end of this window's opening that covers ``instant`` (aware UTC), else ``None``."""
        start = self.start
        if isinstance(start, datetime):
            end = start + self.duration
            return end if start <= instant < end else None
        opened = self._latest_start(start, instant)
        if opened is None:
            return None
        end = self._end_of(start, opened)
        return end if end > instant else None

    def _latest_start(self, rule: StartRule, instant: datetime) -> datetime | None:
        """The last start of the rule at or before ``instant`` within the window's reach.

        Ends grow with starts (wall-clock addition then R7 keep order), so only the latest
        start can cover ``instant``. Probes back by doubling steps, then walks forward.
        """
        try:
            reach = instant - self.duration - _SLACK
        except OverflowError:
            reach = datetime.min.replace(tzinfo=UTC)
        step = _FIRST_PROBE
        while True:
            probe = max(instant - step, reach) if instant - reach > step else reach
            found = rule.next_after(probe)
            if found is not None and found <= instant:
                break
            if probe == reach:
                return None
            step *= 2
        while True:
            following = rule.next_after(found)
            if following is None or following > instant:
                return found
            found = following

    def _end_of(self, rule: StartRule, opened: datetime) -> datetime:
        """Where an opening ends: its local start plus the duration on the wall clock (R7)."""
        zone = _zone(rule.zone)
        local = opened.astimezone(zone)
        wall = (local.replace(tzinfo=None) + self.duration).replace(tzinfo=zone, fold=0)
        return _resolve(wall, zone)

    def to_json(self) -> dict[str, Any]:
        """The stored form (a persistent contract, §9)."""
        start = self.start
        if isinstance(start, datetime):
            return {
                "name": self.name,
                "from": time_to_json(start),
                "until": time_to_json(start + self.duration),
            }
        return {
            "name": self.name,
            "start": start.to_json(),
            "seconds": self.duration.total_seconds(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Blackout:
        """Rebuild a window from :meth:`to_json`; ``InvalidSchedule`` when it is not one."""
        if not isinstance(data, Mapping) or "name" not in data:
            raise InvalidSchedule(f"not a stored blackout window: {_shown(data)}")
        if "from" in data:
            first, last = time_from_json(data["from"]), time_from_json(data["until"])
            return cls.between(data["name"], first, last)
        rule = rule_from_json(data.get("start"))
        if not isinstance(rule, (Daily, Weekly, Cron, Crontab)):
            raise InvalidSchedule(f"blackout {data['name']!r}: stored start is a {rule.tag} rule")
        return cls(data["name"], start=rule, duration=timedelta(seconds=data["seconds"]))

    def describe(self) -> str:
        """The text form, ``NAME;cron EXPR;DURATION;ZONE`` or ``NAME;FROM;UNTIL``: what the
        CLI and the admin show and read back unchanged
        (:func:`~celery_durable.core.blackout_text.parse_window` is its inverse)."""
        from celery_durable.core.blackout_text import describe_window

        return describe_window(self)

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:
        start = self.start
        shown = time_to_json(start) if isinstance(start, datetime) else repr(start)
        return (
            f"Blackout({self.name!r}, start={shown}, duration={self.duration.total_seconds():g}s)"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Blocked:
    """A due time inside a blackout: the first window that covers it, and when it is over."""

    window: Blackout
    ends: datetime | None
    """The first instant at or after the due time inside no window; ``None`` when more than
    :data:`_CHAIN` windows overlap in a row (a blackout that never ends)."""

    @property
    def reason(self) -> str:
        """The reason recorded with a skipped due time: ``blackout <name>``."""
        return f"blackout {self.window.name}"


def blocking(due: datetime, windows: Sequence[Blackout]) -> Blocked | None:
    """Whether ``due`` falls inside one of ``windows``, and when the blackout is over.

    Overlapping and adjoining windows make one blackout: its end is the first instant not
    covered by any window, which is where a deferred run is sent.
    """
    if not windows:
        return None
    first: Blackout | None = None
    moment = due
    for _ in range(_CHAIN):
        covering = [(w, end) for w in windows if (end := w.covering(moment)) is not None]
        if not covering:
            return None if first is None else Blocked(window=first, ends=moment)
        first = first or covering[0][0]
        moment = max(end for _, end in covering)
    return Blocked(window=first or windows[0], ends=None)


def check_windows(windows: object, what: str = "blackouts") -> tuple[Blackout, ...]:
    """A tuple of distinct-named windows from a list of ``Blackout``; ``InvalidSchedule``."""
    if windows is None:
        return ()
    if isinstance(windows, (Blackout, str, bytes, Mapping)) or not isinstance(windows, Iterable):
        raise InvalidSchedule(f"{what} must be a list of Blackout windows", field=what)
    out = tuple(windows)
    for window in out:
        if not isinstance(window, Blackout):
            raise InvalidSchedule(
                f"{what} must hold Blackout windows, not {type(window).__name__}", field=what
            )
    if len(out) > MAX_WINDOWS:
        raise InvalidSchedule(f"{what}: at most {MAX_WINDOWS} windows, not {len(out)}", field=what)
    names = [w.name for w in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidSchedule(f"{what}: the name {twice[0]!r} is given twice", field=what)
    return out


def windows_to_json(windows: Iterable[Blackout]) -> list[dict[str, Any]]:
    """The stored form of a list of windows."""
    return [w.to_json() for w in windows]


def windows_from_json(data: object) -> tuple[Blackout, ...]:
    """Rebuild a list of windows; ``InvalidSchedule`` when it is not one."""
    if not isinstance(data, list):
        raise InvalidSchedule(f"stored blackouts must be a list, not {_shown(data)}")
    return tuple(Blackout.from_json(item) for item in data)


__all__ = [
    "Blackout",
    "Blocked",
    "OnBlackout",
    "blocking",
    "check_windows",
    "windows_from_json",
    "windows_to_json",
]
