"""The journal password never shows: not in any repr/str, nor in ``celery report``.

docs/howto-postgres.md promises it; Celery's own settings dump masks only keys whose names look
secret, so ``durable_url`` needs the library's help (``config.install_report_filter``).
"""

from __future__ import annotations

import subprocess
import textwrap
import uuid
from pathlib import Path

from celery import Celery

from celery_durable import Durable
from celery_durable.config import DurableConfig
from tests.support.processes import child_env, python_command

SECRET = "s3cr3t-Pw-" + uuid.uuid4().hex[:8]
URL = f"postgresql://postgres:{SECRET}@127.0.0.1:1/db?sslpassword={SECRET}x"


def test_no_repr_or_str_shows_the_password() -> None:
    app = Celery(f"secret-{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.durable_url = URL
    durable = Durable(app)
    try:
        texts = [repr(durable), str(durable), repr(durable.config), str(durable.config)]
        texts += [repr(DurableConfig(url=URL)), repr(durable.journal), str(durable.journal.url)]
        texts += [repr(durable), repr(durable.journal.engine)]
        for text in texts:
            assert SECRET not in text, text
        assert "postgres:***@127.0.0.1:1/db" in repr(durable.config)
        assert "check_interval=60.0" in repr(durable.config)
    finally:
        durable.close()


def test_app_conf_humanize_masks_durable_url() -> None:
    app = Celery(f"secret-{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.update(durable_url=URL, nested={"durable_url": URL})
    Durable(app)
    text = app.conf.humanize()
    assert SECRET not in text
    assert "postgresql://postgres:***@127.0.0.1:1/db" in text
    # What a worker answers to `celery inspect conf`.
    table = app.conf.table()
    assert table["durable_url"].startswith("postgresql://postgres:***@127.0.0.1:1/db")
    assert SECRET not in str(table)


def test_celery_report_shows_durable_url_masked(tmp_path: Path) -> None:
    """The real ``celery -A proj report``, as a user pastes it into a bug report."""
    (tmp_path / "proj.py").write_text(
        textwrap.dedent(
            f"""
            from celery import Celery
            from celery_durable import Durable

            app = Celery("proj", broker="memory://")
            app.conf.durable_url = {URL!r}
            durable = Durable(app)
            """
        )
    )
    env = child_env({"PYTHONPATH": str(tmp_path)})
    done = subprocess.run(
        python_command("-m", "celery", "-A", "proj", "report"),
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "durable_url: 'postgresql://postgres:***@127.0.0.1:1/db" in done.stdout, done.stdout
    assert SECRET not in done.stdout + done.stderr
