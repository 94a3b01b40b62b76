"""Every example of docs/cli.md runs, in order, against the page's own ``proj.py``.

The ``python`` block is written to ``proj.py``; each ``$ `` line of a ``console`` block is run
in-process (``celery …`` through Celery's click group, ``python -m celery_durable …`` through
ours) and its output compared with the lines below it, doctest style (``...`` matches anything,
whitespace is normalised, ``<BLANKLINE>`` is an empty line, Oslo's summer and winter offsets
are one). An example whose output starts with
``Error:`` must fail; every other must succeed.
"""

from __future__ import annotations

import doctest
import re
import shlex
import sys
from pathlib import Path

import pytest
from celery.bin.celery import celery as celery_main
from click.testing import CliRunner, Result

from celery_durable.cli import main as module_main
from tests.support.processes import REPO_ROOT

pytestmark = pytest.mark.timeout(60)

DOC = REPO_ROOT / "docs" / "cli.md"
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC.read_text(), re.M | re.S)


def examples(block: str) -> list[tuple[str, str]]:
    """(command, expected output) pairs of a console block."""
    found: list[tuple[str, str]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            found.append((line[2:], ""))
        elif found:
            command, want = found[-1]
            found[-1] = (command, want + line + "\n")
    return found


def run(command: str) -> Result:
    argv = shlex.split(command)
    runner = CliRunner()
    if argv[0] == "celery":
        return runner.invoke(celery_main, argv[1:], auto_envvar_prefix="CELERY")
    assert argv[:3] == ["python", "-m", "celery_durable"], command
    return runner.invoke(module_main, argv[3:], prog_name="python -m celery_durable")


def test_every_cli_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (project,) = blocks("python")
    (tmp_path / "proj.py").write_text(project)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CELERY_DURABLE_URL", f"sqlite:///{tmp_path / 'journal.db'}")
    sys.modules.pop("proj", None)
    checker = doctest.OutputChecker()
    count = 0
    try:
        for block in blocks("console"):
            for command, want in examples(block):
                result = run(command)
                got = _offsets(result.stdout + result.stderr)
                want = _offsets(want)
                assert result.exception is None or isinstance(result.exception, SystemExit), (
                    command,
                    result.exception,
                )
                failed = want.startswith("Error:")
                assert (result.exit_code != 0) == failed, (command, result.exit_code, got)
                if not checker.check_output(want, got, _FLAGS):
                    pytest.fail(f"$ {command}\n{checker.output_difference(_Ex(want), got, _FLAGS)}")
                count += 1
    finally:
        module = sys.modules.pop("proj", None)
        if module is not None:
            module.durable.close()
    assert count >= 25


def _offsets(text: str) -> str:
    """Oslo's offset is +01:00 in winter and +02:00 in summer: the page shows one of them."""
    return re.sub(r"\+0[12]:00 Europe/Oslo", "+01:00 Europe/Oslo", text)


class _Ex:
    """The part of ``doctest.Example`` that ``output_difference`` reads."""

    def __init__(self, want: str) -> None:
        self.want = want
