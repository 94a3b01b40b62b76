"""``celery durable schedules … --blackout/--on-blackout`` and ``celery durable blackouts``
(SPEC P4)."""

from __future__ import annotations

from tests.test_cli import as_json, fails, ok

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
    assert "Blackouts" not in ok(url, "schedules", "show", "s")


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
