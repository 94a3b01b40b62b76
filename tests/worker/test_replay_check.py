"""The replay check (W6, W14): stored runs, ended or still going, replayed against the current
code, storing nothing.

A changed step order is reported with the run ID and the first differing position; an
unchanged body reports nothing; a run still going (suspended in a sleep, waiting for a child)
is replayed up to where it will go next; the check neither sends a message nor appends an
event, and no step function runs. Through the API, the pytest helper and ``celery durable
replay``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery.bin.celery import celery as celery_main
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import func, select

from celery_durable import Every
from celery_durable.core.divergence import Divergence, first_divergence
from celery_durable.store.journal.schema import events
from celery_durable.testing import DurableHarness, TestClock, assert_replays
from celery_durable.worker.replay import check_runs
from tests.support import replay_app
from tests.support.clock import T0

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def harness(sqlite_url: str) -> Iterator[DurableHarness]:
    replay_app.reset()
    with DurableHarness(replay_app.app, sqlite_url, clock=TestClock(T0)) as h:
        h.start()
        yield h
    replay_app.reset()


def stored_events(h: DurableHarness) -> int:
    with h.durable.journal.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(events)).scalar_one())


def two_runs(h: DurableHarness) -> list[str]:
    replay_app.order.apply_async(task_id="by-hand-1")
    h.schedules.create("every-day", "replay.order", None, Every(timedelta(days=1)))
    h.advance(days=1, hours=3)
    ids = ["by-hand-1", h.schedules.runs("every-day")[0].run_id]
    assert [h.result(i) for i in ids] == [["A", "B"], ["A", "B"]]
    return ids


def cli(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        celery_main,
        ["-A", "tests.support.replay_app", "durable", "--url", url, "replay", *args],
        catch_exceptions=False,
    )
    return result.exit_code, result.stdout + result.stderr


def test_unchanged_body_reports_nothing(harness: DurableHarness, sqlite_url: str) -> None:
    two_runs(harness)
    replay_app.faults.apply_async(task_id="faults-1")
    harness.run_until_idle()
    assert harness.run_ended("faults-1") == "faulted"
    assert check_runs(harness.durable.runtime) == []
    assert_replays(harness)
    assert cli(sqlite_url, "--check") == (0, "every checked run replays on the stored path\n")


def test_a_swapped_step_order_is_reported_with_run_and_position(
    harness: DurableHarness, sqlite_url: str
) -> None:
    ids = two_runs(harness)
    calls, sent, stored = list(replay_app.CALLS), harness.seam.sent, stored_events(harness)
    replay_app.BODY["order"] = "ba"

    found = harness.replay_check()
    assert sorted(d.run_id for d in found) == sorted(ids)
    assert {(d.position, d.expected, d.found) for d in found} == {(0, ("a", "step"), ("b", "step"))}
    assert "at position 0: the journal holds step 'a' but the body now asks for step 'b'" in str(
        found[0]
    )
    with pytest.raises(AssertionError, match="2 run\\(s\\) would now take another path"):
        assert_replays(harness)
    code, out = cli(sqlite_url, "--check", "--json")
    assert code == 1
    reported = json.loads(out[: out.rindex("}") + 1])["divergent"]
    assert sorted(r["run_id"] for r in reported) == sorted(ids)
    assert {r["position"] for r in reported} == {0}
    code, out = cli(sqlite_url, "--check", "--schedule", "every-day")
    assert code == 1 and ids[1] in out and ids[0] not in out
    code, out = cli(sqlite_url, "--check", "--run", "by-hand-1")
    assert code == 1 and "'by-hand-1'" in out and ids[1] not in out
    # The runs ended on the test clock's 2026-11-03; the CLI's clock is the wall clock.
    assert cli(sqlite_url, "--check", "--since", "2026-11-01T00:00Z")[0] == 1
    assert cli(sqlite_url, "--check", "--since", "2026-11-04T00:00Z")[0] == 0

    # Nothing was sent, stored or executed by any of the checks.
    assert (replay_app.CALLS, harness.seam.sent, stored_events(harness)) == (calls, sent, stored)


def test_a_changed_later_position_and_a_shorter_body() -> None:
    stored = {0: ("a", "step"), 1: ("sleep", "sleep"), 2: ("b", "step")}
    assert first_divergence(stored, [("a", "step"), ("sleep", "sleep"), ("b", "step")],
                            body_ended=True) is None  # fmt: skip
    assert first_divergence(stored, [("a", "step"), ("now", "now")], body_ended=False) == (
        1, ("sleep", "sleep"), ("now", "now"),
    )  # fmt: skip
    assert first_divergence(stored, [("a", "step")], body_ended=True) == (
        1, ("sleep", "sleep"), None,
    )  # fmt: skip
    assert first_divergence(stored, [*stored.values(), ("c", "step")], body_ended=False) == (
        3, None, ("c", "step"),
    )  # fmt: skip
    text = str(Divergence(run_id="r", task="t", position=3, expected=None, found=("c", "step")))
    assert text == (
        "run 'r' (t) at position 3: the journal holds nothing (the run ended before it) "
        "but the body now asks for step 'c'"
    )


STEPS = st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["step", "sleep", "now"]))


@given(path=st.lists(STEPS, max_size=8), data=st.data())
def test_first_divergence_finds_exactly_the_first_changed_position(
    path: list[Any], data: Any
) -> None:
    stored = dict(enumerate(path))
    assert first_divergence(stored, path, body_ended=True) is None
    if not path:
        return
    k = data.draw(st.integers(0, len(path) - 1))
    other = data.draw(STEPS.filter(lambda step: step != path[k]))
    changed = [*path[:k], other, *path[k + 1 :]]
    assert first_divergence(stored, changed, body_ended=True) == (k, path[k], other)
    assert first_divergence(stored, path[:k], body_ended=True) == (k, path[k], None)


def test_bad_use_of_the_command_is_refused(harness: DurableHarness, sqlite_url: str) -> None:
    harness.durable.journal.ensure_ready()  # the check reads; it never creates a journal
    code, out = cli(sqlite_url)
    assert code == 2 and "give --check" in out
    code, out = cli(sqlite_url, "--check", "--run", "nope")
    assert code == 3 and "no durable run 'nope'" in out
    code, out = cli(sqlite_url, "--check", "--run", "x", "--since", "1d")
    assert code == 2 and "cannot be combined" in out


def old_and_new_runs(harness: DurableHarness, task: Any, old: str, new: str) -> None:
    """A run of ``task`` started by the code before the patch, then one by the code after."""
    task.apply_async(task_id=old)
    harness.run_until_idle()
    replay_app.BODY["patch"] = "new"
    task.apply_async(task_id=new)
    harness.run_until_idle()


def test_runs_of_the_old_code_take_the_old_branch_of_a_patch(
    harness: DurableHarness, sqlite_url: str
) -> None:
    old_and_new_runs(harness, replay_app.patching, "old-code", "new-code")
    assert [harness.result(i) for i in ("old-code", "new-code")] == [["A", "B"], ["B", "A"]]
    assert [s.position for s in harness.steps_of("old-code")] == [0, 1]
    assert [(s.name, s.kind) for s in harness.steps_of("new-code")] == [
        ("b-first", "patch"),
        ("b", "step"),
        ("a", "step"),
    ]

    code, out = cli(sqlite_url, "--check")
    assert code == 0, out
    assert out.splitlines() == [
        "run 'old-code' (replay.patching) takes the old branch of patch 'b-first' at position 0",
        "every checked run replays on the stored path",
    ]
    code, out = cli(sqlite_url, "--check", "--json")
    report = json.loads(out[: out.rindex("}") + 1])
    assert report["divergent"] == []
    assert [(o["run_id"], o["position"], o["change_id"]) for o in report["old_branch"]] == [
        ("old-code", 0, "b-first")
    ]
    # Without the patch the old run would park (W6): the check says so.
    replay_app.BODY["patch"] = "unguarded"
    found = harness.replay_check()
    assert {(d.run_id, d.position) for d in found} == {("new-code", 0)}


def test_parallel_branches_are_checked_at_their_dotted_positions(
    harness: DurableHarness, sqlite_url: str
) -> None:
    replay_app.branched.apply_async(task_id="branched-1")
    harness.run_until_idle()
    assert harness.result("branched-1") == ["A", "B"]
    assert cli(sqlite_url, "--check")[0] == 0
    replay_app.BODY["branches"] = "ba"
    code, out = cli(sqlite_url, "--check")
    assert code == 1
    assert (
        "run 'branched-1' (replay.branched) at position 0.0.0: "
        "the journal holds step 'a' but the body now asks for step 'b'"
    ) in out


# -- runs still going (W14) ---------------------------------------------------------------------


def test_suspended_runs_are_checked_up_to_where_they_will_go_next(
    harness: DurableHarness, sqlite_url: str
) -> None:
    """A run asleep in ``replay.order`` and a parent waiting for its sleeping child: the
    current code agrees with them so far; a changed first step would park both."""
    replay_app.order.apply_async(task_id="asleep")
    replay_app.parent.apply_async(task_id="waiting")
    harness.run_until_idle()
    rows = harness.durable.runs.rows(["asleep", "waiting", "waiting:1"])
    assert {rid: row["status"] for rid, row in rows.items()} == dict.fromkeys(
        ("asleep", "waiting", "waiting:1"), "suspended"
    )
    calls, sent, stored = list(replay_app.CALLS), harness.seam.sent, stored_events(harness)
    assert check_runs(harness.durable.runtime) == []
    assert cli(sqlite_url, "--check") == (0, "every checked run replays on the stored path\n")
    assert cli(sqlite_url, "--check", "--run", "waiting")[0] == 0

    replay_app.BODY.update(order="ba", parent="b")
    found = {d.run_id: d for d in harness.replay_check()}
    assert sorted(found) == ["asleep", "waiting"]
    assert (found["waiting"].position, found["waiting"].expected, found["waiting"].found) == (
        0,
        ("a", "step"),
        ("b", "step"),
    )
    assert str(found["asleep"]) == (
        "run 'asleep' (replay.order, still suspended) at position 0: the journal holds step "
        "'a' but the body now asks for step 'b'"
    )
    code, out = cli(sqlite_url, "--check", "--run", "asleep", "--json")
    assert code == 1
    report = json.loads(out[: out.rindex("}") + 1])
    assert [(d["run_id"], d["status"]) for d in report["divergent"]] == [("asleep", "suspended")]
    # Nothing was sent, stored or executed by any of the checks, and the runs sleep on.
    assert (replay_app.CALLS, harness.seam.sent, stored_events(harness)) == (calls, sent, stored)
    replay_app.reset()
    harness.advance(days=1, hours=1)
    assert harness.result("waiting") == ["A", "B"] and harness.result("asleep") == ["A", "B"]


def test_a_suspended_run_of_the_old_code_is_reported_on_the_old_branch(
    harness: DurableHarness, sqlite_url: str
) -> None:
    old_and_new_runs(harness, replay_app.patch_wait, "old-asleep", "new-asleep")
    code, out = cli(sqlite_url, "--check")
    assert (code, out.splitlines()) == (
        0,
        [
            "run 'old-asleep' (replay.patch_wait, still suspended) takes the old branch of "
            "patch 'b-first' at position 0",
            "every checked run replays on the stored path",
        ],
    )
    # Without the patch the old run would park when it wakes: the check says so now.
    replay_app.BODY["patch"] = "unguarded"
    found = harness.replay_check()
    assert {(d.run_id, d.position, d.status) for d in found} == {("new-asleep", 0, "suspended")}


def test_a_run_with_a_secret_input_replays_with_the_value_and_unreadable_is_not_a_divergence(
    harness: DurableHarness, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """P5 + W6: the check reads a ``setting:`` secret as the worker does (it was a false
    divergence: the check read only the environment); where the reference cannot be read,
    the run is reported as "cannot replay", not as a divergence, and the exit code stays 0."""
    from celery_durable import ScheduledRun, Secret
    from celery_durable.message import scheduled_message
    from celery_durable.worker.replay import CannotReplay, check_report, replay_run

    monkeypatch.setitem(replay_app.app.conf, "REPLAY_TOKEN", "tok-value-123")
    run = ScheduledRun("s", T0, {"token": Secret("setting:REPLAY_TOKEN")})
    args, kwargs, _ = scheduled_message(run)
    rid = "s@2026-11-02T12:00:00.0000000Z"
    replay_app.secretive.apply_async(args, kwargs, task_id=rid)
    harness.run_until_idle()
    assert harness.result(rid) == len("tok-value-123")
    runtime = harness.durable.runtime
    assert replay_run(runtime, rid) is None
    assert check_report(runtime, run_id=rid) == ([], [], [])
    assert cli(sqlite_url, "--check", "--run", rid) == (
        0,
        "every checked run replays on the stored path\n",
    )
    monkeypatch.delitem(replay_app.app.conf, "REPLAY_TOKEN")
    with pytest.raises(CannotReplay, match="cannot replay: secret setting:REPLAY_TOKEN"):
        replay_run(runtime, rid)
    found, old, cannot = check_report(runtime, run_id=rid)
    assert (found, old, [c.run_id for c in cannot]) == ([], [], [rid])
    assert check_runs(runtime, run_id=rid) == []
    code, out = cli(sqlite_url, "--check", "--run", rid)
    assert code == 0
    assert out.splitlines() == [
        f"run {rid!r} (replay.secret): cannot replay: secret setting:REPLAY_TOKEN cannot be "
        "resolved: no such setting",
        "every other checked run replays on the stored path",
    ]
    code, out = cli(sqlite_url, "--check", "--run", rid, "--json")
    assert json.loads(out)["cannot_replay"] == [
        {
            "run_id": rid,
            "task": "replay.secret",
            "reason": "secret setting:REPLAY_TOKEN cannot be resolved: no such setting",
        }
    ]
    assert "tok-value-123" not in out
