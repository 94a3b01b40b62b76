"""The run table in memory: :class:`~celery_durable.store.runs.RunStore`'s answers without SQL.

Rows are dicts with the SQL table's columns (``message`` kept as its JSON text), guarded by the
memory store's lock; every read returns copies.
"""

from __future__ import annotations

import builtins
import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from celery_durable.core.codec import dumps
from celery_durable.core.unit_of_work import WAKE_AGAIN_AFTER, SentRun, check_run_values
from celery_durable.message import Resend, message_json
from celery_durable.store.runs import (
    ACTIVE,
    CANCELLED,
    ENDED,
    FAULTED,
    FINISHED,
    MISSED,
    QUEUED,
    RUNNING,
    SUSPENDED,
)

Row = dict[str, Any]


def _resend(row: Row) -> Resend:
    return Resend.from_json(row["run_id"], row["task"], json.loads(row["message"] or "{}"))


class MemoryRunTable:
    """One row per durable run, in memory (D8, W4); the reads of ``RunStore``."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._rows: dict[str, Row] = {}

    # -- what units of work write (the store's lock is held) -----------------------------------

    def save(self, run_id: str, values: Mapping[str, Any], now: datetime) -> None:
        """Update the row of ``run_id`` or create it (insert-or-update)."""
        check_run_values(values)
        changed = dict(values)
        changed["updated_at"] = now
        if changed.get("message") is not None:
            changed["message"] = dumps(dict(changed["message"]))
        else:
            changed.pop("message", None)
        if changed.get("task") is None:
            changed.pop("task", None)
        row = self._rows.get(run_id)
        if row is None:
            row = self._rows[run_id] = {
                "run_id": run_id,
                "task": "",
                "status": RUNNING,
                "owner": None,
                "lease_until": None,
                "wake_at": None,
                "wake_after": None,
                "message": dumps(message_json((), {})),
            }
        row.update(changed)

    def add_sent(self, sent: Iterable[SentRun], now: datetime, lease: float) -> None:
        """Queued rows for runs just sent; existing rows stay."""
        for run in sent:
            self._insert_new(run.run_id, run.task, dumps(run.to_json()), now, lease)

    def _insert_new(
        self, run_id: str, task: str, message: str, now: datetime, lease: float
    ) -> bool:
        if run_id in self._rows:
            return False
        self._rows[run_id] = {
            "run_id": run_id,
            "task": task,
            "status": QUEUED,
            "owner": None,
            "lease_until": now + timedelta(seconds=lease),
            "wake_at": None,
            "wake_after": None,
            "updated_at": now,
            "message": message,
        }
        return True

    def waiting_row(self, run_id: str, now: datetime, lease: float) -> Row | None:
        """The row of ``run_id`` when it is suspended and not marked woken in the last
        ``WAKE_AGAIN_AFTER`` seconds: what the unit of work's ``wake`` may mark or count
        down (``store.runs.wake_row``)."""
        row = self._rows.get(run_id)
        if row is None or row["status"] != SUSPENDED:
            return None
        mark = row["lease_until"]
        if mark is not None and mark > now + timedelta(seconds=lease - WAKE_AGAIN_AFTER):
            return None
        return row

    def mark_woken(self, run_id: str, now: datetime, lease: float) -> None:
        """The write of the unit of work's ``wake`` (see ``store.runs.wake_row``)."""
        row = self._rows.get(run_id)
        if row is not None and row["status"] == SUSPENDED:
            row["lease_until"] = now + timedelta(seconds=lease)
            row["wake_after"] = None

    def count_down(self, run_id: str) -> None:
        """One child's end counted (the write of ``counting_down``)."""
        row = self._rows.get(run_id)
        if row is not None and (row.get("wake_after") or 0) > 1:
            row["wake_after"] -= 1

    def set_countdown(self, run_id: str, countdown: int) -> None:
        """The write of the unit of work's ``wait_for`` when it does not wake the run."""
        row = self._rows.get(run_id)
        if row is not None and row["status"] == SUSPENDED:
            row["wake_after"] = countdown

    def ended_count(self, run_ids: Iterable[str]) -> int:
        """How many of ``run_ids`` have ended (``store.runs.ENDED``)."""
        return sum(
            1 for rid in run_ids if (row := self._rows.get(rid)) is not None
            and row["status"] in ENDED
        )  # fmt: skip

    def message_of(self, run_id: str) -> Resend | None:
        """The stored message of ``run_id``'s row."""
        row = self._rows.get(run_id)
        return None if row is None else _resend(row)

    # -- RunStore's methods --------------------------------------------------------------------

    def record_sent(
        self,
        run_id: str,
        task: str,
        args: Any,
        kwargs: Any,
        *,
        now: datetime,
        lease: float,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """Note that a run's message was sent; a row that exists already is left alone."""
        message = dumps(message_json(args, kwargs, options))
        with self._lock:
            self._insert_new(run_id, task, message, now, lease)

    def _select(
        self, keep: Callable[[Row], bool], order: Callable[[Row], Any] | None = None
    ) -> builtins.list[Row]:
        with self._lock:
            found = [dict(row) for row in self._rows.values() if keep(row)]
        if order is not None:
            found.sort(key=order)
        return found

    def stale(self, now: datetime, *, limit: int = 100) -> builtins.list[Resend]:
        """Runs sent or claimed whose lease has passed without progress (D8), oldest first."""
        rows = self._select(
            lambda r: r["status"] in ACTIVE and r["lease_until"] is not None
            and r["lease_until"] <= now,
            lambda r: r["lease_until"],
        )  # fmt: skip
        return [_resend(row) for row in rows[:limit]]

    def queued(self, run_ids: Sequence[str]) -> builtins.list[Resend]:
        """The messages of those of ``run_ids`` that were sent and never claimed (status
        ``queued``), to send again (W10)."""
        wanted = set(run_ids)
        rows = self._select(lambda r: r["run_id"] in wanted and r["status"] == QUEUED)
        return [_resend(row) for row in rows]

    def wakeups(self, now: datetime, *, limit: int = 100) -> builtins.list[Resend]:
        """Suspended runs whose wake time has come (W4), earliest first."""
        rows = self._select(
            lambda r: r["status"] == SUSPENDED and r["wake_at"] is not None
            and r["wake_at"] <= now,
            lambda r: r["wake_at"],
        )  # fmt: skip
        return [_resend(row) for row in rows[:limit]]

    def _earliest(self, column: str, statuses: Sequence[str]) -> datetime | None:
        moments = [r[column] for r in self._select(lambda r: r["status"] in statuses)]
        return min((m for m in moments if m is not None), default=None)

    def next_wakeup(self) -> datetime | None:
        """The earliest wake time of a suspended run, or ``None``."""
        return self._earliest("wake_at", (SUSPENDED,))

    def next_resend(self) -> datetime | None:
        """The earliest wake time of a suspended run or lease end of an active one."""
        moments = [self._earliest("wake_at", (SUSPENDED,)), self._earliest("lease_until", ACTIVE)]
        found = [m for m in moments if m is not None]
        return min(found) if found else None

    def postpone(self, run_ids: Sequence[str], now: datetime, lease: float) -> None:
        """After re-sending runs: look at them again only if nothing happens for ``lease``."""
        later = now + timedelta(seconds=lease)
        with self._lock:
            for run_id in run_ids:
                row = self._rows.get(run_id)
                if row is None:
                    continue
                if row["status"] in ACTIVE:
                    row.update(lease_until=later, updated_at=now)
                elif row["status"] == SUSPENDED:
                    row.update(wake_at=later, updated_at=now)

    def mark_missed(self, run_id: str, task: str, now: datetime) -> bool:
        """End a queued (or unknown) run's row as missed (P1); whether this call ended it."""
        return self.mark_unstarted(run_id, task, now, MISSED)

    def mark_unstarted(self, run_id: str, task: str, now: datetime, status: str) -> bool:
        """End a queued (or unknown) run's row with ``status`` (``missed``, P1;
        ``failed_to_start``, P5); whether this call ended it."""
        values = {"status": status, "owner": None, "lease_until": None, "wake_at": None}
        with self._lock:
            row = self._rows.get(run_id)
            if row is not None:
                if row["status"] != QUEUED:
                    return False
                row.update(values, updated_at=now)
                return True
            self._rows[run_id] = {
                **values,
                "run_id": run_id,
                "task": task,
                "updated_at": now,
                "message": dumps(message_json((), {})),
            }
            return True

    def statuses(self, run_ids: Sequence[str]) -> dict[str, str]:
        """The ``status`` of each of these runs that has a row."""
        with self._lock:
            return {r: self._rows[r]["status"] for r in run_ids if r in self._rows}

    def rows(self, run_ids: Sequence[str] | None = None) -> dict[str, Row]:
        """The rows of these runs (every row when ``None``), by run ID."""
        with self._lock:
            ids = builtins.list(self._rows) if run_ids is None else run_ids
            return {r: dict(self._rows[r]) for r in ids if r in self._rows}

    def list(self, *, status: str | None = None, limit: int | None = None) -> builtins.list[Row]:
        """Rows of durable runs, most recently updated first (optionally of one status)."""
        rows = self._select(lambda r: status is None or r["status"] == status)
        rows.sort(key=lambda r: r["updated_at"], reverse=True)
        return rows if limit is None else rows[:limit]

    def ended(
        self, *, since: datetime | None = None, limit: int | None = None
    ) -> builtins.list[tuple[str, str]]:
        """``(run ID, task)`` of runs that ended, last ended first."""
        rows = self._select(
            lambda r: r["status"] in (FINISHED, FAULTED, CANCELLED)
            and (since is None or r["updated_at"] >= since)
        )  # fmt: skip
        rows.sort(key=lambda r: r["run_id"])
        rows.sort(key=lambda r: r["updated_at"], reverse=True)
        found = [(r["run_id"], r["task"]) for r in rows]
        return found if limit is None else found[:limit]

    def row(self, run_id: str) -> Row | None:
        """The row of one run as a dict, ``None`` when there is none."""
        with self._lock:
            found = self._rows.get(run_id)
            return None if found is None else dict(found)

    def resend_of(self, run_id: str) -> Resend | None:
        """The re-send of one run's stored message, ``None`` when it has no row."""
        found = self.row(run_id)
        return None if found is None else _resend(found)


__all__ = ["MemoryRunTable"]
