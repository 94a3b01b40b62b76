"""``celery durable beats`` and ``celery durable partitions show|set`` (D10, D11).

Exit codes: 0 done; 1 the journal cannot be read; 2 invalid usage (a bad count, more than one
partition on SQLite); 4 ``set`` refused because beats hold leases.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from celery_durable.cli.common import (
    CONFLICT,
    CliError,
    DurableGroup,
    echo,
    emit_json,
    invalid,
    json_option,
    session,
    shown,
    table,
)
from celery_durable.presentation import utc_json, utc_text


def _live_beats(durable: Any, now: datetime) -> tuple[int, list[dict[str, Any]]]:
    """The journal's partition count and each live beat: partitions held, last tick, lag."""
    from celery_durable.core.partitions import partition_of
    from celery_durable.store.partitions import (
        BEAT,
        partition_count,
        partition_of_lease,
        read_leases,
    )

    count = partition_count(durable.runtime.sql_journal)
    beats: dict[str, dict[str, Any]] = {}
    for row in read_leases(durable.runtime.sql_journal):
        if row.expires_at < now:
            continue
        beat = beats.setdefault(
            row.owner, {"owner": row.owner, "partitions": [], "ticked_at": None}
        )
        k = partition_of_lease(row.name)
        if k is not None and k < count:
            beat["partitions"].append(k)
        if (row.name.startswith(BEAT) or count == 1) and row.ticked_at is not None:
            beat["ticked_at"] = row.ticked_at
    oldest: dict[int, datetime] = {}
    for sid, when in durable.index.waiting_rows(now, 500):  # oldest first
        oldest.setdefault(partition_of(sid, count), when)
    out = []
    for beat in sorted(beats.values(), key=lambda b: b["owner"]):
        beat["partitions"].sort()
        dues = [oldest[k] for k in beat["partitions"] if k in oldest]
        beat["lag_seconds"] = max(0.0, (now - min(dues)).total_seconds()) if dues else 0.0
        tick = beat["ticked_at"]
        beat["tick_age_seconds"] = None if tick is None else (now - tick).total_seconds()
        out.append(beat)
    return count, out


@click.command()
@json_option
def beats() -> None:
    """List the live beats: the partitions each holds, its last tick and its lag (D11)."""
    current = session()
    durable = current.durable
    now = durable.now()
    count, found = _live_beats(durable, now)
    held = {k for b in found for k in b["partitions"]}
    unheld = [k for k in range(count) if k not in held]
    if current.json:
        emit_json(
            {
                "partitions": count,
                "unheld_partitions": unheld,
                "beats": [{**b, "ticked_at": utc_json(b["ticked_at"])} for b in found],
            }
        )
        return
    rows = [
        (
            shown(b["owner"]),
            ",".join(map(str, b["partitions"])) or "-",
            utc_text(b["ticked_at"]),
            f"{b['lag_seconds']:.1f}s",
        )
        for b in found
    ]
    echo(table(["BEAT", "PARTITIONS", "LAST TICK", "LAG"], rows) if rows else "no live beat")
    if unheld:
        echo(f"unheld partitions: {','.join(map(str, unheld))}")


@click.group(cls=DurableGroup, name="partitions")
def partitions() -> None:
    """Show or change how many partitions the journal's schedules are split into (D10)."""


@partitions.command(name="show")
@json_option
def show() -> None:
    """Print the journal's partition count."""
    from celery_durable.store.partitions import partition_count

    current = session()
    count = partition_count(current.durable.runtime.sql_journal)
    if current.json:
        emit_json({"partitions": count})
    else:
        echo(str(count))


@partitions.command(name="set")
@click.argument("count", metavar="N")
@json_option
def set_count(count: str) -> None:
    """Change the partition count to N; refused while any beat holds a lease.

    Stop every beat first (and set durable_partitions = N in the app before starting them).
    """
    from celery_durable.core.partitions import PartitionsError, check_partitions
    from celery_durable.store.partitions import set_partitions

    current = session()
    try:
        number = check_partitions(count, "N")
    except PartitionsError as exc:
        raise invalid(str(exc)) from None
    durable = current.durable
    try:
        change = set_partitions(durable.runtime.sql_journal, number, durable.now())
    except PartitionsError as exc:
        if "hold leases" in str(exc):
            raise CliError(str(exc), CONFLICT) from None
        raise invalid(str(exc)) from None
    if current.json:
        emit_json({"partitions": change.after, "before": change.before})
    else:
        echo(f"partitions: {change.before} -> {change.after}")
