"""Closed sets of choices a schedule carries: catch-up (C1–C3) and overlap (D7)."""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

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
