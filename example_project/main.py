"""``python -m example_project``: create the schedules, run a worker and beat, show a demo.

1. Create the two jobs' schedules (idempotent: a second start changes nothing) and print
   each one's next run in Oslo time.
2. Start ``celery worker --pool=solo`` and ``celery beat -S durable`` as child processes.
3. Create a demo schedule every 2 s limited to three runs; wait until it has decided them,
   delete it, and read the three results back by run ID.
4. Report the jobs' runs that beat decided during this session: the catch-up of due times
   that passed while nothing ran.
5. Stop beat and the worker, and exit 0 (1 if something failed).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

from kombu.utils.url import maybe_sanitize_url

from celery_durable import (
    CatchUp,
    Durable,
    Every,
    Faulted,
    Finished,
    RunView,
    ScheduleConflict,
)
from celery_durable.store.journal.urls import redact
from example_project.schedules import JOBS, ensure_schedules
from example_project.services import ServiceDied, Services
from example_project.settings import ZONE, Settings

DEMO_RUNS = 3
DEMO_INTERVAL = timedelta(seconds=2)
TIMEOUT = 90.0
"""Seconds to wait for the demo's runs and results before giving up."""

SAMPLE_DOCUMENTS = {
    "notes.txt": "Backups run every night at 02:00 Oslo time.\n",
    "todo.txt": "- invoice Ada every Monday\n",
    "readme.txt": "Files in this folder are backed up by the nightly-backup schedule.\n",
}

T = TypeVar("T")


def local(moment: datetime | None) -> str:
    """An instant in Oslo time, e.g. ``Mon 2026-11-16 08:00 CET``."""
    if moment is None:
        return "none"
    return moment.astimezone(ZoneInfo(ZONE)).strftime("%a %Y-%m-%d %H:%M %Z")


def describe(outcome: Any) -> str:
    if isinstance(outcome, Finished):
        return f"finished: {json.dumps(outcome.value)}"
    if isinstance(outcome, Faulted):
        return f"faulted: {outcome.error}"
    return f"{type(outcome).__name__.lower()}"


def wait_until(what: str, services: Services, probe: Callable[[], T | None]) -> T:
    """Poll ``probe`` until it returns something; fail if a service dies or time runs out."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        services.check()
        found = probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {TIMEOUT:g} s waiting for {what}")
        time.sleep(0.2)


def ensure_documents(folder: Path) -> None:
    """Give the backup something to copy on a first start."""
    if not folder.exists():
        folder.mkdir(parents=True)
        for name, text in SAMPLE_DOCUMENTS.items():
            (folder / name).write_text(text)


def print_header(settings: Settings) -> None:
    print("celery_durable example project")
    print(f"  journal  {redact(settings.journal_url)}")
    if settings.embedded_broker:
        print("  broker   filesystem:// (no server)")
    else:
        print(f"  broker   {maybe_sanitize_url(settings.broker_url)}")
    print(f"  data     {settings.data_dir}")


def print_schedules(durable: Durable) -> None:
    print()
    print("Schedules (created on the first start; the same content is left unchanged):")
    now = durable.now()
    for job in JOBS:
        view = durable.schedules.state(job.id)
        assert view is not None
        upcoming = view.next_due
        missed = ""
        if upcoming is not None and upcoming <= now:
            # Due times passed while nothing ran: beat decides them by the catch-up policy.
            missed = f"  (missed since {local(upcoming)}: beat catches up)"
            upcoming = view.rule.next_after(now, anchor=view.anchor)
        print(
            f"  {job.id:<15} {view.rule!s:<35} catch-up {view.catch_up.value:<6}  "
            f"next run {local(upcoming)}{missed}"
        )


def create_demo(durable: Durable) -> str:
    """A new demo schedule; its ID carries the creation time (deleted IDs are never reused)."""
    for _ in range(5):
        demo_id = f"demo-{durable.now():%Y%m%dT%H%M%SZ}"
        try:
            durable.schedules.create(
                demo_id,
                "example.demo",
                "hello",
                Every(DEMO_INTERVAL, max_runs=DEMO_RUNS),
                CatchUp.ALL,
            )
        except ScheduleConflict:  # a demo started in the same second
            time.sleep(1)
            continue
        return demo_id
    raise RuntimeError("could not find a free demo schedule ID")


def run_demo(durable: Durable, services: Services) -> None:
    print()
    demo_id = create_demo(durable)
    print(f"Demo: schedule {demo_id!r}, every 2 s, at most {DEMO_RUNS} runs (max_runs)")

    def decided() -> list[RunView] | None:
        runs = durable.schedules.runs(demo_id)
        return runs if len(runs) >= DEMO_RUNS else None

    runs = sorted(wait_until("the demo's runs", services, decided), key=lambda r: r.due)
    durable.schedules.delete(demo_id)
    print(f"  {DEMO_RUNS} runs decided; schedule deleted (runs already decided still finish)")
    for number, run in enumerate(runs, 1):
        result = wait_until(
            f"the result of {run.run_id}", services, lambda r=run: _result(durable, r.run_id)
        )
        print(f"  run {number}  {run.run_id}  result {json.dumps(result)}")


def _result(durable: Durable, run_id: str) -> Any:
    try:
        return durable.result(run_id, timeout=0)
    except (TimeoutError, LookupError):
        return None


def report_session_runs(durable: Durable, services: Services, since: datetime) -> None:
    print()
    runs = [
        run
        for job in JOBS
        for run in reversed(durable.schedules.runs(job.id))
        if run.decided_at is not None and run.decided_at >= since
    ]
    if not runs:
        print("Job runs in this session: none (nothing came due since the last session).")
        return
    print("Job runs in this session (due times that passed while nothing ran: catch-up):")
    for run in runs:
        outcome = wait_until(
            f"the outcome of {run.run_id}",
            services,
            lambda r=run: _outcome(durable, r.run_id),
        )
        print(f"  {run.run_id}  ({local(run.due)})  {describe(outcome)}")


def _outcome(durable: Durable, run_id: str) -> Any:
    try:
        return durable.outcome(run_id, timeout=0)
    except (TimeoutError, LookupError):
        return None


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main() -> int:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    from example_project.app import durable, settings

    print_header(settings)
    if settings.broker_url.startswith("memory://"):
        print("Error: memory:// cannot be shared by the worker and beat processes", file=sys.stderr)
        return 1
    ensure_documents(settings.data_dir / "documents")
    ensure_schedules(durable)
    print_schedules(durable)
    since = durable.now()
    services = Services(settings.data_dir)
    print()
    print("Starting a worker and beat (logs: worker.log and beat.log in the data folder):")
    for service in services.all:
        print(f"  {service.command}")
    try:
        with services:
            run_demo(durable, services)
            report_session_runs(durable, services, since)
            print()
            print("Stopping beat and the worker ...")
    except (ServiceDied, TimeoutError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("Interrupted; beat and the worker were stopped.", file=sys.stderr)
        return 130
    finally:
        durable.close()
    print("Done.")
    return 0
