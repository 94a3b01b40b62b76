"""A schedule whose runs could never call their task is refused when it is created or changed.

``backup(folder)`` scheduled without input used to be accepted, then every run failed to start
with ``TypeError``. The arguments a run's message will carry (a durable task: the
``ScheduledRun``; a plain task: the ``args``/``kwargs`` options, else the input) are checked
against the task's signature the way Celery's ``apply_async`` checks them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery, Task

from celery_durable import Cron, Durable, Every, InvalidSchedule, ScheduledRun
from tests.cli.test_cli import fails, ok

EVERY = Every(timedelta(minutes=5))


@pytest.fixture
def durable(sqlite_url: str) -> Iterator[Durable]:
    app = Celery("signature_tests", broker="memory://", set_as_current=False)

    @app.task(name="backup", shared=False)
    def backup(folder: str) -> str:  # pragma: no cover - never run here
        return folder

    @app.task(name="bound", bind=True, shared=False)
    def bound(self: Task, customer: str, amount: int = 0) -> str:  # pragma: no cover
        return customer

    @app.task(name="untyped", typing=False, shared=False)
    def untyped(folder: str) -> str:  # pragma: no cover
        return folder

    class Report(Task):
        name = "report"

        def run(self, day: str) -> str:  # pragma: no cover
            return day

    app.register_task(Report())
    d = Durable(app, sqlite_url)

    @d.task(name="job", shared=False)
    def job(run: ScheduledRun) -> str:  # pragma: no cover
        return "done"

    @d.task(name="no_run", shared=False)
    def no_run() -> str:  # pragma: no cover
        return "done"

    yield d
    d.close()


@pytest.mark.parametrize(
    ("task", "input_", "options", "words"),
    [
        ("backup", None, {}, "missing 1 required positional argument: 'folder'"),
        ("backup", None, {"kwargs": {"path": "/srv"}}, "unexpected keyword argument 'path'"),
        ("backup", None, {"args": ["/a", "/b"]}, "takes 1 positional argument but 2 were"),
        ("bound", None, {}, "missing 1 required positional argument: 'customer'"),
        ("bound", None, {"kwargs": {"amount": 3}}, "missing 1 required positional argument"),
        ("report", None, {}, "missing a required argument: 'day'"),
        ("no_run", None, {}, "takes 0 positional arguments but 1 was given"),
    ],
)
def test_a_call_that_can_never_work_is_refused_at_create(
    durable: Durable, task: str, input_: Any, options: dict[str, Any], words: str
) -> None:
    with pytest.raises(InvalidSchedule) as info:
        durable.schedules.create("s", task, input_, EVERY, **options)
    assert words in str(info.value), str(info.value)
    assert f"task {task!r} cannot be called with" in str(info.value)
    assert durable.schedules.state("s") is None


@pytest.mark.parametrize(
    ("task", "input_", "options"),
    [
        ("backup", "/srv", {}),
        ("backup", None, {"args": ["/srv"]}),
        ("backup", None, {"kwargs": {"folder": "/srv"}}),
        ("bound", {"customer": "Ada"}, {}),
        ("bound", None, {"args": ["Ada"], "kwargs": {"amount": 3}}),
        ("report", "mon", {}),
        ("job", None, {}),  # a durable task receives the ScheduledRun
        ("job", {"any": "input"}, {}),
        ("untyped", None, {}),  # typing=False: Celery does not check it either
    ],
)
def test_a_call_that_fits_is_accepted(
    durable: Durable, task: str, input_: Any, options: dict[str, Any]
) -> None:
    durable.schedules.create("s", task, input_, EVERY, **options)
    assert durable.schedules.state("s") is not None


def test_change_is_checked_too(durable: Durable) -> None:
    durable.schedules.create("s", "backup", "/srv", EVERY)
    with pytest.raises(InvalidSchedule, match="'folder'"):
        durable.schedules.change("s", "backup", None, EVERY)
    view = durable.schedules.state("s")
    assert view is not None and view.input == "/srv"


def test_the_cli_refuses_it_in_one_line(sqlite_url: str) -> None:
    line = fails(
        sqlite_url, 2, "schedules", "create", "b", "cli.needs_folder", "--cron", "*/5 * * * *"
    )
    assert "missing 1 required positional argument: 'folder'" in line, line
    assert "created" in ok(
        sqlite_url, "schedules", "create", "b", "cli.needs_folder", "--cron", "*/5 * * * *",
        "--input", '"/srv"',
    )  # fmt: skip


def test_cron_schedule_of_the_issue(durable: Durable) -> None:
    """The report: ``create … --cron "*/5 * * * *"`` for ``backup(folder)``."""
    with pytest.raises(InvalidSchedule, match="'folder'"):
        durable.schedules.create("b", "backup", None, Cron("*/5 * * * *", "UTC"))


# -- values a run would never send are refused, not dropped -------------------------------------


@pytest.mark.parametrize(
    "options", [{"args": ["/srv"]}, {"kwargs": {"folder": "/srv"}}, {"args": [], "kwargs": {}}]
)
def test_args_or_kwargs_for_a_durable_task_are_refused(
    durable: Durable, options: dict[str, Any]
) -> None:
    """A durable task is sent the ScheduledRun only: its args/kwargs options were dropped."""
    with pytest.raises(InvalidSchedule) as info:
        durable.schedules.create("s", "job", None, EVERY, **options)
    message = str(info.value)
    assert message.startswith("task 'job' is a durable task: each run is sent one ScheduledRun")
    assert "put those values in the input" in message and info.value.field == "options"
    assert durable.schedules.state("s") is None
    durable.schedules.create("s", "job", "/srv", EVERY)
    with pytest.raises(InvalidSchedule, match="is a durable task"):
        durable.schedules.change("s", "job", "/srv", EVERY, **options)


def test_an_input_beside_args_or_kwargs_for_a_plain_task_is_refused(durable: Durable) -> None:
    """The message carries the args: the input would reach no one."""
    for options in ({"args": ["/a"]}, {"kwargs": {"folder": "/a"}}):
        with pytest.raises(InvalidSchedule) as info:
            durable.schedules.create("s", "backup", "/srv", EVERY, **options)
        assert "never the input" in str(info.value) and info.value.field == "input"
    # also where Celery would not check the call (typing=False): the input is dropped alike
    with pytest.raises(InvalidSchedule, match="never the input"):
        durable.schedules.create("s", "untyped", "/srv", EVERY, args=["/a"])
    assert durable.schedules.state("s") is None


def test_max_runs_is_bounded(durable: Durable) -> None:
    """R6: ``max_runs=10**30`` was accepted; the bound is MAX_RUNS = 2**31 - 1."""
    from celery_durable.core.limits import MAX_RUNS

    assert MAX_RUNS == 2**31 - 1
    for too_many in (MAX_RUNS + 1, 10**30):
        with pytest.raises(InvalidSchedule) as info:
            durable.schedules.create(
                "s", "backup", "/srv", Every(timedelta(minutes=5), max_runs=too_many)
            )
        assert str(info.value).startswith("max_runs must be at most 2,147,483,647 (MAX_RUNS")
        assert info.value.field == "Every.max_runs"
    durable.schedules.create("s", "backup", "/srv", Every(timedelta(minutes=5), max_runs=MAX_RUNS))
    view = durable.schedules.state("s")
    assert view is not None and view.rule.max_runs == MAX_RUNS


def test_the_cli_refuses_dropped_options_and_unbounded_max_runs(sqlite_url: str) -> None:
    every = ("--every", "1h")
    line = fails(sqlite_url, 2, "schedules", "create", "d", "cli.invoice", *every, "--args", "[1]")
    assert "task 'cli.invoice' is a durable task" in line, line
    line = fails(
        sqlite_url, 2, "schedules", "create", "p", "cli.backup", *every,
        "--input", '"/srv"', "--kwargs", '{"folder": "/a"}',
    )  # fmt: skip
    assert "never the input" in line, line
    line = fails(
        sqlite_url, 2, "schedules", "create", "m", "cli.backup", *every,
        "--max-runs", str(10**30),
    )  # fmt: skip
    assert "max_runs must be at most 2,147,483,647" in line, line
    # change: an input given to a plain task that has args, and args given to a durable one
    ok(sqlite_url, "schedules", "create", "p", "cli.backup", *every, "--args", '["/a"]')
    line = fails(sqlite_url, 2, "schedules", "change", "p", "--input", '"/srv"')
    assert "never the input" in line, line
    ok(sqlite_url, "schedules", "create", "d", "cli.invoice", *every, "--input", '"x"')
    line = fails(sqlite_url, 2, "schedules", "change", "d", "--kwargs", '{"a": 1}')
    assert "is a durable task" in line, line
