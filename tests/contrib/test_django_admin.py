"""The Django app: admin pages and actions, the form, management commands, the journal URL.

Django's test client against the test project (tests/django_project); each test runs on an
SQLite journal and on a PostgreSQL one (``journal_url``). Django's own tables live in an
SQLite file for the whole session (see tests/django_project/harness.py).
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy.engine import make_url

from celery_durable import CatchUp, Cron, Daily, Durable, Every, Overlap, ScheduledRun, Weekly
from celery_durable.message import scheduled_message
from tests.django_project.harness import setup_django

UTC = timezone.utc
T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)  # a Monday
LIST = "/admin/celery_durable/schedule/"


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture(scope="session")
def django_site(tmp_path_factory: pytest.TempPathFactory) -> None:
    setup_django(tmp_path_factory.mktemp("django") / "django.sqlite3")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def durable(django_site: None, journal_url: str, clock: FakeClock) -> Iterator[Durable]:
    """A Celery app of its own for each test, made the admin's through CELERY_DURABLE_APP."""
    from django.test import override_settings

    app = Celery("django_admin_tests", broker="memory://", set_as_current=False)
    app.conf.durable_url = journal_url

    @app.task(name="shop.report", shared=False)
    def send_report(customer: str) -> str:  # pragma: no cover - never consumed
        return customer

    d = Durable(app, clock=clock)

    @d.task(name="shop.backup", shared=False)
    def backup(run: ScheduledRun) -> str:
        if run.input == "fail":
            raise RuntimeError("disk full")
        return f"backed up {run.input}"

    with override_settings(CELERY_DURABLE_APP=app):
        yield d
    d.close()


@pytest.fixture
def client(django_site: None) -> Any:
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.get(username="admin"))
    return client


def text(response: Any) -> str:
    """The page's HTML, whitespace collapsed, ``<wbr>`` break points (layout only) removed."""
    html = response.content.decode().replace("<wbr>", "")
    return re.sub(r"\s+", " ", html)


def row_of(page: str, sid: str) -> str:
    match = re.search(rf'<tr data-schedule="{re.escape(sid)}">(.*?)</tr>', page)
    assert match, f"no row for {sid}"
    return match.group(1)


# The list -------------------------------------------------------------------------------------


def test_admin_index_has_the_durable_schedules_section(client: Any, durable: Durable) -> None:
    page = text(client.get("/admin/"))
    assert "Durable schedules" in page
    assert f'href="{LIST}"' in page
    assert f'href="{LIST}add/"' in page


def test_list_shows_next_run_in_utc_and_local_time_status_and_policies(
    client: Any, durable: Durable
) -> None:
    durable.schedules.create(
        "nightly-backup", "shop.backup", "/srv", Daily("02:00", "Europe/Oslo"), CatchUp.LATEST
    )
    durable.schedules.create(
        "weekly-report",
        "shop.report",
        "Ada",
        Weekly(["mon"], "08:00", "Europe/Oslo"),
        CatchUp.ALL,
        overlap=Overlap.SKIP,
    )
    durable.schedules.create("gone", "shop.report", "x", Every(timedelta(hours=1)))
    durable.schedules.delete("gone")
    response = client.get(LIST)
    assert response.status_code == 200
    page = text(response)
    nightly = row_of(page, "nightly-backup")
    assert "daily at 02:00 Europe/Oslo" in nightly
    assert "2026-11-03 01:00:00 UTC" in nightly  # R7: 02:00 CET
    assert "2026-11-03 02:00:00 CET" in nightly  # TIME_ZONE = Europe/Oslo
    assert "active" in nightly and "LATEST / ALLOW" in nightly
    weekly = row_of(page, "weekly-report")
    assert "2026-11-09 07:00:00 UTC" in weekly and "ALL / SKIP" in weekly
    assert "Next run (UTC / Europe/Oslo)" in page
    assert 'data-schedule="gone"' not in page  # deleted ones only under their filter
    deleted = text(client.get(LIST + "?status=deleted"))
    assert "deleted" in row_of(deleted, "gone")
    assert 'data-schedule="nightly-backup"' not in deleted
    searched = text(client.get(LIST + "?q=weekly"))
    assert 'data-schedule="weekly-report"' in searched
    assert 'data-schedule="nightly-backup"' not in searched


def test_pause_resume_trigger_and_delete_actions_from_the_list(
    client: Any, durable: Durable
) -> None:
    for sid in ("a", "b", "c"):
        durable.schedules.create(sid, "shop.report", sid, Every(timedelta(minutes=5)))

    def act(action: str, *ids: str, **extra: str) -> Any:
        data = {"action": action, "_selected_action": list(ids), **extra}
        return client.post(LIST, data, follow=True)

    page = text(act("pause", "a", "b"))
    assert "Paused 2 schedules: a, b" in page
    assert "paused" in row_of(page, "a") and "active" in row_of(page, "c")
    assert durable.schedules.state("a").paused and durable.schedules.state("b").paused

    page = text(act("resume", "b", "c"))
    assert "Resumed 1 schedule: b" in page
    messages = re.findall(r'<ul class="messagelist">(.*?)</ul>', page)
    assert "Could not resume c: schedule &#x27;c&#x27; is not paused" in page, messages
    assert not durable.schedules.state("b").paused

    page = text(act("trigger", "c"))
    [run] = durable.schedules.runs("c")
    assert f"Triggered run {run.run_id}." in page and run.reason == "trigger"

    # Delete asks first; nothing is deleted until the confirmation is posted.
    confirm = text(act("delete", "a"))
    assert "Are you sure?" in confirm and "can never be used again" in confirm
    assert not durable.schedules.state("a").deleted
    page = text(act("delete", "a", post="yes"))
    assert "Deleted 1 schedule: a" in page
    assert durable.schedules.state("a").deleted

    page = text(act("pause"))
    assert "Items must be selected" in page


def test_schedule_page_shows_runs_with_states_and_durable_outcomes(
    client: Any, durable: Durable, clock: FakeClock
) -> None:
    durable.schedules.create("backup", "shop.backup", "/srv", Every(timedelta(minutes=1)))
    durable.schedules.create("broken", "shop.backup", "fail", Every(timedelta(minutes=1)))
    dispatcher = durable.dispatcher()
    dispatcher.tick()
    for _ in range(2):
        clock.now += timedelta(minutes=1)
        dispatcher.tick()
    # A worker would run the messages; run the durable task here, with the run ID as task id.
    task = durable.app.tasks["shop.backup"]
    for sid in ("backup", "broken"):
        run = durable.schedules.runs(sid)[-1]
        args, kwargs, _ = scheduled_message(ScheduledRun(sid, run.due, run.input))
        task.apply(args, kwargs, task_id=run.run_id)
    url = LIST + "backup/change/"
    page = text(client.get(url))
    first, second = (r.run_id for r in reversed(durable.schedules.runs("backup")))
    assert first in page and second in page
    assert re.search(rf"{re.escape(first)}.*?started.*?finished.*?&quot;backed up /srv&quot;", page)
    assert "every 1m" in page and "Next run (Europe/Oslo)" in page
    broken = text(client.get(LIST + "broken/change/"))
    assert "faulted" in broken and "RuntimeError: disk full" in broken

    # The page's own buttons: pause, resume, trigger now (POST only).
    assert client.get(LIST + "backup/pause/").status_code == 405
    page = text(client.post(LIST + "backup/pause/", follow=True))
    assert "Paused 1 schedule: backup" in page and 'id="durable-resume"' in page
    page = text(client.post(LIST + "backup/resume/", follow=True))
    assert "Resumed 1 schedule: backup" in page
    clock.now += timedelta(seconds=1)  # a trigger at the very instant of a decided due time fails
    page = text(client.post(LIST + "backup/trigger/", follow=True))
    assert "Triggered run backup@" in page and ">trigger<" in page
    assert client.get(LIST + "nope/change/").status_code == 404


def test_add_form_creates_a_schedule(client: Any, durable: Durable) -> None:
    data = form_data(
        id="weekly-invoice",
        task="shop.report",
        kind="weekly",
        days=["mon", "thu"],
        at="08:00",
        input='{"customer": "Ada"}',
        catch_up="all",
        overlap="buffer_one",
        options='{"queue": "billing", "priority": 5}',
        max_runs="10",
    )
    response = client.post(LIST + "add/", data)
    assert response.status_code == 302
    assert response["Location"] == LIST + "weekly-invoice/change/"
    view = durable.schedules.state("weekly-invoice")
    assert view.rule == Weekly(["mon", "thu"], "08:00", "Europe/Oslo", max_runs=10)
    assert view.input == {"customer": "Ada"} and view.catch_up is CatchUp.ALL
    assert view.overlap is Overlap.BUFFER_ONE
    assert dict(view.options) == {"queue": "billing", "priority": 5}
    # The change form shows what was stored.
    initial = client.get(response["Location"]).context["form"].initial
    assert initial["days"] == ["mon", "thu"] and initial["at"] == "08:00"
    assert initial["max_runs"] == 10 and initial["catch_up"] == "all"


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"zone": "Mars/Olympus"}, "zone", "unknown time zone"),
        ({"kind": "cron", "cron": "0 0 31 2 *"}, "cron", "Cron"),
        ({"kind": "cron", "cron": "61 * * * *"}, "cron", "minute"),
        ({"task": "shop.nope"}, "task", "not registered"),
        ({"task": "shop.report", "input": ""}, "input", "argument: 'customer'"),
        ({"at": "25:00"}, "at", "not a time of day"),
        ({"kind": "every", "every": "0s"}, "every", "between 1 second and 366 days"),
        ({"kind": "weekly"}, "days", "needs this field"),
        ({"input": "{not json"}, "input", "not valid JSON"),
        ({"options": '{"colour": 1}'}, "options", "unknown option"),
        ({"id": "a~b"}, "id", "must not contain"),
        ({"kind": "once", "once_at": "2026-13-01 10:00"}, "once_at", "not a date"),
        ({"max_runs": "0"}, "max_runs", "max_runs"),
        ({"max_runs": str(10**30)}, "max_runs", "max_runs must be at most 2,147,483,647"),
        ({"options": '{"args": ["/srv"]}'}, "options", "'shop.backup' is a durable task"),
        (
            {"task": "shop.report", "input": '"Ada"', "options": '{"kwargs": {"customer": "B"}}'},
            "input",
            "never the input",
        ),
        ({"start_deadline": "soon"}, "start_deadline", "not a duration"),
        ({"start_deadline": "5s", "jitter": "5s"}, "jitter", "must be shorter than"),
        ({"catch_up": "none", "catch_up_window": "1h"}, "catch_up_window", "CatchUp.NONE"),
        ({"catch_up_window": "400d"}, "catch_up_window", "longer than 366 days"),
    ],
)
def test_add_form_shows_validation_errors_on_their_field(
    client: Any, durable: Durable, changes: dict[str, str], field: str, message: str
) -> None:
    response = client.post(LIST + "add/", form_data(**changes))
    assert response.status_code == 200
    form = response.context["form"]
    assert field in form.errors, form.errors
    assert message in " ".join(form.errors[field])
    assert "Please correct the error" in text(response)
    assert durable.schedules.list() == []


def test_add_form_shows_a_conflict_with_an_existing_schedule(client: Any, durable: Durable) -> None:
    durable.schedules.create("nightly", "shop.backup", "/srv", Daily("02:00", "Europe/Oslo"))
    response = client.post(LIST + "add/", form_data(id="nightly", at="03:00"))
    assert response.status_code == 200
    errors = response.context["form"].non_field_errors()
    assert errors and "nightly" in errors[0]
    assert durable.schedules.state("nightly").rule == Daily("02:00", "Europe/Oslo")


def test_change_form_replaces_the_rule_and_a_deleted_schedule_is_read_only(
    client: Any, durable: Durable
) -> None:
    durable.schedules.create("nightly", "shop.backup", "/srv", Daily("02:00", "Europe/Oslo"))
    page = client.get(LIST + "nightly/change/")
    assert page.context["form"].initial["at"] == "02:00"
    data = form_data(id="nightly", kind="cron", cron="30 3 * * *", zone="UTC", input='"/data"')
    response = client.post(LIST + "nightly/change/", data)
    assert response.status_code == 302
    view = durable.schedules.state("nightly")
    assert view.rule == Cron("30 3 * * *", "UTC") and view.input == "/data"
    bad = client.post(LIST + "nightly/change/", {**data, "cron": "nonsense"})
    assert "cron" in bad.context["form"].errors

    durable.schedules.delete("nightly")
    page = text(client.get(LIST + "nightly/change/"))
    assert "deleted" in page and 'id="schedule_form"' not in page
    assert client.post(LIST + "nightly/change/", data).status_code == 403


def test_delete_page_of_one_schedule_asks_then_deletes(client: Any, durable: Durable) -> None:
    durable.schedules.create("odd/id@1", "shop.report", 1, Every(timedelta(hours=1)))
    change = LIST + "odd_2Fid@1/change/"  # the admin's quote() escapes "/"
    assert client.get(change).status_code == 200
    confirm = client.get(LIST + "odd_2Fid@1/delete/")
    assert "Are you sure?" in text(confirm)
    assert not durable.schedules.state("odd/id@1").deleted
    response = client.post(LIST + "odd_2Fid@1/delete/")
    assert response.status_code == 302 and durable.schedules.state("odd/id@1").deleted


def test_permissions_are_the_models(durable: Durable, django_site: None) -> None:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    from django.test import Client

    durable.schedules.create("x", "shop.report", 1, Every(timedelta(hours=1)))
    user, _ = get_user_model().objects.get_or_create(username="viewer", is_staff=True)
    user.user_permissions.set([Permission.objects.get(codename="view_schedule")])
    client = Client()
    client.force_login(user)
    page = text(client.get(LIST))
    assert 'data-schedule="x"' in page and 'name="action"' not in page
    assert client.post(LIST + "x/pause/").status_code == 403
    assert client.get(LIST + "add/").status_code == 403
    assert not durable.schedules.state("x").paused


# Management commands ---------------------------------------------------------------------------


def test_management_commands_mirror_the_cli(durable: Durable, clock: FakeClock) -> None:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    durable.schedules.create("nightly", "shop.backup", "/srv", Daily("02:00", "Europe/Oslo"))

    def run(*args: str) -> str:
        out = io.StringIO()
        call_command(*args, stdout=out, stderr=io.StringIO())
        return out.getvalue()

    listing = run("durable_schedules", "list")
    assert re.search(r"nightly\s+shop\.backup\s+daily at 02:00 Europe/Oslo\s+active", listing)
    assert '"status": "active"' in run("durable_schedules", "list", "--json")
    assert "schedule 'nightly' paused" in run("durable_schedules", "pause", "nightly")
    assert re.search(r"Status\s+paused", run("durable_schedules", "show", "nightly"))
    assert "schedule 'nightly' resumed" in run("durable_schedules", "resume", "nightly")
    triggered = run("durable_schedules", "trigger", "nightly")
    assert triggered == "nightly@2026-11-02T12:00:00.0000000Z\n"
    assert "nightly@2026-11-02T12:00:00.0000000Z" in run("durable_runs", "nightly")
    assert '"reason": "trigger"' in run("durable_runs", "nightly", "--json")
    with pytest.raises(CommandError) as refused:
        run("durable_schedules", "resume", "nightly")
    assert refused.value.returncode == 4
    with pytest.raises(CommandError, match="no durable schedule"):
        run("durable_runs", "nope")
    with pytest.raises(CommandError):
        run("durable_schedules", "delete", "nightly")  # not on a terminal: needs --yes
    assert "schedule 'nightly' deleted" in run("durable_schedules", "delete", "nightly", "--yes")
    assert "nightly" not in run("durable_schedules", "list")
    assert "deleted" in run("durable_schedules", "list", "--all")


# The journal URL -------------------------------------------------------------------------------


def test_database_url_maps_django_databases_to_sqlalchemy_urls(tmp_path: Path) -> None:
    from celery_durable.contrib.django import database_url

    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": tmp_path / "db.sqlite3"}
    assert database_url(sqlite) == f"sqlite:///{tmp_path / 'db.sqlite3'}"
    pg = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "shop",
        "USER": "app",
        "PASSWORD": "p@ss word",
        "HOST": "db.internal",
        "PORT": 5433,
        "OPTIONS": {"sslmode": "require", "pool": True},
    }
    url = make_url(database_url(pg))
    assert url.drivername == "postgresql+psycopg" and url.database == "shop"
    assert (url.username, url.password, url.host, url.port) == (
        "app",
        "p@ss word",
        "db.internal",
        5433,
    )
    assert dict(url.query) == {"sslmode": "require"}
    socket = database_url({"ENGINE": "django.db.backends.postgresql", "NAME": "shop"})
    assert socket == "postgresql+psycopg:///shop"
    with pytest.raises(Exception, match="CELERY_DURABLE_URL"):
        database_url({"ENGINE": "django.db.backends.oracle", "NAME": "shop"})
    with pytest.raises(Exception, match="memory"):
        database_url({"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"})


def test_database_url_maps_a_mysql_entry_with_its_options() -> None:
    from celery_durable.contrib.django import database_url

    entry = {
        "ENGINE": "django.db.backends.mysql",
        "NAME": "shop",
        "USER": "app",
        "PASSWORD": "p@ss word/ü",
        "HOST": "db.internal",
        "PORT": "3307",
        "OPTIONS": {
            "charset": "utf8mb4",
            "init_command": "SET sql_mode='STRICT_TRANS_TABLES'",
            "ssl": {"ca": "/etc/ssl/ca.pem", "cert": "/c.pem", "key": "/k.pem"},
            "isolation_level": "read committed",  # Django's own; the journal sets its own
            "connect_timeout": 5,
        },
    }
    url = make_url(database_url(entry))
    assert url.drivername == "mysql+pymysql" and url.database == "shop"
    assert (url.username, url.password, url.host, url.port) == (
        "app",
        "p@ss word/ü",
        "db.internal",
        3307,
    )
    assert dict(url.query) == {
        "charset": "utf8mb4",
        "init_command": "SET sql_mode='STRICT_TRANS_TABLES'",
        "ssl_ca": "/etc/ssl/ca.pem",
        "ssl_cert": "/c.pem",
        "ssl_key": "/k.pem",
        "connect_timeout": "5",
    }
    socket = make_url(
        database_url({"ENGINE": "django.db.backends.mysql", "NAME": "shop", "HOST": "/run/m.sock"})
    )
    assert socket.query["unix_socket"] == "/run/m.sock"


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"charset": "utf8"}, "charset='utf8' cannot hold every ID"),
        ({"read_default_file": "/etc/my.cnf"}, "read_default_file cannot be carried"),
        ({"ssl": {"ca": "/a", "verify_mode": "x"}}, "ssl key.s. verify_mode cannot be carried"),
    ],
)
def test_mysql_options_the_journal_cannot_honour_are_refused(
    options: dict[str, Any], words: str
) -> None:
    from celery_durable.contrib.django import database_url

    entry = {"ENGINE": "django.db.backends.mysql", "NAME": "shop", "OPTIONS": options}
    with pytest.raises(Exception, match=words):
        database_url(entry)


def _databases_entry(backend: str, server_url: str) -> dict[str, Any]:
    """A ``DATABASES`` entry for the test's own PostgreSQL schema or MariaDB database."""
    url = make_url(server_url)
    entry: dict[str, Any] = {
        "NAME": url.database,
        "USER": url.username,
        "HOST": url.host,
        "PORT": url.port,
    }
    if backend == "postgres":
        entry["ENGINE"] = "django.db.backends.postgresql"
        entry["OPTIONS"] = {"options": url.query["options"]}  # the test's own schema
    else:
        entry["ENGINE"] = "django.db.backends.mysql"
        entry["OPTIONS"] = {
            "charset": "utf8mb4",
            "init_command": "SET SESSION sql_mode='TRADITIONAL'",
        }
    return entry


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
@pytest.mark.parametrize(
    ("backend", "prefix"),
    [("postgres", "postgresql+psycopg://postgres@"), ("mysql", "mysql+pymysql://root@")],
)
def test_journal_defaults_to_a_database_of_databases(
    django_site: None, backend: str, prefix: str, request: pytest.FixtureRequest
) -> None:
    """No durable_url anywhere: the journal is DATABASES[CELERY_DURABLE_DATABASE] -- also for
    a project whose only database is MariaDB."""
    from django.conf import settings
    from django.test import override_settings

    from celery_durable.contrib.django import get_durable

    server_url = str(request.getfixturevalue({"postgres": "pg_url", "mysql": "mysql_url"}[backend]))
    app = Celery(f"django_{backend}_db", broker="memory://", set_as_current=False)

    @app.task(name="t", shared=False)
    def t() -> None:  # pragma: no cover - never run
        return None

    databases = {**settings.DATABASES, "journal": _databases_entry(backend, server_url)}
    with override_settings(
        CELERY_DURABLE_APP=app, CELERY_DURABLE_DATABASE="journal", DATABASES=databases
    ):
        durable = get_durable()
        assert app.conf.durable_url.startswith(prefix)
        durable.schedules.create("s", "t", None, Every(timedelta(hours=1)))
        if backend == "mysql":
            with durable.journal.engine.connect() as conn:  # init_command was carried
                mode = conn.exec_driver_sql("SELECT @@session.sql_mode").scalar()
            assert "STRICT_ALL_TABLES" in mode  # part of TRADITIONAL, not the server default
        durable.close()
    # The schedule is in the test's own schema / database of the server.
    check = Durable(Celery("reader", set_as_current=False), server_url)
    assert check.schedules.state("s") is not None
    check.close()


# Other tests' apps hold a task of the same name; @shared_task adds itself to them too.
@pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning")
def test_the_projects_app_uses_the_default_database_and_finds_its_tasks(
    django_site: None,
) -> None:
    from django.conf import settings
    from durable_site.celery import app, durable

    from celery_durable.contrib.django import get_durable

    # In the project's own process its app became Celery's current app when celery.py was
    # imported; here other tests' apps may have become current since: as the project has it.
    app.set_current()
    assert get_durable() is durable  # the project's app is Celery's current app
    assert durable.config.url == f"sqlite:///{settings.DATABASES['default']['NAME']}"
    assert {"shop.send_report", "shop.nightly_backup"} <= set(app.tasks)  # autodiscovered
    assert durable.is_durable("shop.nightly_backup")


# Helpers ---------------------------------------------------------------------------------------


def form_data(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": "nightly",
        "task": "shop.backup",
        "kind": "daily",
        "at": "02:00",
        "zone": "Europe/Oslo",
        "input": '"/srv"',
        "catch_up": "latest",
        "overlap": "allow",
        "options": "{}",
        "end_at": "",
        "max_runs": "",
    }
    data.update(changes)
    return data


def test_the_python_blocks_of_docs_django_md_compile() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "django.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", doc, re.M | re.S)
    assert len(blocks) >= 4
    for number, block in enumerate(blocks, start=1):
        compile(block, f"docs/django.md block {number}", "exec")
    for setting in ("CELERY_DURABLE_URL", "CELERY_DURABLE_DATABASE", "CELERY_DURABLE_APP"):
        assert setting in doc


# What the pages say, read as a newcomer reads them ----------------------------------------------


@pytest.mark.parametrize("sid", ["esc\x1b[2Jx", "rtl\u202egnp", "two\nlines", "soh\x01"], ids=repr)
def test_add_form_refuses_control_characters_in_the_id(
    client: Any, durable: Durable, sid: str
) -> None:
    response = client.post(LIST + "add/", form_data(id=sid))
    assert response.status_code == 200
    assert "control or format characters" in str(response.context["form"].errors["id"])
    assert durable.schedules.list() == []


def test_with_time_zone_utc_times_are_shown_once(
    client: Any, durable: Durable, clock: FakeClock
) -> None:
    from django.test import override_settings

    durable.schedules.create("backup", "shop.backup", "/srv", Every(timedelta(minutes=1)))
    with override_settings(TIME_ZONE="UTC"):
        listing = text(client.get(LIST))
        detail = text(client.get(LIST + "backup/change/"))
    assert "Next run (UTC)" in listing and "UTC / UTC" not in listing
    assert "(UTC)" in detail and "Next run (UTC)</th>" in detail
    assert "Due (UTC)" in detail and 'Due (UTC)</th><th scope="col">Due (UTC)' not in detail
    assert "Next run (UTC / Europe/Oslo)" in text(client.get(LIST))  # TIME_ZONE of the project


def test_a_run_that_returned_nothing_and_ran_before_its_start_was_recorded(
    client: Any, durable: Durable, clock: FakeClock
) -> None:
    """Triggered, then executed by a worker before the dispatcher recorded the start (as after a
    crash between send and record, A6): it was enqueued, it finished, it returned None."""

    def quiet(run: ScheduledRun) -> None:
        return None

    durable.task(name="shop.quiet", shared=False)(quiet)
    durable.schedules.create("quiet", "shop.quiet", None, Daily("02:00", "Europe/Oslo"))
    run_id = durable.schedules.trigger("quiet")
    [run] = durable.schedules.runs("quiet")
    assert run.state == "decided"
    args, kwargs, _ = scheduled_message(ScheduledRun("quiet", run.due, run.input))
    durable.app.tasks["shop.quiet"].apply(args, kwargs, task_id=run_id)
    page = client.get(LIST + "quiet/change/")
    body = text(page)
    assert "not yet enqueued" not in body
    [row] = page.context["runs"]
    assert (row.state, row.outcome, row.detail) == ("started", "finished", "")
    runs_table = re.search(r'<table id="durable-runs".*?</table>', body)
    assert runs_table is not None and "null" not in runs_table.group(0)
    assert re.search(rf"{re.escape(run_id)}.*?started.*?finished", runs_table.group(0))


def test_durable_runs_command_escapes_stored_control_characters(durable: Durable) -> None:
    import unicodedata

    from django.core.management import call_command

    durable.schedules.create("esc", "shop.backup", "\x1b[2J\u202e", Daily("02:00", "Europe/Oslo"))
    run_id = durable.schedules.trigger("esc")
    [run] = durable.schedules.runs("esc")
    args, kwargs, _ = scheduled_message(ScheduledRun("esc", run.due, run.input))
    durable.app.tasks["shop.backup"].apply(args, kwargs, task_id=run_id)
    out = io.StringIO()
    call_command("durable_runs", "esc", stdout=out)
    printed = out.getvalue()
    assert "backed up \\u001b[2J\\u202e" in printed
    assert not [c for c in printed if c != "\n" and unicodedata.category(c) in ("Cc", "Cf")]


# Timing policies (SPEC §5d: P1–P3) -------------------------------------------------------


def test_the_form_creates_and_shows_the_policies(client: Any, durable: Durable) -> None:
    data = form_data(catch_up="all", start_deadline="30s", jitter="10s", catch_up_window="1h")
    response = client.post(LIST + "add/", data)
    assert response.status_code == 302, response.context["form"].errors
    view = durable.schedules.state("nightly")
    assert (view.start_deadline, view.jitter, view.catch_up_window) == (
        timedelta(seconds=30),
        timedelta(seconds=10),
        timedelta(hours=1),
    )
    page = client.get(LIST + "nightly/change/")
    initial = page.context["form"].initial
    assert (initial["start_deadline"], initial["jitter"], initial["catch_up_window"]) == (
        "30s",
        "10s",
        "1h",
    )
    assert 'id="durable-timing">30s / 10s / 1h<' in text(page)
    # Emptied fields turn the policies off; the others are kept as the form shows them.
    response = client.post(LIST + "nightly/change/", {**data, "jitter": "", "catch_up_window": ""})
    assert response.status_code == 302
    view = durable.schedules.state("nightly")
    assert (view.start_deadline, view.jitter, view.catch_up_window) == (
        timedelta(seconds=30),
        None,
        None,
    )
    assert 'id="durable-timing">30s / — / —<' in text(client.get(LIST + "nightly/change/"))
    from django.core.management import call_command

    out = io.StringIO()
    call_command("durable_schedules", "show", "nightly", stdout=out)
    assert re.search(r"^Start deadline +30s$", out.getvalue(), re.M), out.getvalue()
    assert not re.search(r"^Jitter ", out.getvalue(), re.M)  # off: not shown
    out = io.StringIO()
    call_command("durable_schedules", "show", "nightly", "--json", stdout=out)
    assert '"start_deadline": 30.0' in out.getvalue() and '"jitter": null' in out.getvalue()


def test_a_missed_run_is_shown_with_its_reason(
    client: Any, durable: Durable, clock: FakeClock
) -> None:
    durable.schedules.create(
        "backup", "shop.backup", "/srv", Every(timedelta(minutes=1)), CatchUp.LATEST,
        start_deadline=5,
    )  # fmt: skip
    dispatcher = durable.dispatcher()
    dispatcher.tick()
    clock.now += timedelta(minutes=1)
    dispatcher.tick()
    [run] = durable.schedules.runs("backup")
    # The worker gets the message only after the deadline: the run never starts.
    clock.now += timedelta(seconds=6)
    args, kwargs, _ = scheduled_message(ScheduledRun("backup", run.due, run.input))
    headers = {
        "durable_deadline": "2026-11-02T12:01:05.0000000Z",
        "durable_schedule": "backup",
        "durable_due": "2026-11-02T12:01:00.0000000Z",
    }
    durable.app.tasks["shop.backup"].apply(args, kwargs, task_id=run.run_id, headers=headers)
    page = text(client.get(LIST + "backup/change/"))
    assert 'class="state-missed">missed<' in page
    assert "start deadline passed before a worker began the durable run" in page


# Audit (O5) and late schedules (O4) ---------------------------------------------------------


def test_the_admin_records_the_user_and_reason_and_shows_the_history(
    client: Any, durable: Durable, clock: FakeClock
) -> None:
    page = client.post(
        LIST + "add/",
        form_data(id="audited", kind="every", every="1h", reason="asked by finance"),
        follow=True,
    )
    assert durable.schedules.state("audited") is not None, text(page)
    clock.now += timedelta(minutes=1)
    client.post(
        LIST + "audited/change/",
        form_data(id="audited", kind="every", every="2h", input='"Bob"'),
    )
    clock.now += timedelta(minutes=1)
    client.post(LIST, {"action": "pause", "_selected_action": ["audited"], "reason": "quiet week"})
    client.post(LIST + "audited/resume/", {})
    history = durable.schedules.history("audited")
    assert [(h.action, h.by, h.reason) for h in history] == [
        ("created", "admin", "asked by finance"),
        ("changed", "admin", None),
        ("paused", "admin", "quiet week"),
        ("resumed", "admin", None),
    ]
    change_page = text(client.get(LIST + "audited/change/"))
    assert f'href="{LIST}audited/history/"' in change_page
    page = text(client.get(LIST + "audited/history/"))
    assert "History of schedule audited" in page
    rows = re.findall(r'<tr class="action-(\w+)">(.*?)</tr>', page)
    assert [action for action, _ in rows] == ["created", "changed", "paused", "resumed"]
    created, changed, paused = rows[0][1], rows[1][1], rows[2][1]
    assert "2026-11-02 12:00:00 UTC" in created and "asked by finance" in created
    assert '<td class="by">admin</td>' in created
    assert "<strong>input</strong>: &quot;/srv&quot; → &quot;Bob&quot;" in changed
    assert "<strong>rule</strong>" in changed and '<td class="reason">—</td>' in changed
    assert "quiet week" in paused
    assert client.get(LIST + "ghost/history/").status_code == 404


def test_the_list_marks_late_schedules(client: Any, durable: Durable, clock: FakeClock) -> None:
    durable.schedules.create("hourly", "shop.report", "Ada", Every(timedelta(hours=1)))
    durable.schedules.create("daily", "shop.report", "Ada", Daily("02:00", "Europe/Oslo"))
    clock.now += timedelta(hours=1, seconds=59)  # hourly due 59 s ago: not late yet (60 s)
    assert 'class="late"' not in row_of(text(client.get(LIST)), "hourly")
    clock.now += timedelta(seconds=2)
    page = text(client.get(LIST))
    assert '<span class="late" title="due 61 s ago; not sent yet' in row_of(page, "hourly")
    assert 'class="late"' not in row_of(page, "daily")
    durable.schedules.pause("hourly")
    assert 'class="late"' not in row_of(text(client.get(LIST)), "hourly")


def test_the_admin_says_where_celerys_own_schedule_came_from(client: Any, durable: Durable) -> None:
    """``celery.backend_cleanup`` is installed by Celery's beat because of ``result_expires``
    (B7): its row and its page say so, a ``beat_schedule`` entry says it is one, and a
    schedule made through the API shows nothing extra in the list."""
    from celery.schedules import crontab

    from celery_durable.importers.beat_schedule import import_beat_schedule

    import_beat_schedule(
        durable,
        {
            "celery.backend_cleanup": {
                "task": "celery.backend_cleanup",
                "schedule": crontab("0", "4", "*"),
                "options": {"expires": 12 * 3600},
            },
            "nightly": {"task": "shop.report", "schedule": 3600.0, "args": ["Ada"]},
        },
    )
    durable.schedules.create("by-hand", "shop.report", "Ada", Every(timedelta(hours=1)))
    page = text(client.get(LIST))
    cleanup = row_of(page, "celery.backend_cleanup")
    assert "Celery (result_expires)" in cleanup, cleanup
    assert "beat_schedule" in row_of(page, "nightly")
    assert 'class="origin' not in row_of(page, "by-hand")
    detail = text(client.get(LIST + "celery.backend_cleanup/change/"))
    assert '<td id="durable-origin">installed by Celery because result_expires is set' in detail, (
        detail
    )


def test_run_pages_link_a_parent_and_its_children_both_ways(
    client: Any, durable: Durable, journal_url: str
) -> None:
    """W13: a parent's page lists its children with links; a child's page links its parent."""
    from celery_durable.testing import DurableHarness

    @durable.task(name="shop.part", shared=False)
    def part(x: int) -> int:
        return x + 1

    @durable.task(name="shop.whole", shared=False)
    def whole() -> list[int]:
        return list(durable.map_children(part, [1, 2], at_most=2))

    with DurableHarness(durable.app, journal_url) as harness:
        harness.start()
        whole.apply_async(task_id="tree")
        harness.run_until_idle()
        assert harness.result("tree") == [2, 3]
    page = text(client.get(LIST + "run/tree/"))
    assert 'data-child="tree:0.0"' in page and 'data-child="tree:0.1"' in page
    from django.contrib.admin.utils import quote

    assert f'href="{LIST}run/{quote("tree:0.0")}/"' in page and "finished" in page
    child = text(client.get(f"{LIST}run/{quote('tree:0.1')}/"))
    assert f'<a href="{LIST}run/tree/"><code>tree</code></a>' in child
    assert "No child runs." in child
    assert client.get(LIST + "run/nobody/").status_code == 404


def test_the_page_of_a_child_no_worker_has_taken_yet_links_its_parent(
    client: Any, durable: Durable, journal_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """W13 before the child's message is taken (its stream is empty, its row queued): its
    page exists and links its parent, named by the message the parent sent."""
    from django.contrib.admin.utils import quote

    from celery_durable.testing import DurableHarness
    from celery_durable.worker import children

    @durable.task(name="shop.later", shared=False)
    def later() -> int:
        return 1

    @durable.task(name="shop.waits", shared=False)
    def waits() -> int:
        return int(durable.child(later))

    monkeypatch.setattr(children, "_send", lambda runtime, sends: None)
    with DurableHarness(durable.app, journal_url) as harness:
        harness.start()
        waits.apply_async(task_id="held")
        harness.run_until_idle()
    page = client.get(f"{LIST}run/{quote('held:0')}/")
    assert page.status_code == 200
    child = text(page)
    assert f'<a href="{LIST}run/held/"><code>held</code></a>' in child
    assert "queued" in child and "No child runs." in child


def test_the_run_page_of_a_run_with_a_parallel_and_a_child(
    client: Any, durable: Durable, journal_url: str
) -> None:
    """W13 on a run whose positions are ints and dotted strs (W9): they sort by position."""
    from celery_durable import parallel
    from celery_durable.testing import DurableHarness

    @durable.step(name="shop.leg")
    def leg(x: int) -> int:
        return x

    @durable.task(name="shop.piece", shared=False)
    def piece(x: int) -> int:
        return leg(x)

    @durable.task(name="shop.mixed", shared=False)
    def mixed() -> Any:
        both = parallel(lambda: leg(1), lambda: leg(2))
        return [both, durable.child(piece, 3)]

    with DurableHarness(durable.app, journal_url) as harness:
        harness.start()
        mixed.apply_async(task_id="mixed")
        harness.run_until_idle()
        assert harness.result("mixed") == [[1, 2], 3]
    page = text(client.get(LIST + "run/mixed/"))
    assert 'data-child="mixed:1"' in page and "finished" in page


# Reads of a schedule's page ------------------------------------------------------------------


def _queries_of_the_schedule_page(client: Any, durable: Durable, sid: str) -> int:
    """How many SQL statements the journal runs to serve the schedule's page."""
    from sqlalchemy import event

    count = 0

    def counted(*_: Any) -> None:
        nonlocal count
        count += 1

    engine = durable.journal.engine
    event.listen(engine, "before_cursor_execute", counted)
    try:
        assert client.get(LIST + f"{sid}/change/").status_code == 200
    finally:
        event.remove(engine, "before_cursor_execute", counted)
    return count


def test_the_schedule_page_reads_its_runs_in_a_bounded_number_of_queries(
    client: Any, durable: Durable, clock: FakeClock
) -> None:
    """The runs on a schedule's page are read for the page (their run rows in one query, the
    endings of their durable runs in one more), not once per run."""
    task = durable.app.tasks["shop.backup"]
    counts = []
    for sid, runs in (("few", 2), ("many", 12)):
        durable.schedules.create(sid, "shop.backup", "fail", Every(timedelta(minutes=1)))
        for _ in range(runs):
            clock.now += timedelta(minutes=1)
            run_id = durable.schedules.trigger(sid)
            [run] = [r for r in durable.schedules.runs(sid) if r.run_id == run_id]
            args, kwargs, _ = scheduled_message(ScheduledRun(sid, run.due, run.input))
            task.apply(args, kwargs, task_id=run_id)
        page = client.get(LIST + f"{sid}/change/")
        assert len(page.context["runs"]) == runs
        assert all(r.outcome == "faulted" for r in page.context["runs"])
        counts.append(_queries_of_the_schedule_page(client, durable, sid))
    few, many = counts
    assert many == few, f"{few} queries for 2 runs, {many} for 12"
