"""Blackout windows through the API and the real dispatcher (SPEC P4).

A fake clock, a real SQLite journal and a real Redis broker, as in ``test_dispatcher.py``.
"""

from __future__ import annotations

import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from hypothesis import HealthCheck, event, given, settings

from celery_durable import Blackout, Durable, Every, InvalidSchedule, OnBlackout, Once, run_id
from celery_durable.core.schedule_events import Content, RunDecided, RunSent, RunSkipped
from tests.core.test_blackouts_properties import cases, defer_rule, skip_rule
from tests.dispatch import test_dispatcher as base
from tests.dispatch.test_dispatcher import Broker
from tests.support.blackout_sim import outcomes
from tests.support.clock import T0, FakeClock

S = timedelta(seconds=1)
broker = base.broker


@pytest.fixture
def journal_url(sqlite_url: str) -> str:
    """SQLite alone for the ``durable`` fixture: the windows are the dispatcher's business."""
    return sqlite_url


def test_bad_blackout_options_store_nothing(durable: Durable) -> None:
    with pytest.raises(InvalidSchedule, match="on_blackout must be"):
        durable.schedules.create("b", "backup", "/srv", Every(60 * S), on_blackout="later")
    with pytest.raises(InvalidSchedule, match="list of Blackout"):
        durable.schedules.create("b", "backup", "/srv", Every(60 * S), blackouts="nightly")
    with pytest.raises(InvalidSchedule, match="must hold Blackout"):
        durable.blackouts.set([{"name": "x"}])  # type: ignore[list-item]
    assert durable.journal.head() == 0


def test_state_shows_the_windows_and_the_next_run_that_really_happens(durable: Durable) -> None:
    freeze = Blackout.between("freeze", T0 + 30 * S, T0 + 150 * S)
    durable.schedules.create("b", "backup", "/srv", Every(60 * S), blackouts=[freeze])
    view = durable.schedules.state("b")
    assert view is not None
    assert (view.blackouts, view.on_blackout) == ((freeze,), OnBlackout.SKIP)
    assert (view.next_due, view.next_run) == (T0 + 60 * S, T0 + 180 * S)
    durable.schedules.change(
        "b", "backup", "/srv", Every(60 * S), blackouts=[freeze], on_blackout="defer"
    )
    view = durable.schedules.state("b")
    assert view is not None and view.next_run == T0 + 150 * S
    durable.blackouts.set([Blackout.between("global", T0 + 150 * S, T0 + 200 * S)])
    [listed] = durable.schedules.list()
    assert listed.next_run == T0 + 200 * S  # one blackout of both windows
    # schedules.show (P4's name) is what the CLI's `schedules show` shows: the same view.
    shown = durable.schedules.show("b")
    assert shown is not None and shown == durable.schedules.state("b")
    assert durable.schedules.show("never-created") is None


def test_a_global_window_set_at_run_time_is_honoured(
    durable: Durable, clock: FakeClock, broker: Broker
) -> None:
    durable.schedules.create("b", "backup", "/srv", Every(10 * S))
    d = durable.dispatcher()
    d.tick()
    assert durable.blackouts.set([Blackout.between("deploy", T0 + 15 * S, T0 + 35 * S)], by="ops")
    assert not durable.blackouts.set([Blackout.between("deploy", T0 + 15 * S, T0 + 35 * S)])
    for seconds in range(1, 41):
        clock.set(T0 + seconds * S)
        d.tick()
    events = durable._store.events("b")
    assert [e.due - T0 for e in events if isinstance(e, RunSent)] == [10 * S, 40 * S]
    assert [(e.due - T0, e.reason) for e in events if isinstance(e, RunSkipped)] == [
        (20 * S, "blackout deploy"),
        (30 * S, "blackout deploy"),
    ]
    assert len(broker.ids()) == 2
    assert durable.blackouts.clear()
    assert durable.blackouts.get() == ()
    clock.set(T0 + 50 * S)
    d.tick()
    assert len(broker.ids()) == 1
    d.close()


@pytest.mark.parametrize("ahead", [0.5, 1.0, 0.001])
def test_a_global_window_stored_just_before_a_due_time_is_honoured(
    durable: Durable, clock: FakeClock, broker: Broker, ahead: float
) -> None:
    """P4: the dispatcher reads the global windows each time it decides, so a window stored
    half a second (or a second, or a millisecond) before a due time stops its run, even
    though the dispatcher last looked at them a moment earlier: when it decided another
    schedule's run, 0.1 s before the store."""
    durable.schedules.create("b", "backup", "/srv", Every(10 * S))
    due = T0 + 10 * S
    looked = due - timedelta(seconds=ahead + 0.1)
    durable.schedules.create("other", "backup", "/tmp", Once(looked))
    d = durable.dispatcher()
    for moment in (T0, looked):
        clock.set(moment)
        d.tick()
    clock.set(due - timedelta(seconds=ahead))
    durable.blackouts.set([Blackout.between("hotfix", due - timedelta(seconds=ahead), due + S)])
    clock.set(due)
    d.tick()
    events = durable._store.events("b")
    assert [(e.due, e.reason) for e in events if isinstance(e, RunSkipped)] == [
        (due, "blackout hotfix")
    ]
    assert broker.ids() == [run_id("other", looked)]  # decided while the windows were read
    d.close()


def test_defer_sends_one_run_when_the_window_ends(
    durable: Durable, clock: FakeClock, broker: Broker
) -> None:
    window = Blackout.between("maintenance", T0 + 5 * S, T0 + 35 * S)
    durable.schedules.create(
        "b", "backup", "/srv", Every(10 * S), blackouts=[window], on_blackout="defer"
    )
    d = durable.dispatcher()
    sent: dict[int, list[str]] = {}
    for seconds in range(0, 38):
        clock.set(T0 + seconds * S)
        d.tick()
        ids = broker.ids()
        if ids:
            sent[seconds] = ids
    assert sent == {35: ["b@2026-11-02T12:00:10.0000000Z"]}
    [decided] = [e for e in durable._store.events("b") if isinstance(e, RunDecided)]
    assert (decided.send_at, decided.blackout) == (T0 + 35 * S, "maintenance")
    d.close()


def test_a_v1_journal_reads_as_having_no_windows(tmp_path: Path) -> None:
    """§9: schedules and runs written before P4 read as no windows, no deferred runs."""
    from tests.data.make_journal_v1 import BASE, FIXTURE, Clock, build
    from tests.store.test_upgrade import copy_of

    copy = copy_of(FIXTURE, tmp_path)
    durable, _ = build(f"sqlite:///{copy}", Clock(BASE + timedelta(minutes=66)))
    v1_pending = datetime(2026, 11, 2, 13, 5, tzinfo=timezone.utc)
    try:
        views = durable.schedules.list(include_deleted=True)
        assert views and {(v.blackouts, v.on_blackout) for v in views} == {((), OnBlackout.SKIP)}
        # The next run is the next due time, or the decided run still waiting to be sent.
        assert all(v.next_run == v.next_due for v in views if not v.pending)
        assert {v.id: v.next_run for v in views if v.pending} == {"pending-5m": v1_pending}
        assert durable.blackouts.get() == ()
    finally:
        durable.close()


def _start_beat(url: str, windows: object) -> None:
    """Start and stop a beat scheduler of a fresh app with this ``durable_blackouts``."""
    from celery_durable.beat import DurableScheduler

    beat_app = Celery("beat", broker="memory://", set_as_current=False)
    beat_app.conf.update(durable_url=url, durable_blackouts=windows)
    DurableScheduler(beat_app, lazy=False).close()


def test_durable_blackouts_is_brought_into_the_journal_when_beat_starts(
    sqlite_url: str, clock: FakeClock
) -> None:
    """The setting is the start-up value: set, it replaces the journal's list (once: the
    same list again stores nothing); unset, the journal's list is left alone."""
    freeze = Blackout.between("freeze", T0, T0 + 60 * S)
    reader = Durable(Celery("reader", set_as_current=False), sqlite_url, clock=clock)
    try:
        reader.blackouts.set([Blackout.between("old", T0, T0 + S)])
        _start_beat(sqlite_url, [freeze])
        _start_beat(sqlite_url, [freeze])
        assert reader.blackouts.get() == (freeze,)
        assert len(reader.journal.read_stream("settings/blackouts")) == 2  # old, then freeze
        reader.blackouts.clear()
        _start_beat(sqlite_url, None)
        assert reader.blackouts.get() == ()
        assert len(reader.journal.read_stream("settings/blackouts")) == 3
    finally:
        reader.close()


def test_the_dispatcher_core_honours_durable_blackouts_without_beat(
    app: Celery, sqlite_url: str, clock: FakeClock, broker: Broker
) -> None:
    """P4: the setting's windows apply to every schedule also when the dispatcher runs
    without beat (``durable.dispatcher().tick()``, SPEC §8): its first tick brings them in."""
    app.conf.durable_blackouts = [Blackout.between("freeze", T0 + 15 * S, T0 + 35 * S)]
    durable = Durable(app, sqlite_url, clock=clock)
    try:
        durable.schedules.create("b", "backup", "/srv", Every(10 * S))
        d = durable.dispatcher()
        for seconds in range(41):
            clock.set(T0 + seconds * S)
            d.tick()
        runs = {r.due - T0: (r.state, r.error) for r in durable.schedules.runs("b")}
        assert runs == {
            10 * S: ("started", None),
            20 * S: ("skipped", "blackout freeze"),
            30 * S: ("skipped", "blackout freeze"),
            40 * S: ("started", None),
        }
        assert len(broker.ids()) == 2
        assert durable.blackouts.get() == (app.conf.durable_blackouts[0],)
        d.close()
    finally:
        durable.close()


def test_beat_refuses_a_durable_blackouts_setting_that_is_not_a_list_of_windows(
    app: Celery, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from celery_durable.beat import DurableScheduler

    app.conf.durable_url = sqlite_url
    app.conf.durable_blackouts = ["nightly;cron 0 2 * * *;2h"]
    with pytest.raises(SystemExit) as stopped:
        DurableScheduler(app, lazy=False)
    assert stopped.value.code == 1
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "cannot start: durable_blackouts must hold Blackout windows, not str" in line


# P4 through the dispatcher: the same properties as the pure tests -------------------------------


def _backup(folder: str) -> str:  # pragma: no cover - the tests read the journal
    return folder


def _dispatch(case: dict[str, Any], content: Content, windows: tuple[Blackout, ...]) -> Any:
    """One schedule through a real dispatcher (SQLite file, in-memory broker, fake clock):
    ticked at the case's moments, global windows set through ``durable.blackouts``."""
    clock = FakeClock(case["t0"])
    memory = Celery("p4", broker="memory://", set_as_current=False)
    memory.task(name="backup", shared=False)(_backup)
    with tempfile.TemporaryDirectory() as folder:
        durable = Durable(memory, f"sqlite:///{folder}/journal.db", clock=clock)
        try:
            durable.blackouts.set(windows, by="test")
            durable.schedules.create(
                "s",
                "backup",
                "/srv",
                content.rule,
                content.catch_up,
                blackouts=list(content.blackouts),
                on_blackout=content.on_blackout,
                jitter=content.timing.jitter,
                start_deadline=content.timing.start_deadline,
            )
            d = durable.dispatcher()
            for moment in case["ticks"]:
                clock.set(moment)
                d.tick()
            d.close()
            return outcomes(durable._store.events("s"))
        finally:
            durable.close()


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(cases())
def test_through_the_dispatcher_no_run_starts_inside_a_window(case: dict[str, Any]) -> None:
    """P4 end to end in one process: the dispatcher, the journal and the broker publish give
    the outcomes the pure aggregate promises (skip and defer), the global windows read from
    the journal as a running dispatcher reads them."""
    ticks = case["ticks"][::3]  # a tick every few minutes: each one is a real tick
    case = {**case, "ticks": ticks}
    every = [*case["content"].blackouts, *case["global"]]
    plain = Content(**{**case["content"].__dict__, "blackouts": ()})
    for mode, rule in ((OnBlackout.SKIP, skip_rule), (OnBlackout.DEFER, defer_rule)):
        guarded = Content(**{**case["content"].__dict__, "on_blackout": mode})
        without, with_ = _dispatch(case, plain, ()), _dispatch(case, guarded, case["global"])
        rule(without, with_, every)
        moved = sum(1 for d, o in without.items() if o != with_.get(d))
        event(f"{mode.value}: due times a window changed: {min(moved, 3)}")


def test_durable_blackouts_is_read_with_the_other_settings() -> None:
    """It is part of the frozen configuration (``DurableConfig.blackouts``), checked when it
    is read: a ``ConfigError`` naming the setting."""
    from celery_durable.config import ConfigError, DurableConfig

    freeze = Blackout.between("freeze", T0, T0 + 60 * S)
    assert DurableConfig.from_app({"durable_blackouts": [freeze]}).blackouts == (freeze,)
    assert DurableConfig.from_app({}).blackouts is None
    for bad, words in (
        (["nightly;cron 0 2 * * *;2h"], "durable_blackouts must hold Blackout windows, not str"),
        (freeze, "durable_blackouts must be a list of Blackout windows"),
        ([freeze, freeze], "durable_blackouts: the name 'freeze' is given twice"),
    ):
        with pytest.raises(ConfigError, match=words):
            DurableConfig.from_app({"durable_blackouts": bad})
