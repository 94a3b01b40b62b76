"""The example project's tests: the celery_durable pytest plugin, on the project's own app.

Run them with ``python -m pytest example_project/tests``. No broker, no server: an in-memory
broker, a SQLite journal per test, a test clock.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

# Before the app is imported: an in-memory broker and a throwaway data folder.
os.environ.setdefault("CELERY_BROKER_URL", "memory://")
os.environ.setdefault("EXAMPLE_DATA_DIR", tempfile.mkdtemp(prefix="example-project-tests-"))

pytest_plugins = ["celery_durable.testing"]


@pytest.fixture
def durable_app() -> object:
    """The project's app: the plugin points its Durable at the test's journal and clock."""
    from example_project.app import app

    return app


@pytest.fixture
def durable_clock() -> object:
    """Monday 2026-11-02, noon UTC."""
    from celery_durable.testing import TestClock

    return TestClock(datetime(2026, 11, 2, 12, 0, tzinfo=timezone.utc))


@pytest.fixture(autouse=True)
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A data folder of its own per test: a folder to back up, a fresh stand-in backup store
    and billing system."""
    from example_project import app
    from example_project.standins import BackupStore, Billing

    monkeypatch.setattr(app, "settings", dataclasses.replace(app.settings, data_dir=tmp_path))
    monkeypatch.setattr(app, "backup_store", BackupStore(tmp_path / "backups.db"))
    monkeypatch.setattr(app, "billing", Billing(tmp_path / "billing.db"))
    (tmp_path / "documents").mkdir()
    (tmp_path / "documents" / "report.txt").write_text("quarterly numbers\n")
    yield
