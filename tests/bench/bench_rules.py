"""Per-call cost of ``next_after`` against croniter and cronsim, measured in the same run.

Run: ``python tests/bench/bench_rules.py [--calls 10000] [--reps 7]``. Prints a markdown table.

Each contender computes ``--calls`` successive due times from 2026-01-01T00:00Z. The peers get
their cheapest use: one iterator object asked for the next time again and again. Ours is
stateless: ``next_after`` is called with the previous due time, which is how the dispatcher
uses it. Reps are interleaved (ours, croniter, cronsim, ours, …) so that drift in machine speed
hits every contender alike; the table shows the median µs per call. "differ" counts the due
times of a peer that are not ours over the same run (the DST days, where the peers break R7).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from zoneinfo import ZoneInfo

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from croniter import croniter
from cronsim import CronSim

from celery_durable.core.rules import Cron, Daily, Rule, Weekly

START = datetime(2026, 1, 1, tzinfo=timezone.utc)

CASES: list[tuple[str, Rule, str, str]] = [
    ("Daily 02:00 Europe/Oslo", Daily("02:00", "Europe/Oslo"), "0 2 * * *", "Europe/Oslo"),
    (
        "Weekly mon,thu 08:00 Europe/Oslo",
        Weekly(["mon", "thu"], "08:00", "Europe/Oslo"),
        "0 8 * * mon,thu",
        "Europe/Oslo",
    ),
    ('Cron "0 2 * * *" Europe/Oslo', Cron("0 2 * * *", "Europe/Oslo"), "0 2 * * *", "Europe/Oslo"),
    (
        'Cron "*/15 9-17 * * mon-fri" UTC',
        Cron("*/15 9-17 * * mon-fri", "UTC"),
        "*/15 9-17 * * mon-fri",
        "UTC",
    ),
]


def ours(rule: Rule, calls: int) -> list[datetime]:
    out, due = [], START
    for _ in range(calls):
        nxt = rule.next_after(due)
        if nxt is None:
            break
        out.append(nxt)
        due = nxt
    return out


def with_croniter(expr: str, zone: str, calls: int) -> list[datetime]:
    it = croniter(expr, START.astimezone(ZoneInfo(zone)))
    return [it.get_next(datetime) for _ in range(calls)]


def with_cronsim(expr: str, zone: str, calls: int) -> list[datetime]:
    it = CronSim(expr, START.astimezone(ZoneInfo(zone)))
    return [next(it) for _ in range(calls)]


def timed(run: Callable[[], list[datetime]], calls: int) -> tuple[float, list[datetime]]:
    began = time.perf_counter()
    result = run()
    return (time.perf_counter() - began) / calls * 1e6, result


def differ(peer: list[datetime], mine: list[datetime]) -> int:
    return len({d.astimezone(timezone.utc) for d in peer} - set(mine))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    calls = args.calls

    print(f"next_after: {calls} successive due times from {START:%Y-%m-%d}, median of {args.reps}")
    print(f"interleaved reps, µs per call; Python {sys.version.split()[0]}\n")
    print("| rule | ours | croniter | cronsim | ours / faster peer | differ (croniter, cronsim) |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, rule, expr, zone in CASES:
        contenders: dict[str, Callable[[], list[datetime]]] = {
            "ours": partial(ours, rule, calls),
            "croniter": partial(with_croniter, expr, zone, calls),
            "cronsim": partial(with_cronsim, expr, zone, calls),
        }
        samples: dict[str, list[float]] = {name: [] for name in contenders}
        results: dict[str, list[datetime]] = {}
        for _ in range(args.reps):
            for name, run in contenders.items():
                cost, results[name] = timed(run, calls)
                samples[name].append(cost)
        median = {name: statistics.median(values) for name, values in samples.items()}
        faster = min(median["croniter"], median["cronsim"])
        print(
            f"| {label} | {median['ours']:.2f} | {median['croniter']:.2f} "
            f"| {median['cronsim']:.2f} | {median['ours'] / faster:.2f} "
            f"| {differ(results['croniter'], results['ours'])}, "
            f"{differ(results['cronsim'], results['ours'])} |"
        )


if __name__ == "__main__":
    main()
