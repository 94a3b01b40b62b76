"""The chaos harness in CI (A6, A8, D6, D8, W8): two minutes of faults, then every invariant.

``python -m tests.chaos.run --minutes 2`` in a subprocess; its table is printed (``pytest -s``
shows it; it is also in the failure report). Longer runs: ``CELERY_DURABLE_CHAOS_MINUTES``, or run
the script yourself (docs/guarantees.md).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT, child_env, python_command

MINUTES = float(os.environ.get("CELERY_DURABLE_CHAOS_MINUTES", "2"))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(MINUTES * 60 + 480))]


def test_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    workdir = tmp_path / "chaos"
    done = subprocess.run(
        python_command("-m", "tests.chaos.run", "--minutes", str(MINUTES), "--workdir",
                       str(workdir), "--drain-timeout", "180"),
        cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True,
        timeout=MINUTES * 60 + 420,
    )  # fmt: skip
    print(done.stdout[-6000:])
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-4000:]
