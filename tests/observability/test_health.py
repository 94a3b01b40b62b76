"""``celery durable health`` (O3): its exit codes against a real beat process (alive, then
killed with SIGKILL), a journal that cannot be reached, a dispatcher that stalls and a due run
that waits too long; and the facts it reads, with a fake clock."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from click.testing import Result

from celery_durable import Durable, Every
from celery_durable.observability.health import LAGGING, NO_DISPATCHER, OK, STALLED, check
from tests.cli.test_cli import cli
from tests.support.clock import T0, FakeClock
from tests.support.processes import python_command, running_process, wait_for
from tests.support.services import free_port

pytestmark = pytest.mark.timeout(60)


def health(url: str, *args: str) -> Result:
    return cli(url, "health", *args)


def code_of(url: str, *args: str) -> int:
    return health(url, *args).exit_code


@pytest.fixture
def app() -> Celery:
    app = Celery("health_tests", broker="memory://", set_as_current=False)

    @app.task(name="health.noop", shared=False)
    def backup() -> None:  # pragma: no cover - never run here
        pass

    return app


def test_a_live_beat_is_healthy_and_a_killed_one_is_not(
    sqlite_url: str, redis_url: str, tmp_path: Path
) -> None:
    env = {
        "E2E_BROKER": redis_url,
        "E2E_SINK": redis_url,
        "CELERY_DURABLE_URL": sqlite_url,
        "E2E_BEAT": "every",
        "E2E_LEASE": "2",
    }
    beat_cmd = python_command(
        "-m", "celery", "-A", "tests.e2e.beat_app", "beat", "-S", "durable", "-l", "INFO",
        "--schedule", str(tmp_path / "unused-beat-schedule"),
    )  # fmt: skip
    with running_process(beat_cmd, log_path=tmp_path / "beat.log", env=env) as beat:
        ok = wait_for(
            lambda: (r := health(sqlite_url)).exit_code == 0 and r,
            timeout=30,
            interval=0.3,
            processes=[beat],
        )
        assert ok.stdout.startswith("ok: dispatcher ") and "holds the lease" in ok.stdout
        data = __import__("json").loads(health(sqlite_url, "--json").stdout)
        assert data["healthy"] is True and data["status"] == "ok"
        assert data["holder"] == data["lease"]["owner"] and data["lease_age_seconds"] >= 0
        assert 0 <= data["last_tick_age_seconds"] < 4
        beat.kill()  # SIGKILL: nothing released, the lease must expire
        result = wait_for(
            lambda: (r := health(sqlite_url)).exit_code != 0 and r, timeout=10, interval=0.3
        )
    assert result.exit_code == 7, result.stderr
    assert result.stderr.startswith("Error: no dispatcher holds the lease: ")
    assert "expired" in result.stderr and len(result.stderr.splitlines()) == 1


def test_a_journal_that_cannot_be_reached() -> None:
    url = f"postgresql+psycopg://postgres:s3cret@127.0.0.1:{free_port()}/test"
    result = health(url)
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: journal unreachable: cannot open the journal at ")
    assert len(result.stderr.splitlines()) == 1 and "s3cret" not in result.stderr
    as_json = health(url, "--json")
    assert as_json.exit_code == 1 and '"status": "journal_unreachable"' in as_json.stdout


def test_lag_over_the_limit_and_a_stalled_dispatcher(sqlite_url: str, app: Celery) -> None:
    durable = Durable(app, sqlite_url)
    try:
        durable.journal.ensure_ready()  # health reads; it never creates a journal
        assert code_of(sqlite_url) == 7  # nobody ever held the lease
        assert "is celery beat running?" in health(sqlite_url).stderr
        durable.schedules.create("s", "health.noop", None, Every(timedelta(seconds=1)))
        dispatcher = durable.dispatcher(lease_ttl=60)
        dispatcher.tick()
        assert code_of(sqlite_url) == 0
        time.sleep(2.3)  # runs fall due; nobody ticks
        lagging = health(sqlite_url, "--max-lag", "1")
        assert lagging.exit_code == 9, lagging.stderr
        assert "schedule 's' has a run due " in lagging.stderr and "limit 1s" in lagging.stderr
        assert code_of(sqlite_url, "--max-lag", "30") == 0
        assert code_of(sqlite_url) == 0  # the default limit: durable_late_after, 60 s
        stalled = health(sqlite_url, "--max-tick-age", "1")
        assert stalled.exit_code == 8 and "last completed tick was" in stalled.stderr
        dispatcher.tick()  # sends what waited
        assert code_of(sqlite_url, "--max-lag", "1") == 0
        dispatcher.close()  # releases the lease
        assert code_of(sqlite_url) == 7
        assert code_of(sqlite_url, "--max-lag", "-1") == 2
    finally:
        durable.close()


@pytest.mark.parametrize("option", ["--max-lag", "--max-tick-age"])
@pytest.mark.parametrize("bad", ["nan", "inf", "1e400"])
def test_a_limit_that_is_no_finite_number_is_invalid_usage(
    sqlite_url: str, app: Celery, option: str, bad: str
) -> None:
    """O3: NaN compares false with every lag, so it would make any dispatcher healthy, and
    infinity is no JSON number; both are refused (exit 2) naming the option."""
    durable = Durable(app, sqlite_url)
    try:
        durable.schedules.create("s", "health.noop", None, Every(timedelta(seconds=1)))
        dispatcher = durable.dispatcher(lease_ttl=60)
        dispatcher.tick()
        refused = health(sqlite_url, option, bad)
        assert refused.exit_code == 2, refused.output
        assert option in refused.stderr and "finite" in refused.stderr
        assert code_of(sqlite_url, option, "30") == 0
        dispatcher.close()
    finally:
        durable.close()


def test_the_facts_with_a_fake_clock(durable: Durable, clock: FakeClock) -> None:
    limits = {"max_lag": 60.0, "max_tick_age": 20.0}
    facts = check(durable.runtime)
    assert (facts.lease, facts.waiting, facts.holder) == (None, None, None)
    assert facts.verdict(**limits)[0] == NO_DISPATCHER
    durable.schedules.create("every-min", "health.noop", None, Every(timedelta(minutes=1)))
    dispatcher = durable.dispatcher(lease_ttl=600)
    dispatcher.tick()
    facts = check(durable.runtime)
    assert facts.holder == dispatcher.lease.owner
    assert facts.lease is not None and facts.lease.taken_at == T0 and facts.lease.ticked_at == T0
    assert facts.verdict(**limits)[0] == OK
    clock.advance(seconds=90)  # due at T0+60s, waiting 30 s; last tick 90 s ago
    facts = check(durable.runtime)
    assert facts.waiting is not None and facts.waiting.schedule == "every-min"
    assert facts.lag == 30.0 and facts.tick_age == 90.0 and facts.lease_age == 90.0
    assert facts.verdict(**limits)[0] == STALLED
    assert facts.verdict(max_lag=10, max_tick_age=100)[0] == LAGGING
    dispatcher.tick()  # renews (half the lease passed? no: 90 of 600 s) and decides
    facts = check(durable.runtime)
    assert facts.waiting is None and facts.lag == 0.0
    assert facts.tick_age == 90.0  # the tick is stored with the next renewal, not every tick
    clock.advance(seconds=300)
    dispatcher.tick()  # half the lease gone: renewed, with the previous tick's time
    assert check(durable.runtime).lease.ticked_at == T0 + timedelta(seconds=90)  # type: ignore[union-attr]
    clock.advance(seconds=601)
    assert check(durable.runtime).verdict(**limits)[0] == NO_DISPATCHER
    dispatcher.close()


def test_the_health_gauges(durable: Durable, clock: FakeClock) -> None:
    from prometheus_client import CollectorRegistry

    from celery_durable.observability.metrics import install_metrics

    registry = CollectorRegistry()
    install_metrics(registry, durable=durable, gauge_ttl=0).disconnect()
    assert registry.get_sample_value("celery_durable_lease_held") == 0
    assert registry.get_sample_value("celery_durable_last_tick_age_seconds") is None
    durable.schedules.create("every-min", "health.noop", None, Every(timedelta(minutes=1)))
    dispatcher = durable.dispatcher(lease_ttl=600)
    dispatcher.tick()
    clock.advance(seconds=75)
    owner = dispatcher.lease.owner
    assert registry.get_sample_value("celery_durable_lease_held") == 1
    assert registry.get_sample_value("celery_durable_lease_holder", {"holder": owner}) == 1
    assert registry.get_sample_value("celery_durable_lease_age_seconds") == 75
    assert registry.get_sample_value("celery_durable_last_tick_age_seconds") == 75
    assert registry.get_sample_value("celery_durable_oldest_waiting_due_seconds") == 15
    dispatcher.close()
    assert registry.get_sample_value("celery_durable_lease_held") == 0
    assert registry.get_sample_value("celery_durable_lease_holder", {"holder": owner}) is None


def test_a_journal_written_before_heartbeats_gains_them(tmp_path: Path) -> None:
    """SPEC §9: the heartbeat table is new; an older journal gets it on its next start."""
    import shutil

    from tests.data.make_journal_v1 import BASE, FIXTURE, Clock, build

    copy = tmp_path / "journal-v1.sqlite"
    shutil.copyfile(FIXTURE, copy)
    clock = Clock(BASE + timedelta(minutes=70))
    durable, _ = build(f"sqlite:///{copy}", clock)
    try:
        assert check(durable.runtime).verdict(max_lag=60, max_tick_age=20)[0] == NO_DISPATCHER
        dispatcher = durable.dispatcher()
        dispatcher.tick()
        facts = check(durable.runtime)
        assert facts.lease is not None and facts.lease.ticked_at == clock.now
        assert facts.verdict(max_lag=60, max_tick_age=20)[0] == OK
        dispatcher.close()
    finally:
        durable.close()
