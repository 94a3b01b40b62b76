"""Blackout windows in the Django admin (SPEC P4): the form edits them, the page shows them
with the next run that really happens, and a change that does not touch them keeps them."""

from __future__ import annotations

from typing import Any

from celery_durable import Blackout, Durable
from tests.test_django_admin import LIST, T0, client, clock, django_site, durable, form_data, text

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
