"""Hostile input (S1, A1, W5): the public API and the CLI under garbage, the stored forms, secrets.

Builds on ``tests/test_api_fuzz.py`` (whose strategies it reuses) with: hostile schedule IDs
(quotes, ``%``, NUL, RTL marks, 10k characters), the durable-run API (signal, cancel, outcome),
the CLI in-process (``celery … durable`` through click's ``CliRunner``, exit codes from
docs/cli.md), the input size limit, a scan of everything stored and sent for pickle, and
database passwords in logs and CLI output.

Examples per test: ``HYPOTHESIS_PROFILE=ci`` (default, 100) or ``long`` (10,000).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import sqlite3
import tempfile
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from celery import Celery
from celery.bin.celery import celery as celery_main
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_durable import (
    CatchUp,
    Durable,
    DurableError,
    Every,
    InvalidSchedule,
    Retry,
    sleep,
    wait_signal,
)
from tests.support import services
from tests.test_api_fuzz import build_rule, inputs, policies, rule_args, weird_text

UTC = timezone.utc
NOW = datetime(2026, 11, 2, 12, tzinfo=UTC)
MAX = 256 * 1024

hostile_ids = st.one_of(
    weird_text,
    st.sampled_from(
        [
            "it's",
            'say "hi"',
            "100%",
            "%00%ff%",
            "a\x00b",
            "\u200fright-to-left\u200f",
            "\u202eevil\u202c",
            "x" * 10_000,
            "x" * 200,
            "🙂" * 60,
            "a/b\\c",
            "run@2026-01-01T00:00:00.0000000Z",
            "  padded  ",
            "\n",
        ]
    ),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=300),
)
huge = st.sampled_from(["y" * (MAX + 1), ["z" * 1000] * 300, {"k": "é" * (MAX // 2 + 1)}])
numbers = st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 2**70])
hostile_inputs = st.one_of(inputs, huge, numbers, st.lists(numbers, max_size=3))

ALLOWED = (DurableError, TypeError)
"""Documented: ``InvalidSchedule``/``ScheduleConflict``/``UnknownTask`` (all ``DurableError``;
``InvalidSchedule`` is also a ``ValueError``) and ``TypeError`` for values of the wrong type."""


def _noop(*args: Any, **kwargs: Any) -> None:  # pragma: no cover - never runs
    return None


@pytest.fixture(scope="module")
def durable() -> Any:
    app = Celery("hostile", broker="memory://", set_as_current=False)
    app.conf.update(task_ignore_result=True, task_always_eager=False)
    app.task(name="t", shared=False)(_noop)
    folder = Path(tempfile.mkdtemp())
    made = Durable(app, f"sqlite:///{folder}/hostile.db", clock=lambda: NOW)

    @made.step(name="echo")
    def echo(value: Any) -> Any:
        return value

    @made.task(name="hostile.job")
    def job(value: Any = None) -> Any:
        return echo(value)

    made.job = job  # type: ignore[attr-defined]
    yield made
    made.close()


def readable(durable: Durable) -> None:
    """The journal is still readable: every schedule, every event's data parses."""
    durable.schedules.list(include_deleted=True)
    with durable.journal.engine.connect() as conn:
        for (data,) in conn.exec_driver_sql("SELECT data FROM celery_durable_events"):
            json.loads(data)


# -- the public API ------------------------------------------------------------------------------


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(sid=hostile_ids, input_=hostile_inputs, rule=rule_args, catch_up=policies)
def test_create_with_hostile_ids_and_inputs(
    durable: Durable, sid: Any, input_: Any, rule: Any, catch_up: Any
) -> None:
    before = durable.journal.head()
    try:
        durable.schedules.create(sid, "t", input_, build_rule(*rule), catch_up)
    except ALLOWED:
        assert durable.journal.head() == before, "a refused create stored something"
    else:
        view = durable.schedules.state(sid)
        assert view is not None and view.id == sid and view.input == input_
    readable(durable)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    rid=hostile_ids,
    verb=st.sampled_from(["signal", "cancel", "outcome", "result", "run_ended"]),
    name=hostile_ids,
    payload=hostile_inputs,
)
def test_durable_run_api_with_hostile_ids(
    durable: Durable, rid: Any, verb: str, name: Any, payload: Any
) -> None:
    before = durable.journal.head()
    try:
        if verb == "signal":
            durable.signal(rid, name, payload)
        elif verb in ("outcome", "result"):
            getattr(durable, verb)(rid, 0)
        else:
            getattr(durable, verb)(rid)
    except (*ALLOWED, ValueError, LookupError, TimeoutError):
        # Refused (or "no such run"): nothing stored.
        assert durable.journal.head() == before
    readable(durable)


def test_input_above_the_limit_is_refused_with_a_clear_error(durable: Durable) -> None:
    before = durable.journal.head()
    with pytest.raises(InvalidSchedule, match=r"bytes as JSON; at most 262144 allowed"):
        durable.schedules.create("too-big", "t", "y" * MAX, Every(timedelta(seconds=60)))
    assert durable.journal.head() == before
    # Just under the limit (the JSON string has two quotes) is accepted.
    durable.schedules.create("just-fits", "t", "y" * (MAX - 2), Every(timedelta(seconds=60)))


def test_the_limit_is_configurable(tmp_path: Path) -> None:
    app = Celery("limit", broker="memory://", set_as_current=False)
    app.conf.durable_max_input_bytes = 1000
    app.task(name="t", shared=False)(_noop)
    durable = Durable(app, f"sqlite:///{tmp_path}/limit.db")
    try:
        with pytest.raises(InvalidSchedule, match="at most 1000 allowed"):
            durable.schedules.create("a", "t", "y" * 999, Every(timedelta(seconds=60)))
        durable.schedules.create("b", "t", "y" * 998, Every(timedelta(seconds=60)))
        with pytest.raises(InvalidSchedule, match="at most 1000 allowed"):
            durable.schedules.change("b", "t", {"k": "y" * 1000}, Every(timedelta(seconds=60)))
        assert durable.schedules.state("b").input == "y" * 998  # type: ignore[union-attr]
    finally:
        durable.close()


# -- the CLI -------------------------------------------------------------------------------------

CLI_EXIT = {0, 2, 3, 4}
"""docs/cli.md: done, invalid input, not found, conflict (1 is "journal unreachable")."""

cli_rule = st.one_of(
    st.tuples(st.just("--every"), st.sampled_from(["30s", "1h30m", "0", "-5", "1e9", "x", ""])),
    st.tuples(st.just("--cron"), st.sampled_from(["0 2 * * *", "0 0 31 2 *", "* * *", "@daily"])),
    st.tuples(st.just("--daily"), st.sampled_from(["02:00", "25:00", "2", ""])),
    st.tuples(st.just("--weekly"), st.sampled_from(["mon@08:00", "xyz@08:00", "mon-fri@9"])),
    st.tuples(st.just("--once"), st.sampled_from(["2030-06-01T10:00Z", "2030-06-01", "soon"])),
    st.tuples(st.sampled_from(["--every", "--cron", "--daily", "--weekly", "--once"]), weird_text),
)
cli_json = st.one_of(
    st.sampled_from(["{oops", "NaN", "Infinity", "[" * 2000 + "]" * 2000, '"' + "q" * MAX + '"']),
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), weird_text),
        lambda kids: st.one_of(
            st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=5), kids, max_size=4)
        ),
        max_leaves=20,
    ).map(lambda v: json.dumps(v, allow_nan=True)),
    weird_text,
)


def _cli_text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


@pytest.fixture(scope="module")
def cli_url() -> str:
    url = f"sqlite:///{tempfile.mkdtemp()}/cli.db"
    assert cli(url, "db", "init").exit_code == 0  # reading commands never create the journal
    return url


def cli(url: str, *args: str) -> Any:
    return CliRunner().invoke(
        celery_main,
        ["-A", "tests.e2e.cli_app", "durable", "--url", url, *args],
        catch_exceptions=False,
    )


def _head(url: str) -> int:
    path = url.split("///", 1)[1]
    if not Path(path).exists():
        return 0
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT coalesce(max(position), 0) FROM celery_durable_events")
                   .fetchone()[0])  # fmt: skip
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    sid=hostile_ids,
    task=st.one_of(st.sampled_from(["cli.backup", "cli.invoice", "nope"]), weird_text),
    rule=cli_rule,
    zone=st.one_of(st.none(), st.sampled_from(["UTC", "Europe/Oslo", "Mars/Base", "", "\x00"])),
    input_=st.one_of(st.none(), cli_json),
    catch_up=st.one_of(st.none(), st.sampled_from(["latest", "all", "none", "ALL", "x"])),
    verb=st.sampled_from(["create", "change", "pause", "resume", "delete", "show", "trigger"]),
)
def test_cli_with_hostile_arguments(
    cli_url: str, sid: str, task: str, rule: Any, zone: Any, input_: Any, catch_up: Any, verb: str
) -> None:
    args: list[str] = ["schedules", verb, sid]
    if verb in ("create", "change"):
        if verb == "create":
            args.append(task)
        args.extend(rule)
        if zone is not None:
            args += ["--zone", zone]
        if input_ is not None:
            args += ["--input", _cli_text(input_)]
        if catch_up is not None:
            args += ["--catch-up", catch_up]
    elif verb == "delete":
        args.append("--yes")
    before = _head(cli_url)
    result = cli(cli_url, *args)
    assert result.exit_code in CLI_EXIT, (args[:6], result.exit_code, result.output[-2000:])
    assert "Traceback" not in result.output
    if result.exit_code != 0:
        assert _head(cli_url) == before, "a refused command stored something"
        assert result.stderr.startswith("Error: "), result.stderr[:500]
    assert cli(cli_url, "schedules", "list", "--all").exit_code == 0


def test_cli_refuses_an_input_above_the_limit(cli_url: str) -> None:
    before = _head(cli_url)
    result = cli(cli_url, "schedules", "create", "big", "cli.invoice", "--every", "30s",
                 "--input", json.dumps("q" * MAX))  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "at most 262144 allowed" in result.stderr
    assert _head(cli_url) == before


# -- stored forms and messages: JSON, never pickle -------------------------------------------------

PICKLE_MARKS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"cpickle", b"c__builtin__")


def _scan_sqlite(path: Path) -> dict[str, int]:
    """Every column of every table: no BLOB, no pickle opcodes; JSON columns parse."""
    conn = sqlite3.connect(path)
    conn.text_factory = bytes
    counts: dict[str, int] = {}
    try:
        query = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        tables = [r[0].decode() for r in conn.execute(query)]
        for table in tables:
            cols = [r[1].decode() for r in conn.execute(f'PRAGMA table_info("{table}")')]
            for col in cols:
                for value, kind in conn.execute(f'SELECT "{col}", typeof("{col}") FROM "{table}"'):
                    assert kind != b"blob", f"{table}.{col} holds a BLOB"
                    if isinstance(value, bytes):
                        assert not any(m in value for m in PICKLE_MARKS), f"{table}.{col}"
                        if col in ("data", "state", "message"):
                            json.loads(value)
                    counts[f"{table}.{col}"] = counts.get(f"{table}.{col}", 0) + 1
    finally:
        conn.close()
    return counts


def test_journal_and_messages_are_json_never_pickle(tmp_path: Path) -> None:
    """A journal with every kind of event, and the messages the dispatcher sends, scanned.

    The broker is a private ``redis-server``: the shared one is flushed by other tests."""
    import redis

    handle = services.start_throwaway_redis()
    redis_url = handle.url

    clock = {"now": NOW}
    app = Celery(f"scan-{uuid.uuid4().hex[:6]}", broker=redis_url, set_as_current=False)
    app.conf.update(task_ignore_result=True, task_default_queue=f"scan-{uuid.uuid4().hex[:6]}")
    durable = Durable(app, f"sqlite:///{tmp_path}/scan.db", clock=lambda: clock["now"])
    app.task(name="scan.plain", shared=False)(_noop)

    @durable.step(name="s", retry=Retry.none())
    def s(value: Any) -> Any:
        return value

    @durable.task(name="scan.job")
    def job(run: Any = None) -> Any:
        value = s({"nested": [1, 2.5, None, "é"]})
        sleep(0)
        got = wait_signal("go", timeout=0)
        return {"value": value, "got": got}

    try:
        queue_name = app.conf.task_default_queue
        durable.schedules.create(
            "p", "scan.plain", {"a": [1]}, Every(timedelta(seconds=5)), CatchUp.ALL,
            queue=queue_name, priority=3,
        )  # fmt: skip
        durable.schedules.create("d", "scan.job", {"b": "x"}, Every(timedelta(seconds=5)))
        durable.schedules.create("gone", "scan.plain", None, Every(timedelta(seconds=5)))
        durable.schedules.pause("p")
        durable.schedules.resume("p")
        durable.schedules.delete("gone")
        dispatcher = durable.dispatcher()
        for _ in range(4):
            clock["now"] += timedelta(seconds=5)
            dispatcher.tick()
        durable.signal("scan-run", "go", {"payload": [1, 2]})
        job.apply(task_id="scan-run")
        durable.cancel("scan-run")
        dispatcher.close()
        counts = _scan_sqlite(tmp_path / "scan.db")
        assert counts.get("celery_durable_events.data", 0) >= 15
        queue = redis.Redis.from_url(redis_url)
        try:
            # Priority messages sit in their own lists ("<queue>\x06\x16<priority>").
            raw = [
                m
                for key in queue.keys(f"{app.conf.task_default_queue}*")
                for m in queue.lrange(key, 0, -1)
            ]
        finally:
            queue.close()
        assert len(raw) >= 6, "the dispatcher sent nothing"
        for message in raw:
            assert not any(m in message for m in PICKLE_MARKS)
            envelope = json.loads(message)
            assert envelope["content-type"] == "application/json"
            assert envelope["content-encoding"] == "utf-8"
            body = json.loads(base64.b64decode(envelope["body"]))
            assert isinstance(body, list) and len(body) == 3
            json.dumps(envelope["headers"])  # headers are JSON all the way down
            assert envelope["headers"]["id"] == envelope["headers"]["durable_run_id"]
    finally:
        durable.close()
        handle.stop()


# -- secrets -------------------------------------------------------------------------------------

SECRET = "s3cr3t-Pw-" + uuid.uuid4().hex[:8]


def _with_password(url: str, port: int | None = None) -> str:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{parts.username or 'postgres'}:{SECRET}@{host}:{port or parts.port or 5432}"
    return url.replace(parts.netloc, netloc, 1)


def test_passwords_never_logged_by_dispatcher_and_beat(
    pg_url: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """PostgreSQL (trust auth here) ignores the password: the journal works, and nothing that
    the dispatcher, the beat scheduler or the journal logs shows it; nor when it is down."""
    from celery_durable.beat import DurableScheduler

    caplog.set_level(logging.DEBUG)
    for url in (_with_password(pg_url), _with_password(pg_url, port=1)):
        app = Celery(f"secret-{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
        app.conf.update(durable_url=url, task_ignore_result=True, beat_schedule={})
        app.task(name="secret.t", shared=False)(_noop)
        durable = Durable(app)
        texts = [repr(durable), str(durable.config.url != url)]
        try:
            durable.schedules.create("s", "secret.t", None, Every(timedelta(seconds=1)))
            durable.dispatcher().tick()
        except Exception as exc:  # the unreachable one
            texts.append(f"{type(exc).__name__}: {exc}")
        scheduler = DurableScheduler(app=app, lazy=True)
        texts.append(scheduler.info)
        try:
            scheduler.setup_schedule()
            scheduler.tick()
        except Exception as exc:
            texts.append(f"{type(exc).__name__}: {exc}")
        finally:
            scheduler.close()
            durable.close()
        texts.append(repr(durable))
        for text in texts:
            assert SECRET not in text
    out = capsys.readouterr()
    assert SECRET not in caplog.text
    assert SECRET not in out.out + out.err
    assert caplog.records, "nothing was logged: the test saw nothing"


def test_passwords_never_printed_by_the_cli(pg_url: str) -> None:
    for url in (_with_password(pg_url), _with_password(pg_url, port=1)):
        for args in (["schedules", "list"], ["schedules", "show", "nope"], ["db", "init"],
                     ["--json", "runs", "list"]):  # fmt: skip
            result = CliRunner().invoke(
                celery_main, ["-A", "tests.e2e.cli_app", "durable", "--url", url, *args]
            )
            assert SECRET not in result.output, (args, result.output)
            assert SECRET not in repr(result.exception or "")
