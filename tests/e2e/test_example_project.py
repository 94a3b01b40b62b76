"""The example project end to end: ``python -m example_project`` as a user runs it.

Each run starts a real worker and beat (child processes) and must leave none behind. The data
folder is a temp dir (``EXAMPLE_DATA_DIR``), so the repository's own ``example_project/data``
is never touched. Runs take ~15 s each; the new-user check (a clean virtualenv, the README's
command as written) takes about a minute more and needs PyPI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from pathlib import Path
from zoneinfo import ZoneInfo

import psutil
import pytest

from celery_durable import MONDAY, Daily, Weekly
from tests.support.processes import REPO_ROOT

OSLO = ZoneInfo("Europe/Oslo")
DEMO_LINE = re.compile(
    r"^  run (\d)  (demo-\d{8}T\d{6}Z)@(\S+Z)  result "
    + re.escape('{"reply": "hello", "attempts": 2}')
    + "$",
    re.M,
)


def run_example(data_dir: Path, env: dict[str, str] | None = None, cwd: Path = REPO_ROOT) -> str:
    """``python -m example_project``; assert it exits 0 and leaves no process; return stdout."""
    result = subprocess.run(
        [sys.executable, "-m", "example_project"],
        cwd=cwd,
        env=example_env(data_dir, env),
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert result.returncode == 0, result.stdout + result.stderr + logs(data_dir)
    assert not leftovers(data_dir)
    return result.stdout


def example_env(data_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CELERY_BROKER_URL", "CELERY_DURABLE_URL", "PYTHONPATH")
    }
    env["EXAMPLE_DATA_DIR"] = str(data_dir)
    env.update(extra or {})
    return env


def python(code: str, data_dir: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=example_env(data_dir, env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def logs(data_dir: Path) -> str:
    return "".join(
        f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
        for p in sorted(data_dir.glob("*.log"))
    )


def leftovers(data_dir: Path) -> list[psutil.Process]:
    """Processes still running in the data folder: the worker and beat run there."""
    found = []
    for proc in psutil.process_iter():
        try:
            if Path(proc.cwd()) == data_dir:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def next_run(rule: Daily | Weekly, before: datetime, after: datetime) -> str:
    """The "next run" the example prints: the rule's next due time after one of two instants
    (the program read the clock somewhere between them)."""
    dues = {rule.next_after(before), rule.next_after(after)}
    return "|".join(re.escape(f"{d.astimezone(OSLO):%a %Y-%m-%d %H:%M %Z}") for d in dues if d)


def check_output(out: str, before: datetime, after: datetime) -> None:
    """What every run prints, whatever its journal and broker."""
    assert out.startswith("celery_durable example project\n"), out
    daily = next_run(Daily("02:00", "Europe/Oslo"), before, after)
    weekly = next_run(Weekly([MONDAY], "08:00", "Europe/Oslo"), before, after)
    assert re.search(
        rf"^  nightly-backup  daily at 02:00 Europe/Oslo +catch-up latest  next run ({daily})",
        out,
        re.M,
    ), out
    assert re.search(
        rf"^  invoice-ada     weekly on mon at 08:00 Europe/Oslo +catch-up all     "
        rf"next run ({weekly})",
        out,
        re.M,
    ), out
    assert "celery -A example_project.app worker --pool=solo" in out
    assert "celery -A example_project.app beat --scheduler=celery_durable.beat:Durable" in out
    # The demo: three runs of one schedule, 2 s apart, read back by run ID after the delete.
    runs = DEMO_LINE.findall(out)
    assert [int(n) for n, _, _ in runs] == [1, 2, 3], out
    assert len({sid for _, sid, _ in runs}) == 1
    dues = [datetime.strptime(due[:26], "%Y-%m-%dT%H:%M:%S.%f") for _, _, due in runs]
    assert [(b - a).total_seconds() for a, b in pairwise(dues)] == [2.0, 2.0]
    assert "3 runs decided; schedule deleted" in out
    assert out.endswith("Stopping beat and the worker ...\nDone.\n"), out


def normalise(out: str) -> str:
    """The output without what changes from run to run: the demo's IDs and due times."""
    return re.sub(r"demo-\d{8}T\d{6}Z(@\S+Z)?", "demo-<id>", out)


def catch_up_part(out: str) -> list[str]:
    """Lines reporting catch-up: job runs of this session and "missed since" notes."""
    lines = out.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("Job runs")))
    end = lines.index("", start)
    return lines[start:end]


def without_catch_up(out: str) -> str:
    out = re.sub(r"  \(missed since [^)]*\)", "", out)
    out = re.sub(r"^Job runs in this session.*?\n\n", "Job runs: <>\n\n", out, flags=re.M | re.S)
    return normalise(out)


def mondays_0800(start: datetime, end: datetime) -> list[datetime]:
    rule = Weekly([MONDAY], "08:00", "Europe/Oslo")
    found, moment = [], start
    while (due := rule.next_after(moment)) is not None and due <= end:
        found.append(due)
        moment = due
    return found


def invoice_number(due: datetime) -> str:
    year, week, _ = due.astimezone(OSLO).isocalendar()
    return f"Ada-{year}-W{week:02d}"


def rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(sql).fetchall()


PRECREATE = """
import datetime as dt, sys
from celery_durable import Durable
from example_project.app import app
from example_project.schedules import ensure_schedules
past = dt.datetime.fromisoformat(sys.argv[1])
durable = Durable(app, clock=lambda: past)
ensure_schedules(durable)
durable.close()
"""


@pytest.mark.timeout(400)
def test_embedded_defaults_catch_up_then_same_output(tmp_path: Path) -> None:
    """SQLite journal + filesystem:// broker. The schedules were created 15 days ago (by the
    same code, with a clock set back), so the first run catches up: the latest missed night and
    every missed Monday. The second run catches up nothing and prints the same lines."""
    data = tmp_path / "data"
    past = datetime.now(timezone.utc) - timedelta(days=15)
    subprocess.run(
        [sys.executable, "-c", PRECREATE, past.isoformat()],
        cwd=REPO_ROOT,
        env=example_env(data),
        check=True,
        timeout=60,
    )
    before = datetime.now(timezone.utc)
    first = run_example(data)
    after = datetime.now(timezone.utc)
    check_output(first, before, after)
    assert f"  journal  sqlite:///{data / 'journal.db'}\n" in first
    assert "  broker   filesystem:// (no server)\n" in first

    mondays = mondays_0800(past, before)
    night = Daily("02:00", "Europe/Oslo")
    last_night = night.next_after(before - timedelta(days=1))
    assert last_night is not None and last_night <= before
    assert 2 <= len(mondays) <= 3
    caught_up = catch_up_part(first)
    assert caught_up[0].startswith("Job runs in this session (due times that passed")
    expected = [
        f"  nightly-backup@{last_night:%Y-%m-%dT%H:%M:%S}.0000000Z  "
        f"({last_night.astimezone(OSLO):%a %Y-%m-%d %H:%M %Z})  finished: "
        '{"folder": "documents", "files": 3, "stored": true}'
    ] + [
        f"  invoice-ada@{due:%Y-%m-%dT%H:%M:%S}.0000000Z  "
        f"({due.astimezone(OSLO):%a %Y-%m-%d %H:%M %Z})  finished: "
        f'{{"invoice": "{invoice_number(due)}", "issued": true}}'
        for due in mondays
    ]
    assert caught_up[1:] == expected, first
    assert "(missed since" in first

    # The stand-ins kept what was sent to them, keyed by idempotency key / invoice number.
    assert rows(data / "billing.db", "SELECT number FROM invoices ORDER BY 1") == [
        (invoice_number(d),) for d in mondays
    ]
    (key,) = rows(data / "backups.db", "SELECT idempotency_key FROM backups")
    assert key == (f"example.backup/nightly-backup@{last_night:%Y-%m-%dT%H:%M:%S}.0000000Z/1",)

    second = run_example(data)
    check_output(second, after, datetime.now(timezone.utc))
    assert catch_up_part(second) == [
        "Job runs in this session: none (nothing came due since the last session)."
    ]
    assert without_catch_up(second) == without_catch_up(first)
    assert len(rows(data / "billing.db", "SELECT number FROM invoices")) == len(mondays)


@pytest.mark.timeout(300)
def test_redis_and_postgres_by_environment(tmp_path: Path, redis_url: str, pg_url: str) -> None:
    """``CELERY_BROKER_URL`` and ``CELERY_DURABLE_URL`` move the same code to servers; a
    second run prints the same (the creates are idempotent)."""
    data = tmp_path / "data"
    redis_url = own_redis_db(redis_url)
    env = {"CELERY_BROKER_URL": redis_url, "CELERY_DURABLE_URL": pg_url}
    before = datetime.now(timezone.utc)
    first = run_example(data, env)
    check_output(first, before, datetime.now(timezone.utc))
    assert "  journal  postgresql" in first
    assert f"  broker   {redis_url}\n" in first
    assert not (data / "journal.db").exists()
    assert catch_up_part(first) == [
        "Job runs in this session: none (nothing came due since the last session)."
    ]
    second = run_example(data, env)
    assert normalise(second) == normalise(first)
    listed = python(
        "from example_project.app import durable\n"
        "print([s.id for s in durable.schedules.list(include_deleted=True)])",
        data,
        env,
    )
    ids = json.loads(listed.replace("'", '"'))
    # celery.backend_cleanup: installed as stock beat installs it (no self-expiring backend, B7)
    assert sorted(i for i in ids if not i.startswith("demo-")) == [
        "celery.backend_cleanup",
        "invoice-ada",
        "nightly-backup",
    ]
    assert len([i for i in ids if i.startswith("demo-")]) == 2  # deleted, still listed


def own_redis_db(url: str, db: int = 13) -> str:
    """The fixture's server with another database, flushed: the example's worker listens on
    the default queue, so it must not share a database with other tests' tasks (or have its
    messages flushed by another test run going on at the same time)."""
    import redis

    own = re.sub(r"/\d*$", f"/{db}", url)
    client = redis.Redis.from_url(own)
    try:
        client.flushdb()
    finally:
        client.close()
    return own


def test_a_second_invoice_in_the_same_week_issues_nothing(tmp_path: Path) -> None:
    """The invoice number comes from the due time's ISO week in Oslo: a second run in the same
    week (here a manual one on Wednesday) asks billing for the same number, which it refuses."""
    out = python(
        """
import json
from datetime import datetime, timezone
from celery_durable import ScheduledRun, run_id
from celery_durable.message import scheduled_message
from example_project.app import billing, durable, invoice
results = []
for due in (datetime(2026, 11, 16, 7, tzinfo=timezone.utc),    # Monday 08:00 Oslo, W47
            datetime(2026, 11, 18, 12, tzinfo=timezone.utc),   # Wednesday, same week
            datetime(2026, 11, 22, 22, 59, tzinfo=timezone.utc),  # Sunday 23:59 Oslo, W47
            datetime(2026, 11, 22, 23, tzinfo=timezone.utc)):  # Monday 00:00 Oslo, W48
    args, _, _ = scheduled_message(ScheduledRun("invoice-ada", due, "Ada"))  # as beat sends it
    results.append(invoice.apply(args=args, task_id=run_id("invoice-ada", due)).get())
print(json.dumps({"results": results, "issued": billing.numbers()}))
durable.close()
""",
        tmp_path / "data",
    )
    data = json.loads(out.splitlines()[-1])
    assert data["results"] == [
        {"invoice": "Ada-2026-W47", "issued": True},
        {"invoice": "Ada-2026-W47", "issued": False},
        {"invoice": "Ada-2026-W47", "issued": False},
        {"invoice": "Ada-2026-W48", "issued": True},
    ]
    assert data["issued"] == ["Ada-2026-W47", "Ada-2026-W48"]


def readme_demo_command() -> str:
    """The command the README gives for running the example project."""
    text = (REPO_ROOT / "README.md").read_text()
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S)
    (command,) = [b.strip() for b in blocks if "example_project" in b]
    return command


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_new_user_runs_the_readme_command_in_a_clean_virtualenv(tmp_path: Path) -> None:
    """A fresh copy of the repository, a fresh virtualenv (packages from PyPI), and the README's
    demo command exactly as written, from the copy's root."""
    command = readme_demo_command()
    assert command == "python -m pip install -e . && python -m example_project"
    checkout = tmp_path / "checkout"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO_ROOT / name
        if source.is_file() and not name.startswith(("tests/", "example_project/data/")):
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, checkout / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CELERY", "PYTHON", "VIRTUAL_ENV", "EXAMPLE_"))
    }
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    data = checkout / "example_project" / "data"
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + logs(data)
    out = result.stdout[result.stdout.index("celery_durable example project") :]
    check_output(
        out, datetime.now(timezone.utc) - timedelta(minutes=10), datetime.now(timezone.utc)
    )
    assert f"  journal  sqlite:///{data / 'journal.db'}\n" in out
    assert not leftovers(data)


def test_the_embedded_broker_never_shows_a_half_written_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu's filesystem channel creates a message file, then writes it; a worker polling in
    between read an empty message and stopped with ``JSONDecodeError``
    (https://github.com/celery/kombu/issues/1551). Here a consumer polls at exactly that
    moment: while the message is being serialised."""
    from queue import Empty

    from kombu import Connection
    from kombu.transport import filesystem

    from example_project.broker import Transport

    folder = tmp_path / "queue"
    folder.mkdir()
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder)}
    polled: list[object] = []
    with Connection("filesystem://", transport=Transport, transport_options=options) as conn:
        channel = conn.default_channel
        serialise = filesystem.dumps

        def serialise_while_a_consumer_polls(payload: object) -> str:
            try:
                polled.append(channel._get("jobs"))
            except Empty:
                polled.append(None)
            return serialise(payload)

        monkeypatch.setattr(filesystem, "dumps", serialise_while_a_consumer_polls)
        channel._put("jobs", {"body": "hello"})
        monkeypatch.undo()
        assert polled == [None]
        assert channel._get("jobs") == {"body": "hello"}
        assert list(folder.iterdir()) == []
