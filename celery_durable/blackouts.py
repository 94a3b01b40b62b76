"""``durable.blackouts``: the blackout windows every schedule honours (P4), kept in the journal.

The global list is the stream ``settings/blackouts``; each ``BlackoutsSet`` event holds the
whole list from then on. Any process may set it; a running dispatcher reads what was appended
to the stream since its last read each time it is about to decide or send a run (one indexed
read of a short stream), so a window stored before that moment is honoured.
``durable_blackouts`` in the app's settings (``DurableConfig.blackouts``) is brought into the
journal when beat starts (:func:`import_setting`), as ``beat_schedule`` is, and by the
dispatcher core at its first tick (``durable.dispatcher()`` without beat).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from celery_durable.core.audit import check_audit
from celery_durable.core.blackouts import Blackout, check_windows
from celery_durable.core.global_blackouts import (
    GLOBAL_STREAM,
    BlackoutsChange,
    changes_of,
    global_windows,
    set_event,
)
from celery_durable.errors import InvalidSchedule
from celery_durable.store.conflicts import retry_on_conflict

if TYPE_CHECKING:
    from celery_durable.core.journal import Journal
    from celery_durable.runtime import Runtime

log = logging.getLogger("celery_durable.blackouts")

SETTING = "durable_blackouts"


class GlobalBlackouts:
    """Read and replace the global blackout windows. Reach it as ``durable.blackouts``.

    >>> durable.blackouts.set([Blackout.between("freeze", start, end)], reason="year end")
    """

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def get(self) -> tuple[Blackout, ...]:
        """The global windows as the journal holds them now (empty when never set)."""
        found = global_windows(self._runtime.journal.read_stream(GLOBAL_STREAM))
        return () if found is None else found

    def set(
        self,
        windows: Iterable[Blackout],
        *,
        by: str | None = None,
        reason: str | None = None,
    ) -> bool:
        """Make ``windows`` the global list; ``False`` when it already was (nothing stored).

        Raises ``InvalidSchedule`` for something that is not a list of ``Blackout`` or for a
        name given twice, before anything is stored. ``by``, ``reason``: who and why (O5).
        """
        checked = check_windows(windows)
        check_audit(by, reason)
        journal = self._runtime.journal

        def attempt() -> bool:
            stored = journal.read_stream(GLOBAL_STREAM)
            if (global_windows(stored) or ()) == checked and stored:
                return False
            version = stored[-1].version if stored else 0
            event = set_event(checked, self._runtime.now(), by, reason)
            journal.append(GLOBAL_STREAM, version, [event])
            return True

        return retry_on_conflict(attempt, what="the global blackout windows")

    def history(self) -> list[BlackoutsChange]:
        """Every change of the global windows, newest first: when, who, why (O5), the list."""
        return changes_of(self._runtime.journal.read_stream(GLOBAL_STREAM))[::-1]

    def clear(self, *, by: str | None = None, reason: str | None = None) -> bool:
        """Remove every global window; ``False`` when there was none."""
        if not self.get():
            return False
        return self.set((), by=by, reason=reason)


class BlackoutWatch:
    """The dispatcher's copy of the global windows, brought up to date before each decision."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._version = 0
        self._windows: tuple[Blackout, ...] = ()

    def current(self, now: datetime) -> tuple[Blackout, ...]:
        """The global windows as the journal holds them now (the events stored since the
        last call are read and folded; none stored: one read that finds nothing)."""
        tail = self._journal.read_stream(GLOBAL_STREAM, after_version=self._version)
        if not tail:
            return self._windows
        self._version = tail[-1].version
        try:
            found = global_windows(tail)
        except InvalidSchedule as exc:  # written by a newer version: keep what we had
            log.error("cannot read the global blackout windows: %s", exc)
            found = None
        if found is not None:
            if found != self._windows:
                log.info("global blackout windows: %s", _names(found))
            self._windows = found
        return self._windows


def _names(windows: tuple[Blackout, ...]) -> str:
    return ", ".join(w.name for w in windows) or "none"


def import_setting(runtime: Runtime) -> bool:
    """Bring ``durable_blackouts`` into the journal (at beat start, at a dispatcher's first
    tick); ``True`` when it changed.

    Unset, the journal's list is left as it is (managed with ``durable.blackouts`` and the
    CLI). Set, it replaces the journal's list, as ``beat_schedule`` entries replace theirs.
    The setting is read and checked with the others (``DurableConfig.blackouts``).
    """
    windows = runtime.config.blackouts
    if windows is None:
        return False
    changed = GlobalBlackouts(runtime).set(windows, by="beat", reason=f"{SETTING} setting")
    if changed:
        log.info("%s imported: %s", SETTING, _names(windows))
    return changed


__all__ = ["SETTING", "BlackoutWatch", "GlobalBlackouts", "import_setting"]
