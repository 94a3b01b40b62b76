"""docs/tutorial.md end to end, as a reader follows it: its files, its commands, a real worker
and beat on kombu's SQL transport, and the output the page shows.

tests/test_docs.py runs the page's blocks that need no worker; this test runs the rest (the
blocks marked skipped there because they need step 4's worker and beat) and compares what
they print with the page: the log lines of steps 4 and 6, ``python results.py`` and the CLI of
step 5, and the catch-up of step 6 after beat was stopped for 30 seconds. It takes about a
minute: the schedule of the tutorial runs every 10 seconds.
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT, child_env, run_child, running_process, wait_for
from tests.test_docs import Block, blocks_of, console_examples

pytestmark = pytest.mark.timeout(240)

PAGE = REPO_ROOT / "docs" / "tutorial.md"
_RUN_ID_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{7}Z"
_VARIABLE = [  # what differs from the page's example in every run, as regular expressions
    (re.compile(re.escape("2026-12-02T") + r"[\d:.]+Z"), r"\d{4}-\d\d-\d\dT[\d:.]+Z"),
    (re.compile(r"\d\d:\d\d:\d\d UTC"), r"\d\d:\d\d:\d\d UTC"),
    (re.compile(r"2026-12-02 \d\d:\d\d:\d\d\+00:00"), r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\+00:00"),
    (re.compile(r"lag \d+\.\d+s"), r"lag \d+\.\d+s"),
    (re.compile(r"in \d+\.\d+s"), r"in \d+\.\d+s"),
    (re.compile(r"\b2 missed"), r"\d+ missed"),
]


def pattern_of(example: str) -> re.Pattern[str]:
    """A documented output line as a pattern: ``...`` and the run's times match anything."""
    parts: list[str] = []
    position = 0
    spans = sorted(
        (m.start(), m.end(), regex) for finder, regex in _VARIABLE for m in finder.finditer(example)
    )
    for start, end, regex in spans:
        if start < position:
            continue
        parts.append(re.escape(example[position:start]))
        parts.append(regex)
        position = end
    parts.append(re.escape(example[position:]))
    text = "".join(parts).replace(re.escape("..."), ".*?")
    return re.compile(r"\s+".join(text.split(r"\ ")))


def block_after(blocks: list[Block], heading_text: str, language: str) -> Block:
    """The first ``language`` block after the line containing ``heading_text``."""
    lines = PAGE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if heading_text in line)
    return next(b for b in blocks if b.line > start and b.language == language)


def found_in(log: str, example: str) -> bool:
    return pattern_of(example).search(log) is not None


def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    blocks = blocks_of(PAGE)
    for block in blocks:
        if block.action == "file":
            (tmp_path / block.argument).write_text(block.text)
    env = {"PYTHONPATH": str(tmp_path)}
    drop = ("CELERY_DURABLE_URL", "CELERY_BROKER_URL", "CELERY_APP")
    base_env = {k: v for k, v in child_env(env).items() if k not in drop}

    def run(command: str) -> str:
        args = shlex.split(command)
        args[0] = {"python": sys.executable}.get(args[0], args[0])
        if args[0] == "celery":
            args[:1] = [sys.executable, "-m", "celery"]
        done = run_child(args, cwd=tmp_path, env=base_env)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        return done.stdout

    def command_list(text: str) -> list[str]:
        args = shlex.split(text)
        assert args[0] == "celery"
        return [sys.executable, "-m", "celery", *args[1:]]

    # Step 3: the schedule.
    assert run("python schedules.py").startswith("next run at ")

    # Step 4: worker and beat, started with the page's own commands.
    worker_cmd, beat_cmd = (
        c for c, _ in console_examples(block_after(blocks, "## 4.", "console").text)
    )
    logs = block_after(blocks, "Every 10 seconds, beat", "text").text.splitlines()
    decided_line, step_line, succeeded_line = logs
    worker_log, beat_log = tmp_path / "worker.log", tmp_path / "beat.log"
    common = {"cwd": tmp_path, "env": base_env, "inherit_env": False}
    with running_process(command_list(worker_cmd), log_path=worker_log, **common) as worker:
        with running_process(command_list(beat_cmd), log_path=beat_log, **common) as beat:
            wait_for(
                lambda: worker.read_log().count("succeeded in") >= 2,
                timeout=60,
                message="two runs of greet-ada",
                processes=[worker, beat],
            )
        # The log lines of step 4, one line per step (not one per piece of a print).
        text = worker.read_log()
        assert found_in(beat.read_log(), decided_line), beat.read_log()
        assert found_in(text, step_line), text
        assert found_in(text, succeeded_line), text
        looked_up = [line for line in text.splitlines() if "looking up" in line]
        assert len(looked_up) == text.count("succeeded in"), looked_up
        assert not re.search(r"WARNING/\w+\] (ada|looking up|with idempotency key)", text)

        # Step 5: results from Python and from the CLI, as the page shows them.
        [(results_cmd, results_out)] = console_examples(
            block_after(blocks, "as `results.py`", "console").text
        )
        got = run(results_cmd)
        lines = got.splitlines()
        assert len(lines) == 2, got
        for line, example in zip(lines, results_out.splitlines(), strict=True):
            assert pattern_of(example).fullmatch(line), (line, example)
        listed = run("celery -A proj durable runs list --schedule greet-ada")
        assert listed.splitlines()[1].split()[1] == "finished", listed

        # Step 6: beat away for 30 seconds; one run catches up (CatchUp.LATEST).
        missed_line, caught_line = block_after(blocks, "## 6.", "text").text.splitlines()
        time.sleep(30)
        restarted_log = tmp_path / "beat-restarted.log"
        with running_process(command_list(beat_cmd), log_path=restarted_log, **common) as beat:
            wait_for(
                lambda: "missed due time" in beat.read_log() and "decided run" in beat.read_log(),
                timeout=40,
                processes=[beat],
                message="the catch-up after the restart",
            )
            restarted = beat.read_log()
        assert found_in(restarted, missed_line), restarted
        assert found_in(restarted, caught_line), restarted
        before = re.findall(rf"decided run 'greet-ada@({_RUN_ID_TIME})'", beat_log.read_text())
        caught = re.findall(rf"decided run 'greet-ada@({_RUN_ID_TIME})'", restarted)
        # One run caught up, the latest missed due time; the ones between it and the last run
        # decided before beat stopped (10 s apart) were dropped, and the log counts them.
        [dropped] = re.findall(r"(\d+) missed due time", restarted)
        gap = round(_seconds(caught[0]) - _seconds(before[-1]), 3)
        assert int(dropped) >= 1 and gap == (int(dropped) + 1) * 10, (before[-1], caught, dropped)
        assert all(_seconds(later) - _seconds(caught[0]) >= 9 for later in caught[1:]), caught


def _seconds(stamp: str) -> float:
    from datetime import datetime

    return datetime.strptime(stamp[:26], "%Y-%m-%dT%H:%M:%S.%f").timestamp()
