"""``celery beat -S durable`` started while the journal is unreachable waits for it (D1).

A real beat process, its PostgreSQL journal behind a closed TCP proxy: beat must not exit
(no traceback), log the outage on one line, and once the journal answers import its
``beat_schedule`` and send the runs, saying so on one line.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from celery import Celery

from celery_durable import Durable
from tests.support.processes import child_env, python_command, run_child, running_process, wait_for
from tests.support.tcpproxy import TcpProxy

pytestmark = [pytest.mark.timeout(120)]


def test_beat_started_without_its_journal_waits_and_starts_when_it_comes(
    tmp_path: Path, redis_url: str, pg_url: str
) -> None:
    parts = urlsplit(pg_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)  # closed for now
    journal = pg_url.replace(f"{parts.hostname}:{parts.port}", f"127.0.0.1:{proxy.port}", 1)
    env = {
        "E2E_BROKER": redis_url,
        "E2E_SINK": redis_url,
        "CELERY_DURABLE_URL": journal,
        "E2E_BEAT": "every",
    }
    cmd = python_command(
        "-m", "celery", "-A", "tests.e2e.beat_app", "beat", "-S", "durable", "-l", "INFO",
        "--schedule", str(tmp_path / "unused-beat-schedule"),
    )  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    try:
        with running_process(cmd, log_path=tmp_path / "beat.log", env=env) as beat:
            wait_for(lambda: "journal unavailable" in beat.read_log(), timeout=30, processes=[beat])
            time.sleep(3)  # several retries (every second: beat_max_loop_interval = 1)
            beat.assert_alive()
            proxy.restore()
            wait_for(lambda: client.llen("celery") >= 2, timeout=30, processes=[beat])
            wait_for(lambda: "reachable again" in beat.read_log(), timeout=10, processes=[beat])
            log = beat.read_log()
        assert "Traceback" not in log, log[-3000:]
        outage = [line for line in log.splitlines() if "journal unavailable" in line]
        assert len(outage) == 1, log[-3000:]
        assert "at start-up" in outage[0] and "cannot open the journal" in outage[0]
        assert log.count("journal reachable again") == 1
        sent = [json.loads(raw)["headers"]["id"] for raw in client.lrange("celery", 0, -1)]
        assert all(run_id.startswith("every-second@") for run_id in sent)
        reader = Durable(Celery("reader", set_as_current=False), pg_url)
        try:
            assert reader.schedules.state("every-second") is not None
        finally:
            reader.close()
    finally:
        client.close()
        proxy.cut()


BAD_SETTINGS = {
    "unsupported": (
        {"durable_url": "postgresq://app:s3cret@db.example/prod\x1b[2J"},
        "durable_url: unsupported journal database 'postgresq'",
    ),
    "garbage": ({"durable_url": "not a url at all s3cret"}, "durable_url: the journal URL cannot"),
    "memory": ({"durable_url": "sqlite://"}, "durable_url: a memory database cannot be shared"),
    "interval": (
        {"durable_url": "sqlite:///journal.db", "durable_check_interval": "soon"},
        "durable_check_interval must be a number, not 'soon'",
    ),
}


@pytest.mark.parametrize(("settings", "wrong"), BAD_SETTINGS.values(), ids=BAD_SETTINGS)
def test_beat_refuses_a_journal_setting_it_cannot_use(
    tmp_path: Path, settings: dict[str, str], wrong: str
) -> None:
    """A malformed or unsupported ``durable_url`` (or another ``durable_*`` value) will not
    heal by waiting: beat stops at once with one ERROR line naming the setting and the fault,
    exit 1, no traceback, the password masked, no raw control character and no journal
    created (D1; docs/dispatcher.md)."""
    (tmp_path / "badbeat.py").write_text(
        "from celery import Celery\n\n"
        'app = Celery("badbeat", broker="memory://")\n'
        f"app.conf.update({settings!r})\n"
    )
    env = child_env({"PYTHONPATH": str(tmp_path)})
    env.pop("CELERY_DURABLE_URL", None)
    cmd = python_command(
        "-m", "celery", "-A", "badbeat", "beat", "-S", "durable",
        "--schedule", str(tmp_path / "unused-beat-schedule"),
    )  # fmt: skip
    beat = run_child(cmd, cwd=tmp_path, env=env, timeout=60)
    output = beat.stdout + beat.stderr
    assert beat.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if "ERROR" in line or "CRITICAL" in line]
    assert len(errors) == 1, output[-3000:]
    assert f"durable scheduler cannot start: {wrong}" in errors[0]
    assert "s3cret" not in output and "\x1b" not in output
    assert not (tmp_path / "journal.db").exists()
