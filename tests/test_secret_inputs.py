"""Secret inputs (SPEC P5): the journal, every read and every log keep the reference only.

Pure tests of ``Secret`` and its stored form; the dispatcher with a fake clock on a SQLite
journal and a real Redis broker; the admin through Django's test client; and real beat and
worker processes, after which the whole journal file and every captured output are searched
for the values.
"""

from __future__ import annotations

import base64
import json
import logging
import pickle
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_durable import (
    Durable,
    Every,
    InvalidSchedule,
    ScheduledRun,
    Secret,
    SecretUnavailable,
)
from celery_durable.core.schedule_aggregate import PendingRun
from celery_durable.core.secrets import decode_secrets, encode_secrets
from celery_durable.message import run_message, scheduled_message
from tests.contrib.test_django_admin import LIST, client, django_site  # noqa: F401 (fixtures)
from tests.support.clock import T0, FakeClock
from tests.support.processes import (
    child_env,
    python_command,
    run_child,
    running_process,
    wait_for,
)

# -- Secret itself ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reference", "says"),
    [
        (1, "not int"),
        (None, "not NoneType"),
        (b"env:X", "not bytes"),
        ("vault:X", "start with env: or setting:"),
        ("API_TOKEN", "no scheme"),
        ("env:", "empty name"),
        ("setting:", "empty name"),
        (" env:X", "start with env:"),
        ("env: X", "spaces or control characters"),
        ("env:X\x1b[2J", "spaces or control characters"),
        ("env:" + "X" * 201, "at most 200"),
    ],
)
def test_a_bad_reference_is_refused_at_construction(reference: Any, says: str) -> None:
    with pytest.raises(InvalidSchedule, match=says.replace("(", r"\(")) as caught:
        Secret(reference)
    assert "\x1b" not in str(caught.value)


def test_a_secret_shows_its_reference_and_is_stored_as_it() -> None:
    secret = Secret("env:API_TOKEN")
    assert repr(secret) == str(secret) == "Secret('env:API_TOKEN')"
    assert (secret.scheme, secret.name) == ("env", "API_TOKEN")
    assert json.dumps(secret) == '{"$secret": "env:API_TOKEN"}'
    assert pickle.loads(pickle.dumps(secret)) == secret
    with pytest.raises(TypeError, match="read-only"):
        secret["$secret"] = "env:OTHER"


def test_user_dicts_that_look_like_references_round_trip_as_data() -> None:
    value = {
        "token": Secret("env:T"),
        "looks": {"$secret": "env:HOME"},
        "escape": {"$literal": {"a": 1}},
        "deep": [{"$secret": 3}],
    }
    stored, marked = encode_secrets(value)
    assert marked
    assert stored["token"] == {"$secret": "env:T"}
    assert stored["looks"] == {"$literal": {"$secret": "env:HOME"}}
    assert stored["escape"] == {"$literal": {"$literal": {"a": 1}}}
    assert decode_secrets(stored) == value
    assert type(decode_secrets(stored)["looks"]) is dict  # data, not a Secret
    assert encode_secrets({"plain": [1, {"a": "b"}]}) == ({"plain": [1, {"a": "b"}]}, False)


def test_a_scheduled_run_reads_its_secrets_at_input_and_shows_references(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("P5_TOKEN", "s3cr3t-value")
    run = ScheduledRun("nightly", T0, {"token": Secret("env:P5_TOKEN"), "n": 1})
    assert run.input == {"token": "s3cr3t-value", "n": 1}
    assert "s3cr3t-value" not in repr(run)
    assert "Secret('env:P5_TOKEN')" in repr(run)
    [arg], _, _ = scheduled_message(run)
    assert "s3cr3t-value" not in json.dumps(arg)
    assert arg["secrets"] == 1 and arg["input"]["token"] == {"$secret": "env:P5_TOKEN"}
    monkeypatch.delenv("P5_TOKEN")
    with pytest.raises(SecretUnavailable, match="env:P5_TOKEN") as caught:
        _ = run.input
    assert caught.value.reference == "env:P5_TOKEN"


def test_messages_of_runs_stored_before_secrets_take_lookalikes_as_data(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """§9: a stored input or args without the ``$secrets`` mark are read as they always were."""
    monkeypatch.setenv("HOME_LIKE", "value-that-must-not-be-read")
    old = {"$secret": "env:HOME_LIKE"}
    pending = PendingRun(due=T0, run_id="r", task="t", input=None, options={"args": [old]})

    def lookup(scheme: str, name: str) -> str:
        raise AssertionError("an unmarked value was read as a reference")

    assert run_message("s", pending, durable=False, secrets=lookup).args == [old]
    durable_pending = PendingRun(due=T0, run_id="r", task="t", input=old, options={})
    [arg] = run_message("s", durable_pending, durable=True, secrets=lookup).args
    assert "secrets" not in arg
    assert ScheduledRun.from_json(arg).input == old  # an old message, read by the new worker


# -- the dispatcher, in process -----------------------------------------------------------------


@pytest.fixture
def app(redis_url: str, sqlite_url: str) -> Celery:
    app = Celery("secret_tests", broker=redis_url, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = False
    app.conf.P5_SETTING = "setting-value-7f3a"

    @app.task(name="report", shared=False)
    def report(token: str, *, setting: str = "") -> None:  # pragma: no cover - read from Redis
        return None

    return app


@pytest.fixture
def journal_url(sqlite_url: str) -> str:
    """SQLite alone for the ``durable`` fixture: what is checked is the same on every database."""
    return sqlite_url


def bodies(redis_url: str) -> list[list[Any]]:
    broker = redis.Redis.from_url(redis_url)
    try:
        raw = [json.loads(m) for m in reversed(broker.lrange("celery", 0, -1))]
    finally:
        broker.close()
    return [json.loads(base64.b64decode(m["body"])) for m in raw]


def first_run(durable: Durable, clock: FakeClock) -> Any:
    """Tick, move five seconds on and tick again: a five-second schedule's first due time."""
    dispatcher = durable.dispatcher()
    dispatcher.tick()
    clock.advance(seconds=5)
    dispatcher.tick()
    return dispatcher


def journal_bytes(sqlite_url: str) -> bytes:
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


def test_a_plain_task_gets_the_values_and_every_read_shows_the_references(
    durable: Durable,
    clock: FakeClock,
    redis_url: str,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("P5_ENV_TOKEN", "env-value-91c2")
    caplog.set_level(logging.DEBUG, logger="celery_durable")
    durable.schedules.create(
        "report",
        "report",
        None,
        Every(timedelta(seconds=5)),
        args=[Secret("env:P5_ENV_TOKEN")],
        kwargs={"setting": Secret("setting:P5_SETTING")},
        reason="rotate",
    )
    first_run(durable, clock)
    [body] = bodies(redis_url)
    assert body[0] == ["env-value-91c2"] and body[1] == {"setting": "setting-value-7f3a"}
    view = durable.schedules.state("report")
    assert view is not None
    assert view.options["args"] == [Secret("env:P5_ENV_TOKEN")]
    assert "$secrets" not in view.options
    reads = [
        repr(view),
        repr(durable.schedules.list()),
        repr(durable.schedules.runs("report")),
        repr(durable.schedules.history("report")),
        caplog.text,
        journal_bytes(sqlite_url).decode("utf-8", "replace"),
    ]
    for text in reads:
        assert "env-value-91c2" not in text and "setting-value-7f3a" not in text
    assert "Secret('env:P5_ENV_TOKEN')" in reads[0]
    assert b'{"$secret":"env:P5_ENV_TOKEN"}' in journal_bytes(sqlite_url)
    # Changing to the same content (as the CLI and the admin do with what they read) is a no-op.
    before = view.version
    durable.schedules.change(
        "report", "report", None, Every(timedelta(seconds=5)), **dict(view.options)
    )
    after = durable.schedules.state("report")
    assert after is not None and after.version == before


def test_the_history_shows_secrets_and_the_users_data_as_state_does(durable: Durable) -> None:
    """P5, O5: ``history`` shows what ``state`` shows: references as Secrets, a lookalike
    dict as the user gave it, and never the stored mark."""
    lookalike = {"$secret": "not-a-reference"}
    durable.schedules.create(
        "report",
        "report",
        None,
        Every(timedelta(seconds=5)),
        args=[Secret("env:P5_ENV_TOKEN")],
        kwargs={"setting": lookalike},
    )
    view = durable.schedules.state("report")
    assert view is not None
    [created] = durable.schedules.history("report")
    assert created.changes["options"] == (None, {**view.options})
    assert created.changes["options"][1] == {
        "args": [Secret("env:P5_ENV_TOKEN")],
        "kwargs": {"setting": lookalike},
    }
    durable.schedules.change("report", "report", None, Every(timedelta(seconds=5)), args=["x"])
    changed = durable.schedules.history("report")[1]
    assert changed.changes == {"options": ({**view.options}, {"args": ["x"]})}
    assert "$secrets" not in repr(created) and "$literal" not in repr(created)


def test_a_reference_that_cannot_be_read_fails_the_start_and_the_schedule_goes_on(
    durable: Durable,
    clock: FakeClock,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.delenv("P5_LATER", raising=False)
    durable.schedules.create(
        "late-var", "report", None, Every(timedelta(seconds=5)), args=[Secret("env:P5_LATER")]
    )
    dispatcher = first_run(durable, clock)
    [failed] = durable.schedules.runs("late-var")
    assert failed.state == "failed_to_start"
    assert "env:P5_LATER" in str(failed.error) and "cannot be resolved" in str(failed.error)
    assert "env:P5_LATER" in caplog.text
    assert bodies(redis_url) == []
    monkeypatch.setenv("P5_LATER", "arrived-later-55d1")
    clock.advance(seconds=5)
    dispatcher.tick()
    runs = durable.schedules.runs("late-var")
    assert [r.state for r in runs] == ["started", "failed_to_start"]
    assert bodies(redis_url)[0][0] == ["arrived-later-55d1"]


def test_a_durable_task_message_carries_references_only(
    durable: Durable, clock: FakeClock, redis_url: str, sqlite_url: str
) -> None:
    @durable.task(name="vaulted", shared=False)
    def vaulted(run: ScheduledRun) -> None:  # pragma: no cover - read from Redis
        return None

    # Beat needs no value for a durable task: the variable does not exist in this process.
    durable.schedules.create(
        "vaulted", "vaulted", {"token": Secret("env:P5_WORKER_ONLY")}, Every(timedelta(seconds=5))
    )
    first_run(durable, clock)
    [body] = bodies(redis_url)
    [arg] = body[0]
    assert arg["input"] == {"token": {"$secret": "env:P5_WORKER_ONLY"}} and arg["secrets"] == 1
    assert [r.state for r in durable.schedules.runs("vaulted")] == ["started"]


def test_a_dict_that_looks_like_a_reference_is_sent_as_data(
    durable: Durable, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("P5_NOT_READ", "must-not-be-sent-0b7e")
    durable.schedules.create(
        "lookalike",
        "report",
        None,
        Every(timedelta(seconds=5)),
        args=[{"$secret": "env:P5_NOT_READ"}],
    )
    first_run(durable, clock)
    [body] = bodies(redis_url)
    assert body[0] == [{"$secret": "env:P5_NOT_READ"}]
    view = durable.schedules.state("lookalike")
    assert view is not None and type(view.options["args"][0]) is dict


def test_a_schedule_stored_before_secrets_sends_its_lookalike_dicts_as_data(
    durable: Durable, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """§9: content stored by the previous version (no ``$secrets`` mark) reads as it did."""
    from celery_durable.core.schedule_aggregate import Create
    from celery_durable.core.schedule_events import Content
    from celery_durable.schedules import ScheduleStore

    monkeypatch.setenv("P5_OLD", "old-journal-value-a11e")
    old = {"$secret": "env:P5_OLD"}
    content = Content(
        task="report", input=None, rule=Every(timedelta(seconds=5)), options={"args": [old]}
    )
    ScheduleStore(durable.runtime).execute("old", lambda now: Create(content=content, now=now))
    first_run(durable, clock)
    [body] = bodies(redis_url)
    assert body[0] == [old]
    view = durable.schedules.state("old")
    assert view is not None and view.options["args"] == [old]
    assert type(view.options["args"][0]) is dict


def test_a_beat_schedule_entry_may_carry_secrets(
    redis_url: str, sqlite_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B5 and P5: a ``beat_schedule`` entry's args and kwargs keep their references."""
    from tests.importers.test_beat_import import Beat

    monkeypatch.setenv("P5_BEAT", "beat-entry-value-9d9d")
    entry = {
        "task": "report",
        "schedule": 10.0,
        "args": (Secret("env:P5_BEAT"), {"$secret": "mine"}),
        "kwargs": {"key": Secret("setting:P5_BEAT_SETTING")},
    }
    beat = Beat(redis_url, sqlite_url, clock)
    try:
        scheduler = beat.start({"with-secret": entry}, P5_BEAT_SETTING="beat-setting-3c3c")
        clock.advance(seconds=10)
        scheduler.tick()
        view = beat.durable.schedules.state("with-secret")
    finally:
        beat.close()
    [body] = bodies(redis_url)
    assert body[0] == ["beat-entry-value-9d9d", {"$secret": "mine"}]
    assert body[1] == {"key": "beat-setting-3c3c"}
    assert view is not None and view.options["args"][0] == Secret("env:P5_BEAT")
    assert b"beat-entry-value-9d9d" not in journal_bytes(sqlite_url)


def test_metrics_name_no_value(
    durable: Durable, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    prometheus = pytest.importorskip("prometheus_client")
    from celery_durable.observability.metrics import install_metrics

    registry = prometheus.CollectorRegistry()
    metrics = install_metrics(registry, durable=durable)
    try:
        monkeypatch.setenv("P5_METRIC", "metric-value-c0de")
        durable.schedules.create(
            "m", "report", None, Every(timedelta(seconds=5)), args=[Secret("env:P5_METRIC")]
        )
        durable.schedules.create(
            "m-missing", "report", None, Every(timedelta(seconds=5)), args=[Secret("env:NOPE_P5")]
        )
        first_run(durable, clock)
        text = prometheus.generate_latest(registry).decode()
    finally:
        metrics.disconnect()
    assert 'schedule="m"' in text and "metric-value-c0de" not in text


def test_a_durable_task_reads_its_secrets_in_the_worker_at_run_input(
    durable: Durable,
    app: Celery,
    clock: FakeClock,
    redis_url: str,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Executed by Celery's ``apply`` (the worker's code path): ``setting:`` is read from the
    app's configuration; a reference that cannot be read fails the run's start (D5): the
    body never runs, the run is recorded as failed to start, logged once, naming it."""
    from celery_durable import Finished

    seen: list[Any] = []

    @durable.task(name="uses-secret", shared=False)
    def uses(run: ScheduledRun) -> int:
        seen.append(run.input)
        return len(run.input["token"])  # the result is stored: never the value itself

    due = T0 + timedelta(seconds=5)
    run = ScheduledRun("s", due, {"token": Secret("setting:P5_SETTING")})
    args, kwargs, _ = scheduled_message(run)
    uses.apply(args, kwargs, task_id="s@2026-11-02T12:00:05.0000000Z")
    assert seen == [{"token": "setting-value-7f3a"}]
    assert durable.outcome("s@2026-11-02T12:00:05.0000000Z", timeout=5) == Finished(18)
    # The dispatcher decides and sends the next run (beat needs no value: durable task).
    durable.schedules.create(
        "later", "uses-secret", {"token": Secret("env:P5_NOWHERE")}, Every(timedelta(seconds=5))
    )
    first_run(durable, clock)
    broker = redis.Redis.from_url(redis_url)
    [raw] = [json.loads(m) for m in broker.lrange("celery", 0, -1)]
    broker.close()
    args, kwargs, _ = json.loads(base64.b64decode(raw["body"]))
    rid = raw["headers"]["id"]
    headers = {k: v for k, v in raw["headers"].items() if k.startswith("durable_")}
    monkeypatch.delenv("P5_NOWHERE", raising=False)
    for _ in range(2):  # a second delivery of the same message: recorded and logged once
        uses.apply(args, kwargs, task_id=rid, headers=headers)
    assert len(seen) == 1, "the body never ran"
    assert durable.runs.row(rid)["status"] == "failed_to_start"
    with pytest.raises(LookupError):
        durable.outcome(rid, timeout=0)
    [failed] = durable.schedules.runs("later")
    assert (failed.run_id, failed.state) == (rid, "failed_to_start")
    assert failed.error == (
        "SecretUnavailable: secret env:P5_NOWHERE cannot be resolved: no such environment variable"
    )
    lines = [r.getMessage() for r in caplog.records if "can never start" in r.getMessage()]
    assert lines == [
        f"run {rid!r} of schedule 'later' (due 2026-11-02T12:00:05.000000Z, task 'uses-secret') "
        f"can never start: {failed.error}"
    ]
    assert b"setting-value-7f3a" not in journal_bytes(sqlite_url)


# -- the admin ----------------------------------------------------------------------------------


@pytest.fixture
def admin_durable(
    django_site: None,  # noqa: F811
    durable: Durable,
    app: Celery,
    sqlite_url: str,
) -> Iterator[Durable]:
    """The admin on this file's app and journal (through CELERY_DURABLE_APP)."""
    from django.test import override_settings

    app.conf.durable_url = sqlite_url
    with override_settings(CELERY_DURABLE_APP=app):
        yield durable


def test_the_admin_shows_references_and_keeps_them_on_save(
    client: Any,  # noqa: F811
    admin_durable: Durable,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("P5_ADMIN", "admin-value-4e4e")
    admin_durable.schedules.create(
        "rep", "report", None, Every(timedelta(hours=1)), args=[Secret("env:P5_ADMIN")]
    )
    change = LIST + "rep/change/"
    pages = [client.get(LIST).content.decode(), client.get(change).content.decode()]
    assert all("admin-value-4e4e" not in page for page in pages)
    assert "env:P5_ADMIN" in pages[1]
    initial = client.get(change).context["form"].initial
    data = {k: v for k, v in initial.items() if v is not None} | {"every": "2h"}
    assert client.post(change, data).status_code == 302
    view = admin_durable.schedules.state("rep")
    assert view is not None and view.rule == Every(timedelta(hours=2))
    assert view.options["args"] == [Secret("env:P5_ADMIN")]
    assert type(view.options["args"][0]) is Secret


def test_the_admin_add_form_and_history_page_keep_references(
    client: Any,  # noqa: F811
    admin_durable: Durable,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The add form reads ``{"$secret": "env:NAME"}`` as a Secret; the history page shows
    the reference, never the value (P5, O5)."""
    from tests.contrib.test_django_admin import form_data

    monkeypatch.setenv("P5_ADMIN_ADD", "admin-add-value-9b1d")
    data = form_data(
        id="added",
        task="report",
        kind="every",
        every="1h",
        input="null",
        options='{"args": [{"$secret": "env:P5_ADMIN_ADD"}]}',
        reason="rotate",
    )
    response = client.post(LIST + "add/", data)
    assert response.status_code == 302, response.context["form"].errors
    view = admin_durable.schedules.state("added")
    assert view is not None and view.options["args"] == [Secret("env:P5_ADMIN_ADD")]
    assert client.post(LIST + "added/change/", {**data, "every": "2h"}).status_code == 302
    pages = [
        client.get(LIST + "add/").content.decode(),
        client.get(LIST + "added/change/").content.decode(),
        client.get(LIST + "added/history/").content.decode(),
    ]
    assert "env:P5_ADMIN_ADD" in pages[1] and "env:P5_ADMIN_ADD" in pages[2]
    assert all("admin-add-value-9b1d" not in page for page in pages)


def test_the_cli_creates_schedules_with_secrets_and_never_prints_a_value(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--input``, ``--args`` and ``--kwargs`` read ``{"$secret": "env:NAME"}`` as a Secret;
    every command shows the reference; a bad reference is refused, naming it."""
    from tests.cli.test_cli import as_json, fails, ok

    monkeypatch.setenv("P5_CLI", "cli-value-3c3c")
    url = sqlite_url
    ok(url, "schedules", "create", "durable-in", "cli.invoice", "--every", "1h",
       "--input", '{"token": {"$secret": "env:P5_CLI"}}')  # fmt: skip
    ok(url, "schedules", "create", "plain-args", "cli.backup", "--every", "1h",
       "--args", '[{"$secret": "env:P5_CLI"}]',
       "--kwargs", '{"key": {"$secret": "setting:P5_CLI_SETTING"}}',
       "--reason", "rotate")  # fmt: skip
    shown = as_json(url, "schedules", "show", "durable-in")
    assert shown["input"] == {"token": {"$secret": "env:P5_CLI"}}
    plain = as_json(url, "schedules", "show", "plain-args")
    assert plain["options"]["args"] == [{"$secret": "env:P5_CLI"}]
    assert plain["options"]["kwargs"] == {"key": {"$secret": "setting:P5_CLI_SETTING"}}
    ok(url, "schedules", "change", "plain-args", "--every", "2h")  # keeps the references
    outputs = [
        ok(url, "schedules", "show", "durable-in"),
        ok(url, "schedules", "show", "plain-args"),
        ok(url, "schedules", "list"),
        ok(url, "schedules", "history", "plain-args"),
        json.dumps(as_json(url, "schedules", "list")),
    ]
    assert '{"$secret": "env:P5_CLI"}' in outputs[1]
    assert as_json(url, "schedules", "show", "plain-args")["options"]["args"] == [
        {"$secret": "env:P5_CLI"}
    ]
    line = fails(url, 2, "schedules", "create", "bad", "cli.backup", "--every", "1h",
                 "--input", '{"$secret": "vault:TOK"}')  # fmt: skip
    assert "must start with env: or setting: (given 'vault')" in line
    for text in [*outputs, journal_bytes(url).decode("utf-8", "replace")]:
        assert "cli-value-3c3c" not in text


def test_the_masking_pieces_each_show_references_only(app: Celery, durable: Durable) -> None:
    """P5 in one process: the retry receiver puts the shown arguments back, the pool's debug
    line is hidden, a worker request answers with the references; the publish fast path
    (D12) stays on with the receiver connected (it never sees such messages)."""
    from celery_durable.fast_publish import FastPath
    from celery_durable.message import SHOWN_ARGS_HEADER
    from celery_durable.worker.secret_masking import (
        HIDDEN,
        HideSecretArguments,
        restore_shown_args,
        shown_info,
    )

    shown = {"argsrepr": "[Secret('env:X')]", "kwargsrepr": "{}"}
    headers: dict[str, Any] = {"argsrepr": "['value-1']", SHOWN_ARGS_HEADER: shown}
    restore_shown_args(headers=headers)
    assert headers["argsrepr"] == "[Secret('env:X')]"
    plain = {"argsrepr": "['public']"}
    restore_shown_args(headers=plain)
    assert plain == {"argsrepr": "['public']"}
    raw = f"('t', 'id', {{'{SHOWN_ARGS_HEADER}': {{}}}}, b'[[\"value-1\"]')"
    record = logging.LogRecord(
        "celery.pool", logging.DEBUG, __file__, 1,
        "TaskPool: Apply %s (args:%s kwargs:%s)", (len, raw, "{}"), None,
    )  # fmt: skip
    assert HideSecretArguments().filter(record)
    assert "value-1" not in record.getMessage() and HIDDEN in record.getMessage()

    class Request:
        request_dict = {SHOWN_ARGS_HEADER: shown}

        def info(self, safe: bool = False) -> dict[str, Any]:
            return {"id": "r", "args": ["value-1"], "kwargs": {}}

    assert shown_info(Request.info)(Request()) == {
        "id": "r", "args": "[Secret('env:X')]", "kwargs": "{}"
    }  # fmt: skip
    assert FastPath(app).usable()  # the Durable above connected the receiver


# -- real beat and worker processes -------------------------------------------------------------

APP = "tests.e2e.secret_app"


def e2e_env(tmp_path: Path, redis_url: str, sqlite_url: str) -> tuple[Path, dict[str, str]]:
    """The folder the tasks write what they received to, and the processes' environment."""
    received = tmp_path / "received"
    received.mkdir()
    env = {"E2E_BROKER": redis_url, "CELERY_DURABLE_URL": sqlite_url, "E2E_RECEIVED": str(received)}
    return received, env


def test_beat_and_worker_processes_never_show_the_values(
    tmp_path: Path, redis_url: str, sqlite_url: str
) -> None:
    plain_token, setting_token, durable_token = (f"{n}-{uuid.uuid4().hex}" for n in "psd")
    received, base = e2e_env(tmp_path, redis_url, sqlite_url)
    shared = base | {"E2E_PLAIN_TOKEN": plain_token, "E2E_SETTING_TOKEN": setting_token}
    worker_env = shared | {"E2E_DURABLE_TOKEN": durable_token}  # beat does not have it
    setup = Durable(Celery("setup", set_as_current=False), sqlite_url)
    app = setup.app

    @app.task(name="secret.plain", shared=False)
    def plain(token: str, *, region: str = "", setting: str = "") -> None: ...  # pragma: no cover

    @setup.task(name="secret.durable", shared=False)
    def durable_job(run: ScheduledRun) -> None: ...  # pragma: no cover

    every = Every(timedelta(seconds=1))
    setup.schedules.create(
        "plain-secret",
        "secret.plain",
        None,
        every,
        args=[Secret("env:E2E_PLAIN_TOKEN")],
        kwargs={"region": "eu", "setting": Secret("setting:E2E_SETTING_TOKEN")},
    )
    setup.schedules.create(
        "durable-secret", "secret.durable", {"token": Secret("env:E2E_DURABLE_TOKEN")}, every
    )
    setup.schedules.create(
        "missing-secret", "secret.plain", None, every, args=[Secret("env:E2E_NOT_SET")]
    )
    setup.close()

    worker_cmd = python_command(
        "-m", "celery", "-A", APP, "worker", "--pool=solo", "-l", "DEBUG", "-n", "s@%h"
    )
    beat_cmd = python_command(
        "-m", "celery", "-A", APP, "beat", "-S", "durable", "-l", "DEBUG",
        "--schedule", str(tmp_path / "unused-beat-schedule"),
    )  # fmt: skip
    reader = Durable(Celery("reader", set_as_current=False), sqlite_url)

    def failed() -> int:
        return sum(r.state == "failed_to_start" for r in reader.schedules.runs("missing-secret"))

    with (
        running_process(worker_cmd, log_path=tmp_path / "worker.log", env=worker_env) as worker,
        running_process(beat_cmd, log_path=tmp_path / "beat.log", env=shared) as beat,
    ):
        wait_for(
            lambda: len(list(received.iterdir())) >= 2 and failed() >= 2,
            timeout=60,
            processes=[worker, beat],
        )
        logs = [worker.read_log(), beat.read_log()]
    got = {p.name: p.read_text() for p in received.iterdir()}
    assert f"{plain_token}|eu|{setting_token}" in got.values()
    assert got["durable-secret@durable"] == durable_token
    durable_run = next(r for r in reader.schedules.runs("durable-secret") if r.state == "started")
    [missing] = reader.schedules.runs("missing-secret")[:1]
    assert "env:E2E_NOT_SET" in str(missing.error)
    assert reader.schedules.state("missing-secret").next_due is not None
    reader.close()

    cli_env = base | {"E2E_PLAIN_TOKEN": plain_token, "E2E_SETTING_TOKEN": setting_token}
    outputs = []
    for args in (
        ("schedules", "show", "plain-secret"),
        ("schedules", "show", "durable-secret"),
        ("schedules", "list"),
        ("runs", "list", "--schedule", "plain-secret"),
        ("runs", "list", "--schedule", "missing-secret"),
        ("runs", "list", "--json"),
        ("runs", "show", durable_run.run_id),
        ("runs", "show", durable_run.run_id, "--json"),
        ("schedules", "history", "plain-secret"),
    ):
        done = run_child(
            python_command("-m", "celery", "-A", APP, "durable", *args),
            cwd=tmp_path,
            env=child_env(cli_env),
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout + done.stderr)
    assert "env:E2E_PLAIN_TOKEN" in outputs[0] and "env:E2E_NOT_SET" in outputs[4]
    journal = journal_bytes(sqlite_url)
    assert b"env:E2E_DURABLE_TOKEN" in journal
    for token in (plain_token, setting_token, durable_token):
        assert token.encode() not in journal
        for text in logs + outputs:
            assert token not in text


def test_retries_debug_lines_inspect_and_failed_durable_starts_never_show_the_values(
    tmp_path: Path, redis_url: str, sqlite_url: str
) -> None:
    """P5 with real beat and worker processes, at DEBUG: a plain task with a short schedule
    ID (the pool's debug line prints the raw message, cut at 1,024 characters: the value
    would fit), a plain task that retries (Celery publishes it again), ``celery inspect
    active``, ``reserved`` and ``scheduled`` while those run, and a durable task whose secret
    the worker cannot read (D5: failed to start, logged once per run, the schedule goes
    on). Every captured output and the journal file are searched for the values."""
    token = f"t-{uuid.uuid4().hex}"
    received, base = e2e_env(tmp_path, redis_url, sqlite_url)
    env = base | {"E2E_PLAIN_TOKEN": token}
    setup = Durable(Celery("setup", set_as_current=False), sqlite_url)
    app = setup.app
    for name in ("secret.plain", "secret.flaky", "secret.slow"):
        app.task(name=name, shared=False)(_never)

    @setup.task(name="secret.durable", shared=False)
    def durable_job(run: ScheduledRun) -> None: ...  # pragma: no cover

    ref = Secret("env:E2E_PLAIN_TOKEN")
    setup.schedules.create("p", "secret.plain", None, Every(timedelta(seconds=2)), args=[ref])
    setup.schedules.create("r", "secret.flaky", None, Every(timedelta(seconds=4)), args=[ref])
    setup.schedules.create(
        "w", "secret.slow", None, Every(timedelta(seconds=1)), args=[ref], queue="slow"
    )
    setup.schedules.create(
        "d", "secret.durable", {"token": Secret("env:E2E_NOT_SET")}, Every(timedelta(seconds=1))
    )
    setup.close()

    def worker(name: str, *args: str) -> list[str]:
        return python_command(
            "-m", "celery", "-A", APP, "worker", "--pool=threads", "-l", "DEBUG",
            "-n", f"{name}@%h", "--without-mingle", "--without-gossip", *args,
        )  # fmt: skip

    beat_cmd = python_command(
        "-m", "celery", "-A", APP, "beat", "-S", "durable", "-l", "DEBUG",
        "--schedule", str(tmp_path / "unused-beat-schedule"),
    )  # fmt: skip
    reader = Durable(Celery("reader", set_as_current=False), sqlite_url)
    inspected: dict[str, list[str]] = {"active": [], "reserved": [], "scheduled": []}

    def inspect(command: str) -> str:
        done = run_child(
            python_command("-m", "celery", "-A", APP, "inspect", command, "--timeout", "2"),
            cwd=tmp_path,
            env=child_env(env),
        )
        inspected[command].append(done.stdout + done.stderr)
        return done.stdout

    def failed(schedule: str) -> int:
        return sum(r.state == "failed_to_start" for r in reader.schedules.runs(schedule))

    def seen() -> bool:
        names = {p.name for p in received.iterdir()}
        looked = {
            "active": "secret.slow" in inspect("active")
            or any("secret.slow" in o for o in inspected["active"][:-1]),
            "reserved": any("secret.slow" in o for o in inspected["reserved"])
            or "secret.slow" in inspect("reserved"),
            "scheduled": any("secret.flaky" in o for o in inspected["scheduled"])
            or "secret.flaky" in inspect("scheduled"),
        }
        return (
            all(looked.values())
            and any(n.startswith("r@") and n.endswith("-retried") for n in names)
            and any(n.startswith("p@") for n in names)
            and failed("d") >= 2
        )

    with (
        running_process(worker("a", "-c", "2"), log_path=tmp_path / "a.log", env=env) as a,
        running_process(worker("b", "-c", "1", "-Q", "slow"), log_path=tmp_path / "b.log",
                        env=env) as b,
        running_process(beat_cmd, log_path=tmp_path / "beat.log", env=env) as beat,
    ):  # fmt: skip
        wait_for(seen, timeout=120, interval=0.5, processes=[a, b, beat])
        logs = [a.read_log(), b.read_log(), beat.read_log()]
    values = [(received / n).read_text() for n in sorted(p.name for p in received.iterdir())]
    assert values and {v.split("|")[0] for v in values} == {token}  # the tasks got the value
    # Celery showed each of these messages (its debug line, its received line, inspect).
    assert "TaskPool: Apply" in logs[0] and "(hidden: the message carries secret values" in logs[0]
    assert "secret.flaky" in logs[0] and "retry" in logs[0].lower()
    for command, outputs in inspected.items():
        assert any("env:E2E_PLAIN_TOKEN" in o for o in outputs), command
    # D5 for a durable task: failed to start in the worker, named, logged once per run.
    runs = [r for r in reader.schedules.runs("d") if r.state == "failed_to_start"]
    assert runs and all("env:E2E_NOT_SET" in str(r.error) for r in runs)
    lines = [line for line in logs[0].splitlines() if "can never start" in line]
    assert lines and all("env:E2E_NOT_SET" in line for line in lines)
    assert len(lines) == len({line.split("run '")[1].split("'")[0] for line in lines})
    assert reader.runs.row(runs[0].run_id)["status"] == "failed_to_start"
    assert reader.schedules.state("d").next_due is not None  # the schedule goes on
    reader.close()
    journal = journal_bytes(sqlite_url)
    assert token.encode() not in journal
    for text in logs + [o for outputs in inspected.values() for o in outputs]:
        assert token not in text


def _never(*args: Any, **kwargs: Any) -> None:  # pragma: no cover - registers a name only
    return None
