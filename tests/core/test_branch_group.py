"""The pure bookkeeping of a group call (W9), driven directly by Hypothesis.

:class:`~celery_durable.core.branches.Group` is what one delivery knows about one
``parallel``/``gather``/``race`` call. These tests play deliveries with it and no thread: each
branch follows a script of steps that succeed or fail, any interleaving of "a branch reaches
its next position" and "a branch's step in flight ends" is drawn, the journal is a dict, and a
delivery may crash after any action. Then a second delivery replays from what was stored, in
another interleaving. What must hold: positions are the branch's own (S4), one failure stops
the group and only the first is stored, nothing starts after a stop, a replay starts no step
with a stored result (W2), starts nothing at all in a group the first delivery finished or
stopped, and ends the call the same way; a race has one winner and replays it alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_durable.core.branches import (
    ABANDONED,
    FAILED,
    GATHER,
    HALTED,
    PARALLEL,
    RACE,
    VALUE,
    Group,
    branch_position,
    calls_of,
    group_name,
    legacy_stopped,
    to_raise,
)

pytestmark = pytest.mark.timeout(120)


@dataclass
class Journal:
    results: dict[str, str] = field(default_factory=dict)
    """Stored step outcomes by position: ``ok`` or ``fail``."""
    stop: int | None = None
    winner: int | None = None


class Delivery:
    """One delivery of the call at position 3, playing the branches' scripts."""

    def __init__(self, kind: str, scripts: list[list[str]], journal: Journal) -> None:
        self.kind = kind
        self.scripts = scripts
        self.journal = journal
        self.group = Group.begin(
            3, kind, len(scripts), stored_stop=journal.stop, stored_winner=journal.winner
        )
        n = len(scripts)
        self.cursor = [0] * n
        self.flying: list[str | None] = [None] * n
        self.ends: list[str | None] = [None] * n
        self.started: list[str] = []
        self.stops = 0
        if kind == RACE and journal.winner is not None:
            # A race with a stored winner replays that branch alone.
            for b in range(n):
                if b != journal.winner:
                    self.ends[b] = ABANDONED

    def active(self) -> list[int]:
        return [b for b, end in enumerate(self.ends) if end is None]

    def act(self, b: int) -> None:
        group = self.group
        flying = self.flying[b]
        if flying is not None:
            self.flying[b] = None
            if group.refuses_writes:  # a lost race: the result is not stored
                self.ends[b] = ABANDONED
                return
            outcome = self.scripts[b][self.cursor[b] - 1]
            self.journal.results[flying] = outcome
            if outcome == "fail":
                self.end(b, FAILED)
            return
        if self.cursor[b] == len(self.scripts[b]):
            self.end(b, VALUE)
            return
        position = group.take(b)
        assert position == branch_position(3, b, self.cursor[b]) == f"3.{b}.{self.cursor[b]}"
        self.cursor[b] += 1
        stored = self.journal.results.get(position)
        if not group.may_start(stored is not None):
            assert group.stopped
            self.ends[b] = ABANDONED
            return
        if stored == "fail":
            self.end(b, FAILED)
        elif stored is None:
            assert not group.stopped, "a step starts in a stopped group"
            self.started.append(position)
            self.flying[b] = position

    def end(self, b: int, how: str) -> None:
        self.ends[b] = how
        if self.group.ended(b):
            assert self.kind == RACE and self.journal.winner in (None, b)
            self.journal.winner = b
        if how == FAILED and self.group.failed(b):
            self.stops += 1
            assert self.group.stopped and self.group.stopped_by == b
            self.journal.stop = b

    def play(self, choices: list[int], crash_after: int | None) -> bool:
        """Act in the order ``choices`` picks among the active branches; ``True`` when every
        branch ended (``False``: crashed first)."""
        for count, choice in enumerate(choices):
            if crash_after is not None and count >= crash_after:
                return False
            active = self.active()
            if not active:
                return True
            self.act(active[choice % len(active)])
        while self.active():
            if crash_after is not None:
                return False
            self.act(self.active()[0])
        return True

    def outcome(self) -> tuple[str, int | None]:
        """What the call returns or raises: the race's winner's end, else :func:`to_raise`."""
        if self.kind == RACE:
            winner = self.group.winner
            return ("winner", winner) if winner is None else (str(self.ends[winner]), winner)
        index = to_raise([str(end) for end in self.ends])
        return ("values", None) if index is None else (str(self.ends[index]), index)


CALLS = st.tuples(
    st.sampled_from([PARALLEL, GATHER, RACE]),
    st.lists(st.lists(st.sampled_from(["ok", "fail"]), max_size=3), min_size=1, max_size=4),
)
ORDER = st.lists(st.integers(0, 7), max_size=40)


@given(call=CALLS, first=ORDER, second=ORDER, crash=st.none() | st.integers(0, 30))
def test_a_replay_in_another_order_starts_nothing_new_and_ends_the_same(
    call: Any, first: list[int], second: list[int], crash: int | None
) -> None:
    kind, scripts = call
    journal = Journal()
    one = Delivery(kind, scripts, journal)
    finished = one.play(first, crash)
    assert one.stops <= 1, "only the first failure stops the group"
    stored = dict(journal.results)
    stop, winner = journal.stop, journal.winner
    two = Delivery(kind, scripts, journal)
    assert two.play(second, None)
    assert not set(two.started) & set(stored), "a stored step started again (W2)"
    if finished or stop is not None or winner is not None:
        assert two.started == [], "the replay started a step the first delivery did not"
    if finished:
        assert two.outcome() == one.outcome()
    if stop is not None:
        assert two.group.stopped_by == stop and journal.stop == stop
        assert two.outcome()[0] == FAILED, "the stopping branch's failure is raised again"
    if winner is not None:
        assert two.group.winner == winner and two.outcome()[1] == winner
    # A third delivery agrees with the second: the call is settled.
    three = Delivery(kind, scripts, journal)
    assert three.play(first, None)
    assert three.started == [] and three.outcome() == two.outcome()


@given(call=CALLS, order=ORDER)
def test_one_delivery_without_crash_follows_the_rules(call: Any, order: list[int]) -> None:
    kind, scripts = call
    journal = Journal()
    run = Delivery(kind, scripts, journal)
    assert run.play(order, None)
    assert all(end is not None for end in run.ends)
    # Every started step's outcome is stored, except a lost race's.
    lost = {p for p in run.started if p not in journal.results}
    assert not lost or kind == RACE
    if kind == RACE:
        assert journal.winner is not None and run.ends[journal.winner] in (VALUE, FAILED)
        assert journal.stop is None, "a race stores its winner, not a stop"
    elif FAILED in run.ends:
        assert journal.stop is not None and run.ends[journal.stop] == FAILED
        assert run.outcome()[0] == FAILED
    else:
        assert journal.stop is None and run.outcome() == ("values", None)


@given(depth=st.integers(1, 4), stop_at=st.integers(0, 3), kinds=st.lists(st.sampled_from(
    [PARALLEL, GATHER, RACE]), min_size=4, max_size=4))  # fmt: skip
def test_a_stop_reaches_every_group_inside_and_no_group_outside(
    depth: int, stop_at: int, kinds: list[str]
) -> None:
    chain: list[Group] = []
    parent = None
    position: int | str = 0
    for level in range(depth):
        group = Group.begin(position, kinds[level], 2, parent=parent)
        chain.append(group)
        parent = group
        position = group.take(1)  # the nested call sits at branch 1's first position
    stopping = min(stop_at, depth - 1)
    if chain[stopping].kind == RACE:
        assert chain[stopping].ended(0)
    else:
        assert chain[stopping].failed(0)
    for level, group in enumerate(chain):
        assert group.stopped == (level >= stopping)
        assert group.may_start(True), "a stored result always replays"
        assert group.may_start(False) == (level < stopping)
        refuses = any(g.kind == RACE for g in chain[stopping : level + 1]) and level >= stopping
        assert group.refuses_writes == (refuses and chain[stopping].kind == RACE)


@given(ends=st.lists(st.sampled_from([VALUE, FAILED, ABANDONED, HALTED]), max_size=6))
def test_what_a_call_raises(ends: list[str]) -> None:
    index = to_raise(ends)
    if all(end == VALUE for end in ends):
        assert index is None
        return
    assert index is not None
    for kind in (HALTED, FAILED, ABANDONED):
        if kind in ends:
            assert index == ends.index(kind)
            break


def test_positions_names_and_bad_groups() -> None:
    assert group_name(1) == "1 branch" and group_name(3) == "3 branches"
    assert calls_of("3.1.0.2.0") == [3, "3.1.0"]
    group = Group.begin("3.1.0", PARALLEL, 2)
    assert [group.take(0), group.take(0), group.take(1)] == ["3.1.0.0.0", "3.1.0.0.1", "3.1.0.1.0"]
    assert group.failed(1) and not group.failed(0), "only the first failure stops"
    with pytest.raises(ValueError, match="branch 2 of a group of 2"):
        group.take(2)
    with pytest.raises(ValueError, match="stored winner 3 of a group of 2"):
        Group.begin(0, RACE, 2, stored_winner=3)
    with pytest.raises(ValueError, match="unknown group kind"):
        Group.begin(0, "map", 2)


class Record:
    def __init__(self, status: str) -> None:
        self.status = status


def test_a_group_stored_before_the_markers_stopped_when_the_body_went_past_a_failure() -> None:
    failed_then_on = {"0.0.0": Record("completed"), "0.1.0": Record("failed"), 1: Record("done")}
    assert legacy_stopped(0, failed_then_on)
    assert not legacy_stopped(0, {"0.1.0": Record("failed")}), "the body may not have gone on"
    assert not legacy_stopped(0, {"0.1.0": Record("completed"), 1: Record("done")})
    nested = {"2.1.0.0.0": Record("failed"), "2.1.1": Record("completed")}
    assert legacy_stopped("2.1.0", nested) and not legacy_stopped(2, nested)
