"""Schedule IDs, run IDs and idempotency keys (SPEC S1, S2, S4).

A run ID is ``<schedule id>@<due time in UTC with 7 fractional digits>Z``. It is the Celery task
id of the run's message and the key of the run's journal, so it must fit the journal's 255
character stream column after escaping: hence the 205-character budget of S1.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from urllib.parse import quote

from celery_durable.core.codec import cached_for_datetimes
from celery_durable.errors import InvalidSchedule

MAX_ID_LENGTH = 200
"""The longest schedule ID, in characters (S1)."""

MAX_ESCAPED_LENGTH = 205
"""The most characters the escaped task name and escaped schedule ID may take together (S1)."""

_RUN_ID_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{7})Z")


def escape(text: str) -> str:
    """RFC 3986 percent-encoding of UTF-8, keeping only ``A-Z a-z 0-9 - _ . ~``."""
    return quote(text, safe="")


def check_text(value: object, what: str, *, max_length: int = 255) -> str:
    """Return ``value`` when it is a storable, non-blank ``str``; raise ``InvalidSchedule``."""
    if not isinstance(value, str):
        raise InvalidSchedule(f"{what} must be a str, not {type(value).__name__}")
    if not value.strip():
        raise InvalidSchedule(f"{what} must not be blank")
    if len(value) > max_length:
        raise InvalidSchedule(f"{what} has {len(value)} characters; at most {max_length} allowed")
    if "\x00" in value:
        raise InvalidSchedule(f"{what} contains a NUL character, which databases cannot store")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSchedule(f"{what} is not valid Unicode (lone surrogate)") from None
    return value


def check_schedule_id(schedule_id: object, task_name: str | None = None) -> str:
    """Validate a schedule ID against S1 and return it.

    Raises ``InvalidSchedule`` naming the broken rule: blank, ``~``, longer than
    ``MAX_ID_LENGTH``, or escaped task name plus escaped ID above ``MAX_ESCAPED_LENGTH``.
    """
    if isinstance(schedule_id, str) and len(schedule_id) > MAX_ID_LENGTH:
        raise InvalidSchedule(
            f"S1: schedule ID has {len(schedule_id)} characters; at most {MAX_ID_LENGTH} allowed",
            rule="S1",
        )
    sid = check_text(schedule_id, "S1: schedule ID", max_length=MAX_ID_LENGTH)
    if "~" in sid:
        raise InvalidSchedule("S1: schedule ID must not contain '~'", rule="S1")
    if task_name is not None:
        used = len(escape(task_name)) + len(escape(sid))
        if used > MAX_ESCAPED_LENGTH:
            raise InvalidSchedule(
                f"S1: escaped task name and escaped schedule ID take {used} characters; "
                f"at most {MAX_ESCAPED_LENGTH} allowed",
                rule="S1",
            )
    return sid


def to_utc(moment: datetime, what: str = "time") -> datetime:
    """An aware datetime converted to UTC; a naive one raises ``InvalidSchedule`` (R8)."""
    if not isinstance(moment, datetime):
        raise InvalidSchedule(f"{what} must be a datetime, not {type(moment).__name__}")
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidSchedule(f"{what} must be an aware datetime (it has no time zone)")
    return moment.astimezone(timezone.utc)


@cached_for_datetimes
def format_due(due: datetime) -> str:
    """A due time as ``YYYY-MM-DDTHH:MM:SS.fffffffZ`` (UTC, 7 fractional digits)."""
    utc = to_utc(due, "due time")
    return utc.replace(tzinfo=None).isoformat(timespec="microseconds") + "0Z"


def parse_due(text: str) -> datetime:
    """The aware UTC datetime of a due time written by :func:`format_due`."""
    match = _RUN_ID_TIME.fullmatch(text)
    if match is None:
        raise InvalidSchedule(
            f"S2: {text!r} is not a due time of the form YYYY-MM-DDTHH:MM:SS.fffffffZ"
        )
    year, month, day, hour, minute, second, fraction = match.groups()
    if not fraction.endswith("0"):
        raise InvalidSchedule(f"S2: {text!r} has a precision below one microsecond")
    try:
        return datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second),
            int(fraction) // 10, tzinfo=timezone.utc,
        )  # fmt: skip
    except ValueError as exc:
        raise InvalidSchedule(f"S2: {text!r} is not a valid time: {exc}") from None


def run_id(schedule_id: str, due: datetime) -> str:
    """The run ID of a schedule's due time (S2), e.g. ``nightly@2026-11-16T01:00:00.0000000Z``."""
    return f"{schedule_id}@{format_due(due)}"


def parse_run_id(text: str) -> tuple[str, datetime]:
    """Split a run ID into schedule ID and aware UTC due time; ``InvalidSchedule`` if malformed."""
    if not isinstance(text, str) or "@" not in text:
        raise InvalidSchedule(f"S2: {text!r} is not a run ID (<schedule>@<due UTC>)")
    schedule_id, _, due = text.rpartition("@")
    check_schedule_id(schedule_id)
    return schedule_id, parse_due(due)


def idempotency_key(task_name: str, run: str, position: str | int) -> str:
    """The idempotency key of a step (S4): ``<task>/<run ID>/<position>``."""
    return f"{task_name}/{run}/{position}"


def schedule_stream(schedule_id: str) -> str:
    """The journal stream holding a schedule's events."""
    return f"schedule/{schedule_id}"


def run_stream(run: str) -> str:
    """The journal stream holding a durable run's events."""
    return f"run/{run}"
