"""The choices a schedule carries: catch-up (C1–C3), overlap (D7) and timing (P1–P3). Pure."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from typing import Any, TypeVar

from celery_durable.errors import InvalidSchedule

E = TypeVar("E", bound=Enum)


class CatchUp(str, Enum):
    """Which missed due times run after downtime (SPEC §4)."""

    LATEST = "latest"
    """Of the due times not yet decided, only the most recent runs (default)."""
    ALL = "all"
    """Each runs, oldest first, but only the 1000 most recent."""
    NONE = "none"
    """Only due times reached at most 60 s late run; missed ones are dropped."""

    @classmethod
    def parse(cls, value: object) -> CatchUp:
        """A ``CatchUp`` from itself or its name/value (``"latest"``, ``"ALL"``)."""
        return _parse(cls, value, "catch_up")


class Overlap(str, Enum):
    """What happens when a due time comes while the previous run still goes (D7)."""

    ALLOW = "allow"
    """The new run starts alongside the running one (default)."""
    SKIP = "skip"
    """The due time is recorded as skipped."""
    BUFFER_ONE = "buffer_one"
    """At most one due time waits and starts when the running one ends."""

    @classmethod
    def parse(cls, value: object) -> Overlap:
        """An ``Overlap`` from itself or its name/value (``"skip"``, ``"BUFFER_ONE"``)."""
        return _parse(cls, value, "overlap")


def member(cls: type[E], value: Any) -> E:
    """``cls(value)``, the member with this value, by one dictionary lookup when there is one
    (stored states name thousands of them); anything else raises as ``cls(value)`` does."""
    try:
        found = cls._value2member_map_.get(value)
    except TypeError:  # an unhashable value: Enum's own lookup names it
        found = None
    return cls(value) if found is None else found  # type: ignore[return-value]


def _parse(cls: type[E], value: object, what: str) -> E:
    if isinstance(value, cls):
        return value
    if value is None:
        raise InvalidSchedule(f"{what} is missing", field=what)
    if isinstance(value, str):
        for member in cls:
            if value.lower() in (member.value, member.name.lower()):
                return member
    names = ", ".join(m.name for m in cls)
    raise InvalidSchedule(f"{what} must be one of {names}, not {value!r}", field=what)


# Scheduling policies (SPEC §5d: P1–P3) -----------------------------------------------------

POLICY_FIELDS = ("start_deadline", "jitter", "catch_up_window")
"""The timing policies a schedule may carry, as keyword arguments and option keys."""

MAX_POLICY_SPAN = timedelta(days=366)
"""The longest start deadline, jitter or catch-up window accepted (as ``Every``'s interval)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """A schedule's timing policies (P1–P3); ``None`` means the policy is off.

    ``start_deadline``: a run not started by due + deadline never starts (P1).
    ``jitter``: each run is sent at due + an offset in ``[0, jitter)`` derived from its run ID (P2).
    ``catch_up_window``: ``LATEST``/``ALL`` only consider due times this recent (P3).
    """

    start_deadline: timedelta | None = None
    jitter: timedelta | None = None
    catch_up_window: timedelta | None = None

    @classmethod
    def parse(cls, catch_up: CatchUp, **values: object) -> Timing:
        """Check the policies (timedelta or seconds); ``InvalidSchedule`` names a bad one."""
        unknown = sorted(set(values) - set(POLICY_FIELDS))
        if unknown:
            raise InvalidSchedule(f"unknown timing policy {unknown[0]!r}", field=unknown[0])
        spans = {name: _span(values.get(name), name) for name in POLICY_FIELDS}
        timing = cls(**spans)
        if timing.catch_up_window is not None and catch_up is CatchUp.NONE:
            raise InvalidSchedule(
                "catch_up_window applies to CatchUp.LATEST and CatchUp.ALL; CatchUp.NONE "
                "already runs only due times reached at most 60 s late",
                field="catch_up_window",
            )
        if (
            timing.jitter is not None
            and timing.start_deadline is not None
            and timing.jitter >= timing.start_deadline
        ):
            raise InvalidSchedule(
                f"jitter ({timing.jitter.total_seconds():g} s) must be shorter than "
                f"start_deadline ({timing.start_deadline.total_seconds():g} s): a run sent "
                "after its deadline could never start",
                field="jitter",
            )
        return timing

    def to_json(self) -> dict[str, float]:
        """Seconds of each policy that is on (an empty dict when none is)."""
        return {
            name: value.total_seconds()
            for name in POLICY_FIELDS
            if (value := getattr(self, name)) is not None
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Timing:
        """Read :meth:`to_json`'s form from a mapping that may hold other keys too."""
        spans = {
            name: timedelta(seconds=data[name])
            for name in POLICY_FIELDS
            if data.get(name) is not None
        }
        return cls(**spans) if spans else _UNTIMED


_UNTIMED = Timing()
"""The timing of most schedules (no policy on), shared: it is immutable."""


def _span(value: object, name: str) -> timedelta | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (timedelta, int, float)):
        raise InvalidSchedule(
            f"{name} must be a timedelta or a number of seconds, not {type(value).__name__}",
            field=name,
        )
    # Seconds are checked before timedelta sees them: NaN, infinity and 1e300 would raise
    # its ValueError or OverflowError instead of naming the policy.
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if not 0 < seconds <= MAX_POLICY_SPAN.total_seconds():
        raise InvalidSchedule(
            f"{name} must be more than 0 s and at most 366 days, not {value!r}", field=name
        )
    span = value if isinstance(value, timedelta) else timedelta(seconds=value)
    if span <= timedelta(0):  # a positive number of seconds below a microsecond
        raise InvalidSchedule(
            f"{name} must be more than 0 s and at most 366 days, not {value!r}", field=name
        )
    return span


def jitter_offset(run_id: str, jitter: timedelta) -> timedelta:
    """The offset of a run's send time: uniform in ``[0, jitter)``, a function of the run ID (P2).

    A hash, not a random draw: every beat, every restart and every re-send computes the same
    offset, and the run ID (with its nominal due time) stays what it is. Microsecond steps.
    """
    digest = hashlib.blake2b(run_id.encode(), digest_size=8).digest()
    fraction = int.from_bytes(digest, "big") / 2**64  # in [0, 1)
    steps = int(jitter / timedelta(microseconds=1))
    return timedelta(microseconds=min(int(fraction * steps), steps - 1))
