"""``durable.schedules.create_many`` (D13): all or nothing, every check of ``create``.

On real journals (SQLite file, PostgreSQL, MariaDB). A failing spec is named by its index and
schedule ID, raised with the type ``create`` raises, and nothing of the batch is stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from datetime import time, timedelta
from typing import Any

import pytest
from celery import Celery

from celery_durable import (
    CatchUp,
    Daily,
    Durable,
    Every,
    InvalidSchedule,
    Overlap,
    ScheduleConflict,
    ScheduleSpec,
    UnknownTask,
)
from tests.support.clock import FakeClock

EVERY = Every(timedelta(minutes=5))


@pytest.fixture
def app() -> Celery:
    app = Celery("create_many_tests", broker="memory://", set_as_current=False)

    @app.task(name="report", shared=False)
    def report(customer: int) -> None:  # pragma: no cover - never run here
        return None

    return app


@pytest.fixture
def on_sqlite(app: Celery, sqlite_url: str, clock: FakeClock) -> Iterator[Durable]:
    """The checks run before the journal is written: one journal shows them."""
    with closing(Durable(app, sqlite_url, clock=clock)) as opened:
        yield opened


def specs(n: int, **extra: Any) -> list[ScheduleSpec]:
    return [
        ScheduleSpec(id=f"report-{i}", task="report", input=i, rule=EVERY, **extra)
        for i in range(n)
    ]


def test_create_many_stores_what_create_would(durable: Durable, app: Celery) -> None:
    given: list[Any] = [
        *specs(3),
        ScheduleSpec(
            id="oslo",
            task=app.tasks["report"],
            input=7,
            rule=Daily(time(6), "Europe/Oslo"),
            catch_up=CatchUp.ALL,
            by="ops",
            reason="bulk import",
            options={"queue": "reports", "priority": 3, "overlap": Overlap.SKIP},
        ),
        # A mapping of create()'s arguments: other keys are options, as create(**mapping).
        {"id": "mapped", "task": "report", "input": 8, "rule": EVERY, "queue": "q"},
    ]
    assert durable.schedules.create_many(given) == 5
    durable.schedules.create(
        "oslo-by-create",
        "report",
        7,
        Daily(time(6), "Europe/Oslo"),
        CatchUp.ALL,
        by="ops",
        reason="bulk import",
        queue="reports",
        priority=3,
        overlap=Overlap.SKIP,
    )
    views = {v.id: v for v in durable.schedules.list()}
    assert set(views) == {"report-0", "report-1", "report-2", "oslo", "mapped", "oslo-by-create"}
    many, one = views["oslo"], views["oslo-by-create"]
    for name in ("task", "input", "rule", "catch_up", "overlap", "options", "next_due"):
        assert getattr(many, name) == getattr(one, name), name
    assert views["mapped"].options == {"queue": "q"}
    history = durable.schedules.history("oslo")
    assert (history[0].by, history[0].reason) == ("ops", "bulk import")


def test_a1_again_stores_nothing_and_other_content_conflicts(durable: Durable) -> None:
    assert durable.schedules.create_many(specs(4)) == 4
    head = durable.journal.head()
    assert durable.schedules.create_many(specs(4)) == 0
    assert durable.journal.head() == head
    changed = [*specs(4)[:3], ScheduleSpec(id="report-3", task="report", input=99, rule=EVERY)]
    with pytest.raises(ScheduleConflict, match=r"^specs\[3\] \(id 'report-3'\)"):
        durable.schedules.create_many([*changed, *specs(6)[4:]])
    assert durable.journal.head() == head, "a conflict stored part of the batch"
    assert len(durable.schedules.list()) == 4


BAD: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("bad id", {"id": "a\n"}, InvalidSchedule, "control"),
    ("no rule", {"rule": None}, InvalidSchedule, "rule"),
    ("rule type", {"rule": "every 5 minutes"}, InvalidSchedule, "rule must be"),
    ("unknown task", {"task": "nope"}, UnknownTask, "not registered"),
    ("task arguments", {"input": None}, InvalidSchedule, "cannot be called"),
    ("unknown option", {"options": {"colour": "red"}}, InvalidSchedule, "unknown option"),
    ("bad priority", {"options": {"priority": 900}}, InvalidSchedule, "priority"),
    ("catch-up", {"catch_up": "sometimes"}, InvalidSchedule, ""),
    ("input not JSON", {"input": object()}, InvalidSchedule, "input"),
    ("audit", {"by": "x" * 10_000}, InvalidSchedule, ""),
]


@pytest.mark.parametrize(("name", "change", "error", "words"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_spec_is_named_and_nothing_is_stored(
    on_sqlite: Durable, name: str, change: dict[str, Any], error: type[Exception], words: str
) -> None:
    durable = on_sqlite
    good = specs(5)
    fields = {"id": "report-3", "task": "report", "input": 3, "rule": EVERY, **change}
    good[3] = ScheduleSpec(**fields)
    with pytest.raises(error) as caught:
        durable.schedules.create_many(good)
    text = str(caught.value)
    assert text.startswith(f"specs[3] (id {fields['id']!r}): "), text
    assert words in text
    assert getattr(caught.value, "index", None) == 3
    assert durable.schedules.list() == []


def test_malformed_specs_are_refused_before_anything_is_stored(on_sqlite: Durable) -> None:
    durable = on_sqlite
    with pytest.raises(InvalidSchedule, match=r"specs\[1\] must be a ScheduleSpec or a mapping"):
        durable.schedules.create_many([specs(1)[0], ("report-1", "report")])
    with pytest.raises(InvalidSchedule, match=r"specs\[0\] has no 'task'"):
        durable.schedules.create_many([{"id": "x", "rule": EVERY}])
    with pytest.raises(InvalidSchedule, match=r"specs\[2\] \(id 'report-0'\): .*also specs\[0\]"):
        durable.schedules.create_many([*specs(2), specs(1)[0]])
    assert durable.schedules.list() == []
    assert durable.schedules.create_many([]) == 0


def test_an_overlong_id_is_not_repeated_whole_in_the_error(on_sqlite: Durable) -> None:
    """Bad input is named, not echoed without bound: a 100,000-character ID (S1 allows
    200) appears in the message cut short, with its length."""
    durable = on_sqlite
    long_id = "r" * 100_000
    with pytest.raises(InvalidSchedule) as caught:
        durable.schedules.create_many([{"id": long_id, "task": "report", "rule": EVERY}])
    text = str(caught.value)
    assert text.startswith("specs[0] (id 'rrr") and "100,000 characters" in text, text[:300]
    assert len(text) < 400
    assert durable.schedules.list() == []


def test_the_dispatcher_runs_schedules_created_many(durable: Durable, clock: FakeClock) -> None:
    durable.schedules.create_many(specs(3))
    clock.advance(minutes=5)
    dispatcher = durable.dispatcher()
    try:
        dispatcher.tick()
    finally:
        dispatcher.close()
    decided = [r for i in range(3) for r in durable.schedules.runs(f"report-{i}")]
    assert len(decided) == 3
