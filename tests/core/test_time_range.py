"""The accepted range of instants and intervals, and display paths that never crash (R8).

Instants a schedule names (``Once``, ``end_at``, backfill bounds) lie in 1970-01-01T00:00:00Z ..
8999-12-31T23:59:59Z; intervals are at most 366 days; JSON text is at most 100 levels deep with
integers of at most 4300 digits. Out of range → one-line ``InvalidSchedule`` / CLI error / form
error, before anything is stored. A journal written before the range existed (a schedule
``Once`` at 9999-12-31T23:59Z) still lists and shows, in the CLI and the Django admin under
``TIME_ZONE=Europe/Oslo``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery

from celery_durable import Daily, Durable, Every, InvalidSchedule, Once
from tests.cli.test_cli import cli, fails, ok
from tests.contrib import test_django_admin as admin
from tests.contrib.test_django_admin import LIST, form_data, text

# The admin tests' fixtures: a Celery app and journal of its own per test, a logged-in client.
django_site, clock, durable, client = admin.django_site, admin.clock, admin.durable, admin.client

UTC = timezone.utc
FAR = datetime(9999, 12, 31, 23, 59, tzinfo=UTC)
ANCIENT = datetime(1, 1, 1, tzinfo=UTC)


@pytest.fixture
def api(sqlite_url: str) -> Iterator[Durable]:
    app = Celery("range_tests", broker="memory://", set_as_current=False)
    app.task(name="t", shared=False)(_noop)
    d = Durable(app, sqlite_url)
    yield d
    d.close()


def _noop(*args: Any) -> None:
    return None


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        (Once(FAR), "Once at 9999-12-31T23:59:00Z is outside the accepted range"),
        (Once(ANCIENT), "Once at 0001-01-01T00:00:00Z is outside the accepted range"),
        (Once(datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)), "outside the accepted range"),
        (Once(datetime(9000, 1, 1, tzinfo=UTC)), "outside the accepted range"),
        (Daily("02:00", "Europe/Oslo", end_at=FAR), "end_at 9999-12-31T23:59:00Z is outside"),
        (Every(timedelta(minutes=1), end_at=datetime(9999, 1, 1, tzinfo=UTC)), "end_at"),
    ],
)
def test_instants_out_of_range_are_refused_before_storing(
    api: Durable, rule: Any, words: str
) -> None:
    with pytest.raises(InvalidSchedule) as info:
        api.schedules.create("s", "t", None, rule)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert api.schedules.state("s") is None


def test_the_edges_of_the_range_are_accepted(api: Durable) -> None:
    last = datetime(8999, 12, 31, 23, 59, 59, tzinfo=UTC)
    api.schedules.create("late", "t", None, Once(last))
    api.schedules.create("ends", "t", None, Every(timedelta(days=366), end_at=last))
    api.schedules.create("early", "t", None, Once(datetime(1970, 1, 1, tzinfo=UTC)))
    assert api.schedules.state("late").next_due == last


def test_backfill_bounds_out_of_range_are_refused(api: Durable) -> None:
    api.schedules.create("s", "t", None, Every(timedelta(hours=1)))
    with pytest.raises(InvalidSchedule, match="backfill start 0001-01-01T00:00:00Z is outside"):
        api.schedules.backfill("s", ANCIENT, datetime.now(UTC))
    west = timezone(-timedelta(hours=5))
    with pytest.raises(InvalidSchedule, match="9999-12-31T23:00:00-05:00 is outside the accepted"):
        api.schedules.backfill("s", datetime.now(UTC), datetime(9999, 12, 31, 23, tzinfo=west))


# -- stored by an older release: every display path copes ------------------------------------------


def _store_out_of_range(d: Durable, monkeypatch: pytest.MonkeyPatch, sid: str, task: str) -> None:
    """Store a schedule the way a release without the range did."""
    import celery_durable.schedules as schedules

    with monkeypatch.context() as patch:
        patch.setattr(schedules, "check_rule_limits", lambda rule: None, raising=False)
        d.schedules.create(sid, task, "/srv", Once(FAR))


def test_cli_lists_and_shows_a_stored_far_future_once(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = Celery("range_cli", set_as_current=False)
    app.task(name="cli.backup", shared=False)(_noop)
    d = Durable(app, sqlite_url)
    try:
        _store_out_of_range(d, monkeypatch, "far", "cli.backup")
        d.schedules.create("near", "cli.backup", None, Every(timedelta(minutes=5)))
    finally:
        d.close()
    listing = ok(sqlite_url, "schedules", "list")
    assert "far" in listing and "near" in listing and "9999-12-31T23:59:00Z" in listing
    assert "beyond the dates of Europe/Oslo" in listing
    shown = ok(sqlite_url, "schedules", "show", "far", "--next", "3")
    assert "9999-12-31T23:59:00Z" in shown
    assert cli(sqlite_url, "--json", "schedules", "list").exit_code == 0


def test_admin_list_and_change_pages_show_a_stored_far_future_once(
    client: Any,
    durable: Durable,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.test import override_settings

    with override_settings(TIME_ZONE="Europe/Oslo"):
        _store_out_of_range(durable, monkeypatch, "far", "shop.report")
        listing = client.get(LIST)
        assert listing.status_code == 200
        assert "far" in text(listing) and "9999-12-31 23:59:00 UTC" in text(listing)
        change = client.get(LIST + "far/change/")
        assert change.status_code == 200


# -- typed in: one-line errors -----------------------------------------------------------------

HUGE = [
    (["--every", "99999999999999999999999d"], "is longer than 366 days"),
    (["--every", "1" + "0" * 400 + "s"], "is longer than 366 days"),
    (["--every", "1" + "0" * 400], "is longer than 366 days"),
    (["--every", "1m", "--input", "1" * 5000], "holds an integer longer than 4300 digits"),
    (["--every", "1m", "--input", "[" * 5000 + "]" * 5000], "nested deeper than 100 levels"),
    (["--every", "1m", "--args", "[" * 5000 + "]" * 5000], "nested deeper than 100 levels"),
    (["--once", "9999-12-31T23:59Z"], "outside the accepted range"),
    (["--once", "0001-01-01T00:00Z"], "outside the accepted range"),
    (["--once", "9999-12-31T23:59-05:00"], "9999-12-31T23:59:00-05:00 is outside the accepted"),
]


@pytest.mark.parametrize(("args", "words"), HUGE)
def test_cli_refuses_huge_values_in_one_line(sqlite_url: str, args: list[str], words: str) -> None:
    ok(sqlite_url, "db", "init")  # a read of a journal that does not exist is refused
    line = fails(sqlite_url, 2, "schedules", "create", "s", "cli.backup", *args)
    assert words in line and len(line) < 300, line
    assert "No schedules." in ok(sqlite_url, "schedules", "list")


def test_api_refuses_huge_values_in_one_line(api: Durable) -> None:
    deep: Any = None
    for _ in range(5000):
        deep = [deep]
    for value, words in ((10**5000, "holds an integer longer than 4300 digits"),
                         (deep, "nested deeper than 100 levels")):  # fmt: skip
        with pytest.raises(InvalidSchedule) as info:
            api.schedules.create("s", "t", value, Every(timedelta(minutes=1)))
        assert words in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(InvalidSchedule, match="between 1 second and 366 days"):
        Every(timedelta(days=999_999_999))


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"kind": "every", "every": "99999999999999999999999d"}, "every", "longer than 366 days"),
        ({"kind": "every", "every": "1" + "0" * 400 + "s"}, "every", "longer than 366 days"),
        ({"input": "1" * 5000}, "input", "integer longer than 4300 digits"),
        ({"input": "[" * 5000 + "]" * 5000}, "input", "nested deeper than 100 levels"),
        ({"options": '{"args": ' + "[" * 5000 + "]" * 5000 + "}"}, "options", "nested deeper"),
        ({"kind": "once", "once_at": "9999-12-31 23:59"}, "once_at", "outside the accepted"),
        ({"kind": "once", "once_at": "0001-01-01 00:00"}, "once_at", "outside the accepted"),
        ({"end_at": "9999-12-31 23:59"}, "end_at", "outside the accepted range"),
    ],
)
def test_admin_add_form_refuses_huge_values_on_their_field(
    client: Any,
    durable: Durable,
    changes: dict[str, str],
    field: str,
    words: str,
) -> None:
    response = client.post(LIST + "add/", form_data(**changes))
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert words in " ".join(errors.get(field, [])), errors
    assert durable.schedules.list() == []
