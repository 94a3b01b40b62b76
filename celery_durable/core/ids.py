"""Schedule IDs, run IDs and idempotency keys (SPEC S1, S2, S4).

A run ID is ``<schedule id>@<due time in UTC with 7 fractional digits>Z``. It is the Celery task
id of the run's message and the key of the run's journal, so it must fit the journal's 255
character stream column after escaping: hence the 205-character budget of S1.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from datetime import datetime, timezone
from urllib.parse import quote

from celery_durable.core.codec import cached_for_datetimes
from celery_durable.errors import InvalidSchedule

MAX_ID_LENGTH = 200
"""The longest schedule ID, in characters (S1)."""

SHOWN_ID_LENGTH = 80
"""Characters of a user's value repeated in a message; longer ones are cut with a note."""


def shown(text: object, whole_up_to: int = SHOWN_ID_LENGTH) -> str:
    """``text`` quoted for a message (``repr``): whole up to ``whole_up_to`` characters, else
    its first :data:`SHOWN_ID_LENGTH` and its length. A mistyped 100,000-character value is
    named, not echoed back in full."""
    value = str(text)
    if len(value) <= whole_up_to:
        return repr(value)
    return f"{value[:SHOWN_ID_LENGTH]!r}… ({len(value):,} characters)"


MAX_ESCAPED_LENGTH = 205
"""The most characters the escaped task name and escaped schedule ID may take together (S1)."""

_RUN_ID_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{7})Z")


def escape(text: str) -> str:
    """RFC 3986 percent-encoding of UTF-8, keeping only ``A-Z a-z 0-9 - _ . ~``."""
    return quote(text, safe="")


def check_text(value: object, what: str, *, max_length: int = 255, rule: str | None = None) -> str:
    """Return ``value`` when it is a storable, non-blank ``str``; raise ``InvalidSchedule``
    (with ``rule``, the SPEC rule broken, as its attribute when given)."""
    fields = {"rule": rule} if rule else {}
    if not isinstance(value, str):
        raise InvalidSchedule(f"{what} must be a str, not {type(value).__name__}", **fields)
    if not value.strip():
        raise InvalidSchedule(f"{what} must not be blank", **fields)
    if len(value) > max_length:
        raise InvalidSchedule(
            f"{what} has {len(value)} characters; at most {max_length} allowed", **fields
        )
    if "\x00" in value:
        raise InvalidSchedule(
            f"{what} contains a NUL character, which databases cannot store", **fields
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSchedule(f"{what} is not valid Unicode (lone surrogate)", **fields) from None
    return value


def first_control(text: str) -> str | None:
    """The first control or format character of ``text`` (Unicode Cc or Cf), else ``None``.

    Newlines forge log lines, ESC sequences drive terminals and U+202E reverses what a reader
    sees: none of them belongs in an identifier (S1).
    """
    if text.isprintable():  # no Cc or Cf is printable: the common case in one C-level scan
        return None
    for char in text:
        if unicodedata.category(char) in ("Cc", "Cf"):
            return char
    return None


def printable(text: str, *, keep: str = "") -> str:
    """``text`` with every control and format character (Unicode Cc, Cf) written as an escape.

    What reaches a terminal or a log line goes through this: an ESC sequence in stored data or
    a setting cannot recolour or clear the screen, a newline cannot forge a second log line, a
    U+202E cannot reverse a line. ``keep`` lists characters left as they are (the newlines
    between lines of output).
    """
    if text.isprintable():  # the common case costs one C-level scan
        return text
    return "".join(
        repr(c)[1:-1] if c not in keep and unicodedata.category(c) in ("Cc", "Cf") else c
        for c in text
    )


def check_schedule_id(
    schedule_id: object, task_name: str | None = None, *, stored: bool = False
) -> str:
    """Validate a schedule ID against S1 and return it.

    Raises ``InvalidSchedule`` naming the broken rule: blank, ``~``, a control or format
    character, leading or trailing whitespace, longer than ``MAX_ID_LENGTH``, or escaped task
    name plus escaped ID above ``MAX_ESCAPED_LENGTH``. With ``stored=True`` (reading, pausing
    or deleting a schedule that exists) the character checks added to S1 on 2026-12-03 are left
    out, so that an ID stored before them can still be read and deleted.
    """
    if isinstance(schedule_id, str) and len(schedule_id) > MAX_ID_LENGTH:
        raise InvalidSchedule(
            f"schedule ID has {len(schedule_id)} characters; at most {MAX_ID_LENGTH} allowed",
            rule="S1",
        )
    sid = check_text(schedule_id, "schedule ID", max_length=MAX_ID_LENGTH, rule="S1")
    if "~" in sid:
        raise InvalidSchedule("schedule ID must not contain '~'", rule="S1")
    control = None if stored else first_control(sid)
    if control is not None:
        raise InvalidSchedule(
            f"schedule ID must not contain control or format characters "
            f"(found {control!r} at position {sid.index(control)})",
            rule="S1",
        )
    if not stored and sid != sid.strip():
        raise InvalidSchedule("schedule ID must not start or end with whitespace", rule="S1")
    if task_name is not None:
        used = len(escape(task_name)) + len(escape(sid))
        if used > MAX_ESCAPED_LENGTH:
            raise InvalidSchedule(
                f"escaped task name and escaped schedule ID take {used} characters; "
                f"at most {MAX_ESCAPED_LENGTH} allowed",
                rule="S1",
            )
    return sid


_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9._-]+")

MAPPED_PREFIX_LENGTH = 40
"""How many characters of a sanitised entry name a mapped schedule ID keeps."""


def _valid_as_is(name: str, task_name: str | None) -> bool:
    """Whether ``name`` is a schedule ID under every clause of S1."""
    if name != name.strip() or any(unicodedata.category(c) in ("Cc", "Cf") for c in name):
        return False
    try:
        check_schedule_id(name, task_name)
    except InvalidSchedule:
        return False
    return True


def schedule_id_for_name(name: object, task_name: str | None = None) -> str:
    """The schedule ID of an entry name from ``beat_schedule`` or an importer (SPEC B1, I1).

    A name that is a valid schedule ID (S1, checked with ``task_name`` when given) is its own
    ID. Any other name maps to ``<prefix>-<hash>``: the name with every run of characters
    outside ``A-Z a-z 0-9 . _ -`` replaced by one ``-``, trimmed of ``-`` at both ends and cut
    to 40 characters (``entry`` when nothing is left), then ``-`` and the first 16 hex digits
    of the SHA-256 of the name's UTF-8 bytes. The result depends on the name alone, is the
    same on every start and in every importer, and two names give two IDs (the hash covers
    the whole name). It is at most 57 characters, none of which escaping lengthens.

    >>> schedule_id_for_name("nightly-report")
    'nightly-report'
    >>> schedule_id_for_name("report ~ weekly")
    'report-weekly-d1908fbd561ce33e'
    """
    text = name if isinstance(name, str) else str(name)
    if _valid_as_is(text, task_name):
        return text
    prefix = _UNSAFE_RUN.sub("-", text).strip("-")[:MAPPED_PREFIX_LENGTH].rstrip("-") or "entry"
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{prefix}-{digest}"


def to_utc(moment: datetime, what: str = "time") -> datetime:
    """An aware datetime converted to UTC; a naive one raises ``InvalidSchedule`` (R8)."""
    if not isinstance(moment, datetime):
        raise InvalidSchedule(f"{what} must be a datetime, not {type(moment).__name__}")
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidSchedule(f"{what} must be an aware datetime (it has no time zone)")
    try:
        return moment.astimezone(timezone.utc)
    except OverflowError:
        from celery_durable.core.limits import RANGE_TEXT

        raise InvalidSchedule(f"{what} {moment.isoformat()} is outside {RANGE_TEXT}") from None


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
            f"{text!r} is not a due time of the form YYYY-MM-DDTHH:MM:SS.fffffffZ", rule="S2"
        )
    year, month, day, hour, minute, second, fraction = match.groups()
    if not fraction.endswith("0"):
        raise InvalidSchedule(f"{text!r} has a precision below one microsecond", rule="S2")
    try:
        return datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second),
            int(fraction) // 10, tzinfo=timezone.utc,
        )  # fmt: skip
    except ValueError as exc:
        raise InvalidSchedule(f"{text!r} is not a valid time: {exc}", rule="S2") from None


def run_id(schedule_id: str, due: datetime) -> str:
    """The run ID of a schedule's due time (S2), e.g. ``nightly@2026-11-16T01:00:00.0000000Z``."""
    return f"{schedule_id}@{format_due(due)}"


def parse_run_id(text: str) -> tuple[str, datetime]:
    """Split a run ID into schedule ID and aware UTC due time; ``InvalidSchedule`` if malformed."""
    if not isinstance(text, str) or "@" not in text:
        raise InvalidSchedule(f"{text!r} is not a run ID (<schedule>@<due UTC>)", rule="S2")
    schedule_id, _, due = text.rpartition("@")
    check_schedule_id(schedule_id, stored=True)
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
