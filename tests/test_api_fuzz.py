"""Garbage into every public schedule call: documented exceptions only, nothing stored."""

from __future__ import annotations

import tempfile
from datetime import date, datetime, time, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_durable import (
    CatchUp,
    Cron,
    Daily,
    Durable,
    DurableError,
    Every,
    Once,
    Weekly,
    parse_run_id,
    run_id,
)

UTC = timezone.utc

weird_text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        ["", " ", "a~b", "x" * 10_000, "\x00", "'\";--", "%2F%", "\u202eevil", "\ud800", "é" * 40]
    ),
)
zones = st.one_of(
    st.sampled_from(
        [
            "UTC",
            "Europe/Oslo",
            "Australia/Lord_Howe",
            "Asia/Kathmandu",
            "Mars/Base",
            "",
            "../etc/passwd",
            "a\x00b",
        ]
    ),
    st.text(max_size=20),
)
times = st.one_of(st.times(), st.sampled_from(["02:00", "25:00", "2:0", "", "noon"]), st.integers())
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    weird_text,
)
inputs = st.recursive(
    st.one_of(json_leaf, st.binary(max_size=5), st.just(object())),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children),
        st.dictionaries(st.one_of(st.text(max_size=5), st.integers()), children, max_size=4),
    ),
    max_leaves=20,
)
deep = st.integers(min_value=50, max_value=400).map(lambda n: _nest(n))


def _nest(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def build_rule(kind: str, a: Any, b: Any, c: Any) -> Any:
    if kind == "daily":
        return Daily(a, b)
    if kind == "weekly":
        return Weekly(c, a, b)
    if kind == "every":
        return Every(c)
    if kind == "cron":
        return Cron(a, b)
    if kind == "once":
        return Once(c)
    return a


rule_args = st.tuples(
    st.sampled_from(["daily", "weekly", "every", "cron", "once", "raw"]),
    st.one_of(
        times,
        weird_text,
        st.sampled_from(["0 2 * * *", "0 0 31 2 *", "*/0 * * * *", "@daily", "61 * * * *"]),
    ),
    zones,
    st.one_of(
        st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=400)),
        st.datetimes(timezones=st.one_of(st.none(), st.just(UTC))),
        st.lists(st.one_of(st.integers(-2, 9), weird_text), max_size=3),
        st.none(),
        st.dates(),
    ),
)
policies = st.one_of(
    st.sampled_from(list(CatchUp)),
    st.sampled_from(["latest", "ALL", "nope", ""]),
    st.none(),
    st.integers(),
)
options = st.dictionaries(
    st.sampled_from(
        ["queue", "priority", "args", "kwargs", "expires", "overlap", "bogus", "headers"]
    ),
    st.one_of(
        json_leaf,
        st.lists(st.integers(), max_size=2),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    ),
    max_size=3,
)


@pytest.fixture(scope="module")
def durable() -> Durable:
    app = Celery("fuzz", broker="memory://", set_as_current=False)
    app.task(name="t", shared=False)(_noop)
    folder = Path(tempfile.mkdtemp())
    return Durable(
        app, f"sqlite:///{folder}/fuzz.db", clock=lambda: datetime(2026, 11, 2, 12, tzinfo=UTC)
    )


def _noop(*args: Any, **kwargs: Any) -> None:  # pragma: no cover - never runs
    return None


ALLOWED = (DurableError, TypeError)


def head(durable: Durable) -> int:
    return durable.journal.head()


@settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow], deadline=None
)
@given(
    sid=st.one_of(weird_text, st.integers(), st.none()),
    task=st.one_of(st.just("t"), weird_text, st.none()),
    input_=st.one_of(inputs, deep),
    rule=rule_args,
    catch_up=policies,
    opts=options,
)
def test_create_refuses_garbage_cleanly(
    durable: Durable, sid: Any, task: Any, input_: Any, rule: Any, catch_up: Any, opts: dict
) -> None:
    before = head(durable)
    try:
        built = build_rule(*rule)
        durable.schedules.create(sid, task, input_, built, catch_up, **opts)
    except ALLOWED:
        assert head(durable) == before, "a refused create stored something"
        return
    # Accepted: it reads back, and a second identical create stores nothing.
    view = durable.schedules.state(sid)
    assert view is not None and view.id == sid
    after = head(durable)
    durable.schedules.create(sid, task, input_, built, catch_up, **opts)
    assert head(durable) == after


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    sid=st.one_of(weird_text, st.integers(), st.none()),
    verb=st.sampled_from(["pause", "resume", "delete", "state", "runs", "trigger"]),
)
def test_other_calls_refuse_garbage_cleanly(durable: Durable, sid: Any, verb: str) -> None:
    before = head(durable)
    try:
        getattr(durable.schedules, verb)(sid)
    except ALLOWED:
        assert head(durable) == before
    # The journal is still readable after anything.
    durable.schedules.list()


@given(st.one_of(weird_text, st.integers(), st.none()))
def test_parse_run_id_refuses_garbage_with_value_error(text: Any) -> None:
    try:
        sid, due = parse_run_id(text)
    except (ValueError, TypeError):
        return
    assert run_id(sid, due) == text


def test_fuzz_strategies_cover_valid_creates(durable: Durable) -> None:
    durable.schedules.create("valid-one", "t", {"a": [1, 2.5, None]}, Daily(time(2), "Europe/Oslo"))
    assert durable.schedules.state("valid-one") is not None
    _ = date
