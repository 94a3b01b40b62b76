"""Beat's start-up banner names the journal the scheduler really uses (D1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from celery import Celery
from celery.apps.beat import Beat

from celery_durable import Durable
from celery_durable.beat import DurableScheduler


def banner(app: Celery) -> str:
    """The text ``celery beat -S durable`` prints before it starts, from Celery's own code."""
    beat = Beat(app=app, scheduler=DurableScheduler, quiet=True)
    service = beat.Service(app=app, scheduler_cls=DurableScheduler)
    return beat.startup_info(service)


def test_banner_names_the_url_given_to_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CELERY_DURABLE_URL", raising=False)
    app = Celery("banner", broker="memory://")
    durable = Durable(app, f"sqlite:///{tmp_path / 'given.db'}")  # as README and tutorial do
    text = banner(app)
    assert f"journal -> sqlite:///{tmp_path / 'given.db'}" in text
    assert "celery_durable.db" not in text
    assert "journal" not in durable.__dict__  # the banner opened nothing
    assert not (tmp_path / "given.db").exists()


def test_banner_hides_the_password_and_falls_back_to_the_configuration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CELERY_DURABLE_URL", raising=False)
    app = Celery("banner", broker="memory://")
    app.conf.durable_url = "postgresql://beat:SECRET@db.example/jobs"
    text = banner(app)
    assert "journal -> postgresql://beat:***@db.example/jobs" in text
    assert "SECRET" not in text
