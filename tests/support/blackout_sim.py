"""A dispatcher in miniature over the pure schedule aggregate, for blackout tests (P4).

At each tick it does what :class:`celery_durable.dispatch.dispatcher.Dispatcher` does with one
schedule: end the tracked runs whose work is over (``RunEnded``, as the worker records it),
ask the aggregate (``DecideDue``, with the global windows), then start every run whose send
moment has come (``RunStarted`` at the tick). A broker that is away is a set of ticks at which
nothing is started. Events go through their JSON form, as through the journal.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery_durable.core.blackouts import Blackout
from celery_durable.core.schedule_aggregate import (
    Create,
    DecideDue,
    MarkEnded,
    MarkStarted,
    ScheduleState,
    decide,
    fold_all,
)
from celery_durable.core.schedule_events import (
    Content,
    RunDecided,
    RunMissed,
    RunSent,
    RunSkipped,
    RunsMissed,
    from_data,
    to_data,
)


@dataclass
class Sim:
    """One schedule driven tick by tick; ``starts`` maps a due time to its start moment."""

    content: Content
    created: datetime
    run_for: timedelta = timedelta(minutes=3)
    """How long a started run works before its end is recorded (overlap policies)."""
    schedule_id: str = "s"
    state: ScheduleState = field(init=False)
    events: list[Any] = field(default_factory=list)
    starts: dict[datetime, datetime] = field(default_factory=dict)
    ends: dict[datetime, datetime] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.state = ScheduleState(schedule_id=self.schedule_id)
        self.do(Create(content=self.content, now=self.created))

    def do(self, command: Any) -> list[Any]:
        made = decide(self.state, command)
        events = [from_data(e.TYPE, to_data(e)) for e in made]
        self.state = fold_all(self.state, events)
        self.events += events
        return events

    def tick(
        self, now: datetime, windows: tuple[Blackout, ...] = (), *, broker_up: bool = True
    ) -> None:
        for due, end in sorted(self.ends.items()):
            if end <= now and due in self.state.running:
                self.do(MarkEnded(due=due, outcome="finished", now=now))
        self.do(DecideDue(now=now, blackouts=windows))
        if not broker_up:
            return
        for pending in self.state.sendable():
            if pending.send_time <= now:
                self.do(MarkStarted(due=pending.due, now=now))
                self.starts[pending.due] = now
                if pending.track_end:
                    self.ends[pending.due] = now + self.run_for

    def run(
        self,
        moments: Iterable[datetime],
        windows: tuple[Blackout, ...] = (),
        down: frozenset[datetime] = frozenset(),
    ) -> Sim:
        for now in moments:
            self.tick(now, windows, broker_up=now not in down)
        return self

    # What became of each due time ----------------------------------------------------------

    def outcomes(self) -> dict[datetime, tuple[Any, ...]]:
        """What became of each due time (:func:`outcomes`)."""
        return outcomes(self.events)

    def dropped(self) -> list[tuple[datetime, int | None]]:
        """The catch-up policy's drops (``RunsMissed``): through which due time, how many."""
        return [(e.through, e.count) for e in self.events if isinstance(e, RunsMissed)]

    def decided(self) -> list[RunDecided]:
        return [e for e in self.events if isinstance(e, RunDecided)]


def outcomes(events: Iterable[Any]) -> dict[datetime, tuple[Any, ...]]:
    """Each due time a schedule's events settle: ``("started", moment)``, ``("skipped",
    reason)``, ``("missed",)`` or ``("waiting",)`` (decided, not sent yet)."""
    found: dict[datetime, tuple[Any, ...]] = {}
    for event in events:
        if isinstance(event, RunDecided):
            found[event.due] = ("waiting",)
        elif isinstance(event, RunSkipped):
            found[event.due] = ("skipped", event.reason)
        elif isinstance(event, RunMissed):
            found[event.due] = ("missed",)
        elif isinstance(event, RunSent):
            found[event.due] = ("started", event.at)
    return found


def inside(moment: datetime, windows: Iterable[Blackout]) -> bool:
    """Whether a window covers ``moment``."""
    return any(w.covering(moment) is not None for w in windows)
