"""The wire format of a run's message (celery_durable.message): built once, read back the same.

Pure tests: what the dispatcher sends for plain and durable tasks (S2, S3, D7), the
``ScheduledRun`` a durable task receives, and the stored re-send record (D8) round-tripped
through JSON.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from hypothesis import given
from hypothesis import strategies as st

from celery_durable.core.ids import parse_due, run_id
from celery_durable.core.schedule_aggregate import PendingRun
from celery_durable.message import (
    BEAT_HEADER,
    DUE_HEADER,
    RUN_ID_HEADER,
    SCHEDULE_HEADER,
    SEND_OPTIONS,
    TRACK_END_HEADER,
    Resend,
    ScheduledRun,
    decode_args,
    message_json,
    run_message,
)

DUE = datetime(2026, 11, 2, 12, 0, 5, tzinfo=timezone.utc)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


def pending(**fields: object) -> PendingRun:
    values: dict[str, object] = {
        "due": DUE,
        "run_id": run_id("inv", DUE),
        "task": "invoice",
        "input": {"customer": "ada"},
    }
    values.update(fields)
    return PendingRun(**values)  # type: ignore[arg-type]


def test_plain_task_message_is_what_stock_beat_sends_plus_the_headers() -> None:
    options = {"queue": "billing", "priority": 3, "headers": {"tenant": "x"}, "bogus": 1}
    message = run_message("inv", pending(options=options), durable=False)
    assert message.args == [{"customer": "ada"}] and message.kwargs == {}
    assert message.options == {"queue": "billing", "priority": 3}
    assert set(message.options) <= set(SEND_OPTIONS)
    assert message.headers == {
        "tenant": "x",
        SCHEDULE_HEADER: "inv",
        DUE_HEADER: "2026-11-02T12:00:05.0000000Z",
        RUN_ID_HEADER: "inv@2026-11-02T12:00:05.0000000Z",
        BEAT_HEADER: True,
    }
    assert parse_due(message.headers[DUE_HEADER]) == DUE
    explicit = run_message("inv", pending(options={"args": [1], "kwargs": {"a": 2}}), durable=False)
    assert (explicit.args, explicit.kwargs) == ([1], {"a": 2})


def test_track_end_header_only_when_the_overlap_policy_needs_it() -> None:
    assert TRACK_END_HEADER not in run_message("inv", pending(), durable=False).headers
    tracked = run_message("inv", pending(track_end=True), durable=True)
    assert tracked.headers[TRACK_END_HEADER] is True


@given(schedule=st.text(min_size=1, max_size=20), value=json_values)
def test_a_durable_message_carries_a_scheduled_run_through_json(
    schedule: str, value: object
) -> None:
    message = run_message(schedule, pending(input=value), durable=True)
    args = json.loads(json.dumps(message.args))
    assert decode_args(args) == (ScheduledRun(schedule=schedule, due=DUE, input=value),)
    assert decode_args([1, {"a": 1}]) == (1, {"a": 1})


@given(
    args=st.lists(json_values, max_size=3),
    kwargs=st.dictionaries(st.text(max_size=5), json_values, max_size=3),
)
def test_resend_round_trips_its_stored_form(args: list[object], kwargs: dict[str, object]) -> None:
    resend = Resend(
        run_id="r@x", task="t", args=args, kwargs=kwargs, options={"queue": "q"}, headers={"h": 1}
    )
    stored = json.loads(json.dumps(resend.to_json()))
    assert Resend.from_json("r@x", "t", stored) == resend
    started = json.loads(json.dumps({"task": "t", **message_json(args, kwargs)}))
    assert Resend.from_json("r@x", "t", started) == Resend(
        run_id="r@x", task="t", args=args, kwargs=kwargs
    )
