"""Blackout windows in the Django admin (SPEC P4): the form edits them, the page shows them
with the next run that really happens, and a change that does not touch them keeps them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery_durable import Blackout, Daily, Durable, Every, Weekly
from celery_durable.core.rules import Crontab
from tests.contrib.test_django_admin import (
    LIST,
    T0,
    client,
    clock,
    django_site,
    durable,
    form_data,
    row_of,
    text,
)

__all__ = ["client", "clock", "django_site", "durable"]  # the fixtures, imported for pytest

NIGHTLY = "nightly;cron 0 2 * * *;2h;Europe/Oslo"
FREEZE = "freeze;2026-11-01T00:00:00Z;2026-11-10T00:00:00Z"  # covers T0 and the next nights


def test_the_form_sets_and_shows_blackout_windows(client: Any, durable: Durable) -> None:
    data = form_data(blackouts=f"{NIGHTLY}\n{FREEZE}\n", on_blackout="defer")
    response = client.post(LIST + "add/", data)
    assert response.status_code == 302, response.context["form"].errors
    view = durable.schedules.state("nightly")
    assert view is not None
    assert [w.describe() for w in view.blackouts] == [NIGHTLY, FREEZE]
    assert view.on_blackout.value == "defer"
    page = client.get(LIST + "nightly/change/")
    initial = page.context["form"].initial
    assert (initial["blackouts"], initial["on_blackout"]) == (f"{NIGHTLY}\n{FREEZE}", "defer")
    html = text(page)
    assert f'id="durable-blackouts">{NIGHTLY}<br>{FREEZE}<' in html
    assert 'id="durable-next-run">2026-11-10 00:00:00 UTC<' in html  # deferred to the freeze's end
    # A change through the form keeps the windows it shows; emptied, they are removed.
    assert client.post(LIST + "nightly/change/", {**data, "at": "03:00"}).status_code == 302
    assert durable.schedules.state("nightly").blackouts == view.blackouts  # type: ignore[union-attr]
    cleared = {**data, "blackouts": "", "on_blackout": ""}
    assert client.post(LIST + "nightly/change/", cleared).status_code == 302
    after = durable.schedules.state("nightly")
    assert after is not None and (after.blackouts, after.on_blackout.value) == ((), "skip")
    assert "durable-blackouts" not in text(client.get(LIST + "nightly/change/"))


def test_a_bad_window_is_shown_on_its_field_and_nothing_is_stored(
    client: Any, durable: Durable
) -> None:
    response = client.post(LIST + "add/", form_data(blackouts="nightly;cron 0 2 * * *;0s"))
    assert response.status_code == 200
    assert "more than 0 s" in str(response.context["form"].errors["blackouts"])
    assert durable.schedules.state("nightly") is None


def test_the_page_shows_the_next_run_after_a_global_window(client: Any, durable: Durable) -> None:
    assert client.post(LIST + "add/", form_data()).status_code == 302
    durable.blackouts.set([Blackout.between("freeze", T0, T0.replace(day=10, hour=0))])
    assert 'id="durable-next-run">2026-11-10 01:00:00 UTC<' in text(
        client.get(LIST + "nightly/change/")
    )


EVERY_KIND = [
    Blackout("crontab", start=Crontab(0, 2, "sat,sun", zone="Europe/Oslo"), duration=3600),
    Blackout("daily", start=Daily("02:00:30", "Europe/Oslo"), duration=timedelta(hours=1)),
    Blackout("weekly", start=Weekly(["sat", "sun"], "08:00", "UTC"), duration=90.5),
    Blackout("cron", start="*/20 8-18 * * mon-fri", duration=timedelta(minutes=5), zone="UTC"),
    Blackout.between("fixed", T0 + timedelta(microseconds=500_000), T0 + timedelta(days=2)),
]


def _initial_as_posted(page: Any) -> dict[str, Any]:
    """The change form's fields as a browser would post them back untouched."""
    form = page.context["form"]
    data = {}
    for name, field in form.fields.items():
        value = form.initial.get(name, field.initial)
        if value is None or name == "id":
            continue
        data[name] = [str(v) for v in value] if isinstance(value, list | tuple) else str(value)
    return data


def test_a_schedule_with_every_kind_of_window_is_saved_back_unchanged(
    client: Any, durable: Durable
) -> None:
    """The form shows each window in the text form and reads it back exactly: saving the
    change page as it is stores nothing new (a Crontab start, seconds in a daily time, a
    fractional duration and a sub-second range once made the schedule impossible to save)."""
    durable.schedules.create(
        "guarded", "shop.backup", "/srv", Every(timedelta(hours=1)), blackouts=EVERY_KIND
    )
    before = durable.schedules.state("guarded")
    assert before is not None
    page = client.get(LIST + "guarded/change/")
    response = client.post(LIST + "guarded/change/", _initial_as_posted(page))
    assert response.status_code == 302, response.context["form"].errors
    after = durable.schedules.state("guarded")
    assert after is not None and after.blackouts == tuple(EVERY_KIND)
    assert after.version == before.version  # the same content: nothing stored (A2)


def test_the_list_shows_the_next_run_that_really_happens(client: Any, durable: Durable) -> None:
    assert client.post(LIST + "add/", form_data()).status_code == 302
    durable.blackouts.set([Blackout.between("freeze", T0, T0.replace(day=10, hour=0))])
    view = durable.schedules.state("nightly")
    assert view is not None and view.next_due == T0.replace(day=3, hour=1)
    row = row_of(text(client.get(LIST)), "nightly")
    assert '<span class="next-utc">2026-11-10 01:00:00 UTC</span>' in row


def test_the_global_windows_page_shows_sets_and_clears_them_with_who_and_why(
    client: Any, durable: Durable
) -> None:
    listing = text(client.get(LIST))
    assert f'href="{LIST}blackouts/" id="durable-global-blackouts"' in listing
    assert "No global blackout windows." in text(client.get(LIST + "blackouts/"))
    response = client.post(
        LIST + "blackouts/", {"windows": f"{NIGHTLY}\n{FREEZE}\n", "reason": "year end"}
    )
    assert response.status_code == 302
    assert [w.describe() for w in durable.blackouts.get()] == [NIGHTLY, FREEZE]
    [change] = durable.blackouts.history()
    assert (change.by, change.reason) == ("admin", "year end")
    page = text(client.get(LIST + "blackouts/"))
    assert f'<td class="window">{NIGHTLY}</td>' in page
    assert '<td class="by">admin</td> <td class="reason">year end</td>' in page
    # The schedule page names the global windows that apply to it.
    assert client.post(LIST + "add/", form_data()).status_code == 302
    assert f'id="durable-global-blackouts">{NIGHTLY}<br>{FREEZE} (' in text(
        client.get(LIST + "nightly/change/")
    )
    # Bad input is shown on the form and nothing is stored.
    bad = client.post(LIST + "blackouts/", {"windows": "x;cron 0 2 * * *;0s", "reason": ""})
    assert bad.status_code == 200 and "more than 0 s" in text(bad)
    assert len(durable.blackouts.history()) == 1
    assert client.post(LIST + "blackouts/", {"_clear": "1", "reason": "over"}).status_code == 302
    assert durable.blackouts.get() == ()
    assert [(c.by, c.reason) for c in durable.blackouts.history()] == [
        ("admin", "over"),
        ("admin", "year end"),
    ]


def test_the_global_windows_page_needs_the_change_permission_to_change(
    durable: Durable, django_site: None
) -> None:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(username="reader", is_staff=True)
    user.user_permissions.set([Permission.objects.get(codename="view_schedule")])
    reader = Client()
    reader.force_login(user)
    assert reader.get(LIST + "blackouts/").status_code == 200
    assert reader.post(LIST + "blackouts/", {"windows": NIGHTLY}).status_code == 403
    assert durable.blackouts.get() == ()
