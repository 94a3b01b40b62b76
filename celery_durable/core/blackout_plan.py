"""Where a run really starts under blackout windows (P4). Pure.

No run starts inside a window. A run meets the windows twice:

* its **due time**, when it is decided: inside a window it is skipped (``skip``) or decided
  to be sent when the blackout is over (``defer``; one run per blackout);
* its **send moment**, when the dispatcher is about to hand it to the broker. That moment can
  be later than the due time — jitter (P2), a run held by ``Overlap.BUFFER_ONE``, a catch-up
  after downtime, a broker that was away, a deferral, a window added or extended after the run
  was decided — and it is checked again: inside a window, the run is skipped with the reason
  ``blackout <name>`` (``skip``) or its send waits until the blackout is over (``defer``).

Triggers and backfills (D9) are an operator's explicit request and are not held back.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery_durable.core.blackouts import Blackout, Blocked, blocking
from celery_durable.core.ids import run_id
from celery_durable.core.policies import jitter_offset


@dataclass(frozen=True, slots=True, kw_only=True)
class Fate:
    """What becomes of one due time of a schedule under its windows (P4, with P1 and P2)."""

    due: datetime
    starts: datetime | None
    """When its run is sent; ``None``: it does not run."""
    blackout: str | None = None
    """The window that skips or moves it; ``None`` when none does."""
    missed: bool = False
    """Moved past its start deadline (P1): recorded as missed, never sent."""
    deferred_to: datetime | None = None
    """The due time is inside a blackout and deferred to its end (``taken`` for the next)."""

    @property
    def moved(self) -> bool:
        """A window skips it or sends it later than it would be sent without windows."""
        return self.blackout is not None


def fate(
    schedule_id: str,
    due: datetime,
    windows: Sequence[Blackout],
    *,
    defer: bool,
    jitter: timedelta | None = None,
    deadline: timedelta | None = None,
    taken: Collection[datetime] = (),
) -> Fate:
    """The fate of a due time the rule gives, the run sent as soon as the policies allow.

    ``taken``: ends of blackouts a deferred run already waits for (a second due time inside
    the same blackout is skipped: one run per blackout). Overlap (D7) is not considered: it
    depends on when the runs before it end.
    """
    offset = timedelta(0) if jitter is None else jitter_offset(run_id(schedule_id, due), jitter)
    blocked = blocking(due, windows) if windows else None
    send, deferred_to = due + offset, None
    if blocked is not None:
        if not defer or blocked.ends is None or blocked.ends in taken:
            return Fate(due=due, starts=None, blackout=blocked.window.name)
        send, deferred_to = blocked.ends + offset, blocked.ends
    starts, at_send = send_moment(send, windows, defer=defer)
    window = blocked or at_send
    name = None if window is None else window.window.name
    if starts is not None and deadline is not None and starts >= due + deadline:
        return Fate(due=due, starts=None, blackout=name, missed=True, deferred_to=deferred_to)
    return Fate(due=due, starts=starts, blackout=name, deferred_to=deferred_to)


def send_moment(
    moment: datetime, windows: Sequence[Blackout], *, defer: bool
) -> tuple[datetime | None, Blocked | None]:
    """Where a send planned for ``moment`` happens: ``moment`` itself outside every window;
    inside one, the end of the blackout (``defer``; the end is outside every window) or never
    (``skip``, or a blackout that never ends). The second value is the blackout, if any."""
    blocked = blocking(moment, windows) if windows else None
    if blocked is None:
        return moment, None
    if defer and blocked.ends is not None:
        return blocked.ends, blocked
    return None, blocked


__all__ = ["Fate", "fate", "send_moment"]
