"""``celery durable schedules … --blackout/--on-blackout`` and ``celery durable blackouts``
(SPEC P4)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest

from tests.cli.test_cli import as_json, fails, ok

FREEZE = "freeze;2030-12-20T00:00Z;2031-01-02T00:00Z"
NIGHTLY = "nightly;cron 0 2 * * *;2h;Europe/Oslo"


def test_create_show_and_change_blackout_windows(sqlite_url: str) -> None:
    url = sqlite_url
    ok(url, "schedules", "create", "s", "cli.backup", "--every", "1m",
       "--blackout", NIGHTLY, "--blackout", "weekend;weekly sat,sun@08:00;1h",
       "--on-blackout", "defer")  # fmt: skip
    shown = ok(url, "schedules", "show", "s")
    assert f"[{NIGHTLY}]; [weekend;weekly sat,sun@08:00;1h;UTC]" in shown
    assert [line.split() for line in shown.splitlines() if line.startswith("On blackout")] == [
        ["On", "blackout", "defer"]
    ]
    data = as_json(url, "schedules", "show", "s")
    assert (data["blackouts"], data["on_blackout"]) == (
        [NIGHTLY, "weekend;weekly sat,sun@08:00;1h;UTC"],
        "defer",
    )
    changed = as_json(url, "schedules", "change", "s", "--blackout", FREEZE)
    assert changed["schedule"]["blackouts"] == ["freeze;2030-12-20T00:00:00Z;2031-01-02T00:00:00Z"]
    assert changed["schedule"]["on_blackout"] == "defer"  # not given: kept
    cleared = as_json(url, "schedules", "change", "s", "--no-blackouts", "--on-blackout", "skip")
    assert (cleared["schedule"]["blackouts"], cleared["schedule"]["on_blackout"]) == ([], "skip")
    shown = ok(url, "schedules", "show", "s")
    assert "Blackouts" not in shown and "Global blackouts" not in shown
    assert "On blackout" in shown  # always: it governs the global windows too


def test_bad_blackout_windows_are_refused_naming_what_is_wrong(sqlite_url: str) -> None:
    url = sqlite_url
    for text, words in [
        ("nightly", "is not NAME;"),
        (";cron 0 2 * * *;2h", "blackout name must not be blank"),
        ("n;cron 0 2 * * *;0s", "more than 0 s"),
        ("n;cron 0 2 * * *;2h;Mars/Base", "unknown time zone"),
        ("n;2030-01-02T00:00Z;2030-01-01T00:00Z", "is not after start"),
    ]:
        line = fails(url, 2, "schedules", "create", "s", "cli.backup", "--every", "1m",
                     "--blackout", text)  # fmt: skip
        assert words in line, (text, line)
    line = fails(url, 2, "schedules", "create", "s", "cli.backup", "--every", "1m",
                 "--on-blackout", "later")  # fmt: skip
    assert "later" in line


def test_global_windows_are_set_shown_and_cleared(sqlite_url: str) -> None:
    url = sqlite_url
    assert as_json(url, "blackouts", "set", NIGHTLY, FREEZE, "--reason", "year end") == {
        "blackouts": [NIGHTLY, "freeze;2030-12-20T00:00:00Z;2031-01-02T00:00:00Z"],
        "changed": True,
    }
    assert as_json(url, "blackouts", "set", NIGHTLY, FREEZE)["changed"] is False
    assert "nightly" in ok(url, "blackouts", "show")
    assert as_json(url, "blackouts", "clear") == {"blackouts": [], "changed": True}
    assert "no global blackout windows" in ok(url, "blackouts", "show")
    ok(url, "blackouts", "set", NIGHTLY)
    assert ok(url, "blackouts", "clear").splitlines() == [
        "global blackout windows cleared",
        "no global blackout windows",
    ]


def _z(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _fields(shown: str) -> dict[str, str]:
    """``schedules show``'s field lines (up to the first blank line) as a dict."""
    head = shown.split("\n\n", 1)[0]
    return dict(re.split(r"\s{2,}", line, maxsplit=1) for line in head.splitlines())


@pytest.mark.parametrize("on_blackout", ["skip", "defer"])
def test_show_and_list_say_which_due_times_a_global_window_skips_or_moves(
    sqlite_url: str, on_blackout: str
) -> None:
    """P4: a schedule with no window of its own still honours the global ones: ``show``
    lists them, gives the policy and the next run, and marks the due times they affect;
    ``list`` has the next run as a column."""
    url = sqlite_url
    ok(url, "schedules", "create", "s", "cli.backup", "--every", "1h", "--on-blackout", on_blackout)
    view = as_json(url, "schedules", "show", "s")
    first = datetime.fromisoformat(view["next_due"].replace("Z", "+00:00"))
    end = (first + timedelta(hours=2, minutes=30)).replace(microsecond=0)
    freeze = f"freeze;{_z(first - timedelta(days=1))};{_z(end)}"
    ok(url, "blackouts", "set", freeze)
    shown = ok(url, "schedules", "show", "s", "--next", "4")
    fields = _fields(shown)
    stored_freeze = f"freeze;{_z(first - timedelta(days=1))};{_z(end)}"
    assert "Blackouts" not in fields
    assert fields["Global blackouts"] == f"[{stored_freeze}]"
    assert fields["On blackout"] == on_blackout
    next_run = end if on_blackout == "defer" else first + timedelta(hours=3)
    assert fields["Next run"].startswith(_z(next_run) + "  (")
    table = shown.split("Next due times\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert table[0].split() == ["UTC", "LOCAL", "BLACKOUT"]
    marks = [re.split(r"\s{2,}", line.strip())[2:] for line in table[1:]]
    if on_blackout == "defer":
        assert marks == [[f"runs {_z(end)}: freeze"], ["skipped: freeze"], ["skipped: freeze"], []]
    else:
        assert marks == [["skipped: freeze"]] * 3 + [[]]
    data = as_json(url, "schedules", "show", "s", "--next", "4")
    assert data["global_blackouts"] == [stored_freeze]
    assert [(u["runs"], u["blackout"]) for u in data["upcoming"]] == [
        (on_blackout == "defer", "freeze"),
        (False, "freeze"),
        (False, "freeze"),
        (True, None),
    ]
    listing = ok(url, "schedules", "list").splitlines()
    assert "NEXT RUN (UTC)" in listing[0]
    assert _z(next_run) in listing[1]
    assert as_json(url, "schedules", "list")[0]["next_run"].startswith(_z(next_run)[:-1])


def test_the_next_run_line_without_any_window(sqlite_url: str) -> None:
    url = sqlite_url
    ok(url, "schedules", "create", "s", "cli.backup", "--every", "1h")
    view = as_json(url, "schedules", "show", "s")
    fields = _fields(ok(url, "schedules", "show", "s"))
    assert fields["Next run"].startswith(view["next_due"][:19] + "Z  (")
    assert fields["On blackout"] == "skip"
    ok(url, "schedules", "pause", "s")
    assert _fields(ok(url, "schedules", "show", "s"))["Next run"] == "none"
