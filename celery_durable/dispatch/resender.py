"""Sending again the durable runs that stalled, and those whose sleep is over (D8, W4).

The run table answers both questions without reading a stream; a run is re-sent with its
stored message and the same task id, then postponed by the run lease so that it is not sent
again before a worker had the chance to claim it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from celery_durable.dispatch.publisher import connect_once, task_sendable
from celery_durable.store.stores import AnyRunTable

log = logging.getLogger("celery_durable.dispatcher")


class Resender:
    """Looks at the run table at most once per ``poll_interval`` and re-sends what is due."""

    def __init__(
        self,
        app: Any,
        runs: AnyRunTable,
        *,
        poll_interval: float,
        run_lease: float,
        mine: Callable[[str], bool] | None = None,
        limit: int = 100,
    ) -> None:
        self.limit = limit
        """Rows read per look; with partitions most belong to other beats."""
        self.app = app
        self.mine = mine
        """Whether a schedule is this dispatcher's to re-send (its partitions, D10)."""
        self.runs = runs
        self.poll_interval = poll_interval
        self.run_lease = run_lease
        self._next_check: datetime | None = None

    def share(self, partitions: int) -> None:
        """Read more rows per look when the journal has ``partitions`` partitions: most rows
        then belong to other beats (D10)."""
        self.limit = min(100 * partitions, 2000)

    def check_soon(self) -> None:
        """Look at the run table at the next :meth:`resend`, whatever the poll interval (a
        test clock jumps between calls)."""
        self._next_check = None

    def resend(self, now: datetime) -> None:
        """D8 and W4: send again durable runs that stalled, and those whose sleep is over."""
        if self._next_check is not None and now < self._next_check:
            return
        self._next_check = now + timedelta(seconds=self.poll_interval)
        limit = self.limit
        resends = self.runs.stale(now, limit=limit) + self.runs.wakeups(now, limit=limit)
        if self.mine is not None:
            mine = self.mine
            resends = [r for r in resends if mine(r.run_id.rpartition("@")[0])]
        if not resends:
            return
        sent: list[str] = []
        try:
            with self.app.producer_or_acquire() as producer:
                connect_once(producer)
                for resend in resends:
                    if not task_sendable(self.app, resend.task, resend.options):
                        continue  # D4: logged at the schedule's due times; the row waits
                    resend.send(self.app, retry=False, producer=producer)
                    sent.append(resend.run_id)
                    log.info(
                        "re-sent durable run %r", resend.run_id, extra={"run_id": resend.run_id}
                    )
        except Exception as exc:
            log.warning("could not re-send durable runs: %s: %s", type(exc).__name__, exc)
        self.runs.postpone(sent, now, self.run_lease)
