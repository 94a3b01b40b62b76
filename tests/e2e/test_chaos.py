"""The chaos harness in CI (A6, A8, D6, D8, W8): two minutes of faults, then every invariant;
then a shorter run with the journal on MariaDB (``--journal mysql``, one minute), and one
minute with 3 beats sharing 8 partitions (``--partitions 8``, D10: every beat works).

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
#: The MariaDB run is shorter: the journal code is shared, what it adds is the database.
MYSQL_MINUTES = min(MINUTES, 1.0)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(MINUTES * 60 + 480))]


@pytest.mark.parametrize("journal", ["postgres", "mysql", "postgres-partitions"])
def test_chaos_run_keeps_every_invariant(
    tmp_path: Path, journal: str, request: pytest.FixtureRequest
) -> None:
    minutes = MINUTES if journal == "postgres" else MYSQL_MINUTES
    partitions = "8" if journal.endswith("-partitions") else "1"
    journal = journal.removesuffix("-partitions")
    env = child_env()
    if journal == "mysql":
        # The harness makes its journal database beside the configured one.
        env["CELERY_DURABLE_TEST_MYSQL_URL"] = request.getfixturevalue("mysql_server_url")
    workdir = tmp_path / "chaos"
    done = subprocess.run(
        python_command("-m", "tests.chaos.run", "--minutes", str(minutes), "--workdir",
                       str(workdir), "--drain-timeout", "180", "--journal", journal,
                       "--partitions", partitions, "--beats", "3"),
        cwd=REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=minutes * 60 + 420,
    )  # fmt: skip
    print(done.stdout[-6000:])
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-4000:]
