"""Which due times a backfill decides, and why it decides none (SPEC D9). Pure.

A backfill decides the rule's due times in ``[start, end]`` that the rule has already passed
(up to the schedule's cursor and now) and that were never decided. When it decides nothing,
"0 run(s) decided" alone leaves the user guessing: :func:`why_nothing` says which of the
reasons it was — a range in the future, a range before an ``Every`` schedule's first due
time, due times still the dispatcher's, no due time of the rule in the range, or every due
time decided (or removed by retention) already.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime, timedelta, timezone
from itertools import islice

from celery_durable.core.catchup import due_times
from celery_durable.core.rules import Every, Rule
from celery_durable.errors import InvalidSchedule

UTC = timezone.utc

MAX_BACKFILL = 10_000
"""A backfill deciding more due times than this is refused."""


class Backfilled(list[str]):
    """The run IDs a backfill decided, oldest first: a ``list``, as before, plus ``reason``.

    ``reason`` says in words why nothing was decided (``None`` when something was).
    """

    reason: str | None

    def __init__(self, run_ids: Iterable[str] = (), reason: str | None = None) -> None:
        super().__init__(run_ids)
        self.reason = reason


def backfill_due_times(
    rule: Rule, start: datetime, end: datetime, anchor: datetime | None, limit: int
) -> list[datetime]:
    """The rule's due times in ``[start, end]``; ``InvalidSchedule`` past ``limit`` of them."""
    found = list(islice(due_times(rule, start - timedelta(microseconds=1), end, anchor), limit + 1))
    if len(found) > limit:
        raise InvalidSchedule(f"backfill covers more than {limit} due times; split the range")
    return found


def _text(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def why_nothing(
    *,
    rule: Rule,
    anchor: datetime | None,
    start: datetime,
    end: datetime,
    now: datetime,
    until: datetime,
    found: Collection[datetime],
    decided: Collection[datetime],
    floor: datetime | None,
) -> str:
    """Why a backfill of ``[start, end]`` decides no due time, in one sentence.

    ``until`` is where the backfill stops (the earliest of ``end``, ``now`` and the
    schedule's cursor); ``found`` the rule's due times in ``[start, until]``; ``decided``
    those decided already; ``floor`` the latest due time whose records retention removed.
    """
    if start > now:
        return (
            f"the range starts at {_text(start)}, after now ({_text(now)}): due times still to "
            "come are the dispatcher's, decided when they are due"
        )
    if isinstance(rule, Every) and anchor is not None:
        first_due = rule.next_after(anchor, anchor=anchor)
        if first_due is not None and end < first_due:
            return (
                f"the range ends before the schedule's first due time {_text(first_due)}: an "
                "Every rule is due one interval after its anchor, the schedule's creation or "
                f"last change ({_text(anchor)})"
            )
    if start > until:
        return (
            f"the range starts after {_text(until)}, as far as the dispatcher has decided: "
            "later due times are the dispatcher's (its catch-up policy decides them)"
        )
    if not found:
        later = f" (due times after {_text(until)} are the dispatcher's)" if until < end else ""
        return f"the rule has no due time from {_text(start)} to {_text(until)}{later}"
    pruned = [due for due in found if due not in decided and floor is not None and due <= floor]
    text = f"all {len(found)} due time(s) of the range were decided already"
    if pruned and floor is not None:
        text += f" ({len(pruned)} of them recorded up to {_text(floor)}, removed by retention)"
    return text + " (repeating a backfill adds nothing)"


__all__ = ["MAX_BACKFILL", "Backfilled", "backfill_due_times", "why_nothing"]
