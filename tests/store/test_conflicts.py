"""The one decide → append → retry-on-conflict loop (A8): limit, re-read, back-off."""

from __future__ import annotations

import pytest

from celery_durable.errors import AppendConflict, DurableError
from celery_durable.store import conflicts
from celery_durable.store.conflicts import (
    BACKOFF_CAP,
    CONFLICT_ATTEMPTS,
    ConflictCount,
    backoff,
    retry_on_conflict,
)


def test_retries_after_rereading_until_the_append_goes_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conflicts.time, "sleep", lambda _s: None)
    calls: list[str] = []

    def attempt() -> str:
        calls.append("attempt")
        if calls.count("attempt") < 3:
            raise AppendConflict("taken", stream="s", expected_version=1)
        return "stored"

    assert retry_on_conflict(attempt, reread=lambda: calls.append("reread"), what="s") == "stored"
    assert calls == ["attempt", "reread", "attempt", "reread", "attempt"]


def test_gives_up_after_the_limit_with_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(conflicts.time, "sleep", slept.append)
    attempts = 0

    def attempt() -> None:
        nonlocal attempts
        attempts += 1
        raise AppendConflict("taken", stream="s", expected_version=1)

    with pytest.raises(DurableError, match="schedule 'x': too many concurrent writers"):
        retry_on_conflict(attempt, what="schedule 'x'")
    assert attempts == CONFLICT_ATTEMPTS
    assert len(slept) < CONFLICT_ATTEMPTS and all(0 < s <= BACKOFF_CAP for s in slept)


def test_a_reread_may_stop_the_loop() -> None:
    class Stop(Exception):
        pass

    def attempt() -> None:
        raise AppendConflict("taken", stream="s", expected_version=1)

    def reread() -> None:
        raise Stop

    with pytest.raises(Stop):
        retry_on_conflict(attempt, reread=reread, what="s")


def test_backoff_is_none_at_first_then_bounded() -> None:
    assert backoff(1) == 0.0
    for n in range(2, 60):
        assert 0.0 <= backoff(n) <= min(BACKOFF_CAP, 0.001 * 2.0 ** (n - 1))


def test_a_batch_counts_conflicts_per_stream_with_the_same_limit_and_back_off() -> None:
    """The dispatcher's batch: each stream has the limit of retry_on_conflict, and the same
    pauses (none after the first conflict); one stream's conflicts spend nothing of another's."""
    slept: list[float] = []
    count = ConflictCount(sleep=slept.append)
    assert count.another("a") and slept == []
    tries = 1
    while count.another("a"):
        tries += 1
    assert tries == CONFLICT_ATTEMPTS - 1  # the CONFLICT_ATTEMPTS-th conflict gives up
    assert len(slept) == CONFLICT_ATTEMPTS - 2 and all(0 <= p <= BACKOFF_CAP for p in slept)
    assert count.another("b")  # another stream starts from its own first conflict
    assert not count.another("a")
