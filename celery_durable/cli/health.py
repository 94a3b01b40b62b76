"""``celery durable health``: is a dispatcher alive and keeping up (O3)? For probes and scripts.

Exit codes (docs/operations.md): 0 healthy; 1 the journal cannot be read; 2 invalid usage;
7 no dispatcher holds the lease; 8 the holder has not completed a tick recently; 9 a due run
has waited longer than ``--max-lag``.
"""

from __future__ import annotations

import math
from typing import Any

import click

from celery_durable.cli.common import (
    FAILED,
    CliError,
    describe_error,
    echo,
    emit_json,
    json_option,
    option,
    session,
)
from celery_durable.presentation import utc_json

NO_DISPATCHER = 7
STALLED = 8
LAGGING = 9

EXIT_CODES = {"ok": 0, "no_dispatcher": NO_DISPATCHER, "stalled": STALLED, "lagging": LAGGING}


class Seconds(click.FloatRange):
    """A limit in seconds, 0 or more and finite: NaN compares false with every lag (any
    dispatcher would look healthy) and infinity is no JSON number."""

    name = "number of seconds"

    def __init__(self) -> None:
        super().__init__(0, None)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return number


@click.command()
@option(
    "--max-lag",
    type=Seconds(),
    metavar="SECONDS",
    help="Unhealthy when a due run has waited longer than this [default: durable_late_after, 60].",
)
@option(
    "--max-tick-age",
    type=Seconds(),
    metavar="SECONDS",
    help="Unhealthy when the dispatcher's last completed tick is older than this "
    "[default: twice durable_leader_lease].",
)
@json_option
def health(max_lag: float | None, max_tick_age: float | None) -> None:
    """Exit 0 when a dispatcher holds the lease, ticked recently and no due run waits longer
    than --max-lag; else exit 7, 8 or 9 with a one-line reason (1: journal unreadable)."""
    from celery_durable.observability.health import check

    current = session()
    durable = current.durable
    limit_lag = durable.config.late_after if max_lag is None else max_lag
    limit_tick = 2 * durable.config.leader_lease if max_tick_age is None else max_tick_age
    try:
        facts = check(durable.runtime)
    except Exception as exc:  # the journal is away: say so in one line, secrets scrubbed
        message = f"journal unreachable: {describe_error(exc)}"
        for secret in current.secrets():
            message = message.replace(secret, "***")
        if current.json:
            emit_json({"healthy": False, "status": "journal_unreachable", "reason": message})
            raise click.exceptions.Exit(FAILED) from None
        raise CliError(message, FAILED) from None
    verdict, reason = facts.verdict(max_lag=limit_lag, max_tick_age=limit_tick)
    code = EXIT_CODES[verdict]
    if current.json:
        emit_json(_json(facts, verdict, reason, limit_lag, limit_tick))
        if code:
            raise click.exceptions.Exit(code)
        return
    if code:
        raise CliError(reason, code)
    echo(f"ok: {reason}")


def _json(facts: Any, verdict: str, reason: str, max_lag: float, max_tick: float) -> Any:
    lease = facts.lease
    waiting = facts.waiting
    return {
        "healthy": verdict == "ok",
        "status": verdict,
        "reason": reason,
        "checked_at": utc_json(facts.checked_at),
        "holder": facts.holder,
        "lease": None
        if lease is None
        else {
            "owner": lease.owner,
            "expires_at": utc_json(lease.expires_at),
            "taken_at": utc_json(lease.taken_at),
            "ticked_at": utc_json(lease.ticked_at),
        },
        "lease_age_seconds": facts.lease_age,
        "last_tick_age_seconds": facts.tick_age,
        "oldest_waiting": None
        if waiting is None
        else {"schedule": waiting.schedule, "due": utc_json(waiting.since)},
        "lag_seconds": facts.lag,
        "partitions": facts.partitions,
        "unheld_partitions": list(facts.unheld),
        "max_lag_seconds": max_lag,
        "max_tick_age_seconds": max_tick,
    }
