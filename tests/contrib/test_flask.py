"""The Flask extension: Flask's documented Celery pattern, a durable task, its outcome.

An application factory as Flask's "Background Tasks with Celery" writes it, with
``DurableExtension.init_app``; a real in-process worker on Redis runs the durable task inside
the Flask app context; the outcome is read through ``app.extensions["celery_durable"]``.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from flask import Flask, current_app, jsonify, request

from celery_durable import Durable, Finished
from celery_durable.contrib.flask import DurableExtension, celery_init_app
from celery_durable.core.outcomes import Faulted
from tests.support.tcpproxy import TcpProxy

durable_ext = DurableExtension()


@durable_ext.task(name="flask_tests.greet")
def greet(name: str) -> str:
    if name == "nobody":
        raise ValueError("nobody to greet")
    # current_app works: the task runs inside the Flask application's context.
    return f"hello {name} from {current_app.name} ({current_app.config['GREETING_SOURCE']})"


def create_app(broker: str, journal: str, *, own_celery: bool = False) -> Flask:
    app = Flask("flask_durable_app")
    app.config.from_mapping(
        GREETING_SOURCE="app config",
        CELERY={
            "broker_url": broker,
            "durable_url": journal,
            "task_ignore_result": True,
            "broker_connection_retry_on_startup": True,
            # Our own queue: another test's worker on the same Redis must not take our message.
            "task_default_queue": f"flask-tests-{uuid.uuid4().hex[:8]}",
        },
    )
    if own_celery:
        celery_init_app(app)  # the application made its Celery app first, as Flask's docs do
    durable_ext.init_app(app)

    @app.post("/greet")
    def start() -> Any:
        result = greet.delay(request.form["name"])
        return {"run_id": result.id}, 202

    @app.get("/runs/<path:run_id>")
    def outcome(run_id: str) -> Any:
        durable: Durable = current_app.extensions["celery_durable"]
        found = durable.outcome(run_id, timeout=float(request.args.get("wait", 0)))
        if isinstance(found, Finished):
            return jsonify(state="finished", value=found.value)
        if isinstance(found, Faulted):
            return jsonify(state="faulted", error=found.error)
        return jsonify(state="cancelled")

    return app


@pytest.fixture
def flask_app(redis_url: str, journal_url: str) -> Iterator[Flask]:
    app = create_app(redis_url, journal_url)
    celery_app: Celery = app.extensions["celery"]
    with start_worker(celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=20):
        yield app
    app.extensions["celery_durable"].close()


def test_a_durable_task_started_from_a_view_is_read_back_through_the_extension(
    flask_app: Flask,
) -> None:
    durable = flask_app.extensions["celery_durable"]
    celery_app = flask_app.extensions["celery"]
    assert isinstance(durable, Durable) and durable.app is celery_app
    assert durable.config.url == flask_app.config["CELERY"]["durable_url"]
    assert celery_app.conf.task_ignore_result is True  # config from app.config["CELERY"]
    assert durable.is_durable("flask_tests.greet")

    client = flask_app.test_client()
    started = client.post("/greet", data={"name": "Ada"})
    assert started.status_code == 202
    run_id = started.get_json()["run_id"]
    response = client.get(f"/runs/{run_id}?wait=20")
    assert response.get_json() == {
        "state": "finished",
        "value": "hello Ada from flask_durable_app (app config)",
    }
    assert durable.result(run_id, timeout=0) == "hello Ada from flask_durable_app (app config)"

    failed = client.post("/greet", data={"name": "nobody"}).get_json()["run_id"]
    assert client.get(f"/runs/{failed}?wait=20").get_json() == {
        "state": "faulted",
        "error": "nobody to greet",
    }


def test_init_app_reuses_the_celery_app_the_application_made(
    redis_url: str, sqlite_url: str
) -> None:
    app = create_app(redis_url, sqlite_url, own_celery=True)
    celery_app = app.extensions["celery"]
    durable = DurableExtension.durable(app)
    assert durable.app is celery_app and "flask_tests.greet" in celery_app.tasks
    with app.app_context():
        assert DurableExtension.durable() is durable
        assert greet.name == "flask_tests.greet" and greet.app is celery_app

    # A second application gets its own Celery app, durable journal and task.
    other = create_app(redis_url, sqlite_url.replace("journal.db", "other.db"))
    assert other.extensions["celery"] is not celery_app
    assert "flask_tests.greet" in other.extensions["celery"].tasks
    with other.app_context():
        assert greet.app is other.extensions["celery"]
    with pytest.raises(RuntimeError, match="init_app"):
        DurableExtension.durable(Flask("bare"))


def test_the_example_of_docs_flask_md_builds_its_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/flask.md's app.py and make_celery.py, as written (nothing connects at start); its
    examples with a worker run in tests/test_docs.py."""
    for name in ("CELERY_DURABLE_URL", "CELERY_BROKER_URL"):
        monkeypatch.delenv(name, raising=False)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "flask.md").read_text()
    app_py, make_celery_py = re.findall(r"^```python\n(.*?)^```", doc, re.M | re.S)
    namespace: dict[str, Any] = {"__name__": "app"}
    exec(compile(app_py, "docs/flask.md:app.py", "exec"), namespace)
    flask_app = namespace["create_app"]()
    celery_app = flask_app.extensions["celery"]
    assert flask_app.extensions["celery_durable"].app is celery_app
    assert {"app.greet", "app.greet_scheduled"} <= set(celery_app.tasks)
    assert celery_app.conf.task_ignore_result is True
    assert celery_app.conf.broker_url == "redis://localhost:6379/0"
    assert flask_app.extensions["celery_durable"].config.url == "postgresql://localhost/app"
    compile(make_celery_py, "docs/flask.md:make_celery.py", "exec")


def docs_app(monkeypatch: pytest.MonkeyPatch, journal: str) -> Flask:
    """docs/flask.md's ``create_app()``, on ``journal`` and an in-memory broker."""
    monkeypatch.setenv("CELERY_DURABLE_URL", journal)
    monkeypatch.setenv("CELERY_BROKER_URL", "memory://")
    doc = (Path(__file__).resolve().parents[2] / "docs" / "flask.md").read_text()
    app_py = re.findall(r"^```python\n(.*?)^```", doc, re.M | re.S)[0]
    namespace: dict[str, Any] = {"__name__": "app"}
    exec(compile(app_py, "docs/flask.md:app.py", "exec"), namespace)
    app: Flask = namespace["create_app"]()
    return app


def test_the_docs_view_answers_503_while_the_journal_is_away(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/flask.md's views with their PostgreSQL journal behind a TCP proxy: reachable, a
    run never started is a 404; cut, the same request is a 503 with Retry-After and a short
    message, no traceback, no password; restored, a 404 again. A journal never reached
    (a closed port) answers the same 503."""
    parts = urlsplit(pg_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    behind = f"{parts.username}:s3cret@127.0.0.1:{proxy.port}"
    journal = pg_url.replace(parts.netloc, behind, 1)
    proxy.restore()
    app = docs_app(monkeypatch, journal)
    client = app.test_client()
    durable: Durable = app.extensions["celery_durable"]
    try:
        assert client.get("/greet/never-started").status_code == 404  # the journal answers
        proxy.cut()
        with caplog.at_level(logging.WARNING):
            away = client.get("/greet/never-started")
        assert away.status_code == 503, away.get_data(as_text=True)[:2000]
        assert away.headers["Retry-After"] == "5"
        assert away.get_json() == {"error": "journal unavailable, try again shortly"}
        logged = [r for r in caplog.records if r.name == app.logger.name]
        assert len(logged) == 1 and logged[0].exc_info is None
        assert logged[0].getMessage().startswith("journal unavailable: cannot read the journal")
        assert "s3cret" not in caplog.text and "Traceback" not in caplog.text
        proxy.restore()
        assert client.get("/greet/never-started").status_code == 404
    finally:
        proxy.cut()
        durable.close()

    closed = pg_url.replace(parts.netloc, f"{parts.username}@127.0.0.1:{proxy.port}", 1)
    never = docs_app(monkeypatch, closed)
    try:
        response = never.test_client().get("/greet/never-started")
        assert (response.status_code, response.headers["Retry-After"]) == (503, "5")
    finally:
        never.extensions["celery_durable"].close()
