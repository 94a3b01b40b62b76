"""The public decorators keep the decorated function's signature for type checkers.

mypy checks a small user module: correct calls pass, wrong ones are reported, and the revealed
types are the function's own (``@durable.task``, ``@durable.step``, ``durable.outcome``). A
durable task's ``delay``, ``s`` and ``si`` take the function's parameters, ``apply_async`` and
``apply`` Celery's; an attribute the task type does not declare is an error (no catch-all).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT

api = pytest.importorskip("mypy.api")

USER_CODE = textwrap.dedent(
    """
    from celery import Celery

    from celery_durable import Durable, Retry, ScheduledRun

    app = Celery("typed")
    durable = Durable(app)


    @durable.task
    def add(x: int, y: int) -> int:
        return x + y


    @durable.task(name="typed.greet", queue="q")
    def greet(run: ScheduledRun) -> str:
        return run.schedule


    @durable.step
    def double(x: int) -> int:
        return 2 * x


    @durable.step(retry=Retry.none(), name="fetch")
    def fetch(url: str) -> bytes:
        return url.encode()


    reveal_type(add(1, 2))
    reveal_type(greet)
    reveal_type(double(2))
    reveal_type(fetch("u"))
    reveal_type(durable.outcome("r@x", 0))
    add.delay(1, 2)
    add.name
    add.s(1, y=2)
    add.s(1)  # partial: a chain gives the previous result as the first argument
    add.si(1, 2)
    add.apply_async((1, 2), task_id="add@1")
    add.apply_async(args=[1, 2], countdown=3)
    add.apply((1, 2))
    add.app.conf
    add("one", 2)  # WRONG 1
    add.delay(1)  # WRONG 2
    double("x")  # WRONG 3
    fetch(3)  # WRONG 4
    add.si(1)  # WRONG 5
    add.si(1, 2, 3)  # WRONG 6
    add.apply_async((1, 2), task_id=7)  # WRONG 7
    add.no_such_attribute  # WRONG 8
    """
)


def test_decorators_keep_signatures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / "typed_user.py"
    module.write_text(USER_CODE)
    (tmp_path / "mypy.ini").write_text("[mypy]\n")
    monkeypatch.setenv("MYPYPATH", str(REPO_ROOT))  # this checkout, not an installed copy
    out, err, _status = api.run(
        [
            "--no-incremental",
            "--ignore-missing-imports",
            "--no-error-summary",
            "--show-error-codes",
            "--config-file",
            str(tmp_path / "mypy.ini"),
            str(module),
        ]
    )
    lines = out.splitlines()
    notes = [
        line.split("Revealed type is ", 1)[1].replace("builtins.", "")
        for line in lines
        if "Revealed type" in line
    ]
    assert notes[0] == '"int"', out
    assert "DurableTask[[run: celery_durable.message.ScheduledRun], str]" in notes[1], out
    assert notes[2] == '"int"' and notes[3] == '"bytes"', out
    assert notes[4] == (
        '"celery_durable.core.outcomes.Finished | celery_durable.core.outcomes.Faulted'
        ' | celery_durable.core.outcomes.Cancelled"'
    ), out
    errors = [line for line in lines if ": error:" in line]
    wrong_lines = {i for i, text in enumerate(USER_CODE.splitlines(), start=1) if "# WRONG" in text}
    assert {int(line.split(":")[1]) for line in errors} == wrong_lines, out + err


def test_the_core_and_the_wire_format_pass_mypy_strict() -> None:
    """``core/`` and ``message.py`` are what the rest is built on: ``mypy --strict`` holds
    for them (pyproject.toml turns its per-module flags on, so ``mypy celery_durable`` keeps
    them; this runs the flag itself, which would catch a flag missing from that list)."""
    out, err, status = api.run(
        [
            "--strict",
            "--follow-imports=silent",
            "--no-incremental",
            "--ignore-missing-imports",
            "--show-error-codes",
            str(REPO_ROOT / "celery_durable" / "core"),
            str(REPO_ROOT / "celery_durable" / "message.py"),
        ]
    )
    assert status == 0, out + err
