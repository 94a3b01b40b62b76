"""Durable tasks with parallel branches for the worker tests (tests/e2e/test_branches_e2e.py).

Loaded into the workers of tests/support/durable_apps.py with ``--include``; steps count every
execution in the test's external store (``record``), outside the journal.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery_durable import parallel
from tests.support.durable_apps import _mark, durable


@durable.step(name="leg")
def leg(branch: int, step: int) -> str:
    ctx = _mark(f"leg{branch}.{step}")
    if (branch, step) == (1, 1):
        gate = Path(os.environ["E2E_GATE"])
        while not gate.exists():  # the worker is killed here, inside branch 1
            time.sleep(0.05)
    return f"{ctx.position}"


@durable.task(name="e2e.branches")
def branches() -> list[list[str]]:
    return parallel(*[(lambda b=b: [leg(b, 0), leg(b, 1)]) for b in range(3)])
