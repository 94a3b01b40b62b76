"""Services a test needs that this machine lacks: skipped outside CI, counted, failed under CI.

PostgreSQL and Redis fall back to throwaway servers (``services.py``); MariaDB/MySQL, RabbitMQ
and Chromium cannot be pip-installed. On a user's machine a test needing one of them that is
missing is *skipped*, with a reason ``"<service> missing: <why>"``; ``tests/conftest.py`` counts
those skips and ends the run with one line naming each missing service, how many tests it cost
and what enables it. With ``CI=true`` (``.ci/run`` provides all of them) the same test *fails*:
there a missing service is a broken set-up, not a missing extra.
"""

from __future__ import annotations

import re
from typing import NoReturn

import pytest

from tests.support.services import truthy_env

#: What enables each service that can be missing, as the summary line names it.
ENABLE = {
    "MariaDB/MySQL": (
        "start MariaDB on 127.0.0.1:3306 (`apt-get install -y mariadb-server`) "
        "or set CELERY_DURABLE_TEST_MYSQL_URL"
    ),
    "RabbitMQ": (
        "start RabbitMQ on 127.0.0.1:5672 (`apt-get install -y rabbitmq-server`) "
        "or set CELERY_DURABLE_TEST_AMQP_URL"
    ),
    "Chromium": "`apt-get update && apt-get install -y chromium` or set CELERY_DURABLE_CHROMIUM",
}

#: A skip reason written by :func:`skip_or_fail` (pytest prefixes ``Skipped: ``).
REASON = re.compile(
    r"^(?:Skipped: )?(?P<service>" + "|".join(map(re.escape, ENABLE)) + r") missing: "
)


def skip_or_fail(service: str, why: str) -> NoReturn:
    """Skip the current test because ``service`` (a key of :data:`ENABLE`) is missing, or fail
    it when ``CI`` is set. ``why`` says what was looked for and where."""
    if service not in ENABLE:
        raise ValueError(f"unknown service {service!r}: not one of {sorted(ENABLE)}")
    if truthy_env("CI"):
        pytest.fail(why, pytrace=False)
    pytest.skip(f"{service} missing: {why} (with CI=true this fails)")


def missing_service(reason: str) -> str | None:
    """The service a skip reason written by :func:`skip_or_fail` names, else ``None``."""
    match = REASON.match(reason)
    return match.group("service") if match else None


def summary_line(skipped: dict[str, int]) -> str:
    """``"skipped, service missing (…): MariaDB/MySQL: 212 tests — start …; RabbitMQ: 53 tests —
    …"``: each missing service, the tests skipped for want of it and what enables it."""
    parts = [
        f"{service}: {count} test{'s' if count != 1 else ''} — {ENABLE[service]}"
        for service, count in sorted(skipped.items())
    ]
    return "skipped, service missing (with CI=true these fail): " + "; ".join(parts)
