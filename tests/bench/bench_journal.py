"""Benchmark: what does the journal add to one INSERT + COMMIT?

    python tests/bench/bench_journal.py --n 1000 --reps 5

For each backend (SQLite file in WAL mode with synchronous=FULL and =NORMAL; PostgreSQL in a
fresh schema that is dropped afterwards) it times, interleaved within every repetition:

* ``floor``: a bare single-row SQLAlchemy Core ``INSERT`` + ``COMMIT`` into a side table with
  the events table's columns and indexes, on an engine with the same database settings;
* ``append schedule/…``: ``journal.append`` to an ordered category (advisory lock on PostgreSQL);
* ``append run/…``: ``journal.append`` to an unordered category.

Each append continues a stream (expected version = its current version), so the
previous-version guard is exercised. Then ``append_many`` throughput: 10,000 events in batches
of 1,000 appends. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Column,
    Index,
    MetaData,
    Table,
    UniqueConstraint,
    create_engine,
    event,
    insert,
)
from sqlalchemy.engine import Engine, make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from celery_durable.core.journal import Append, NewEvent
from celery_durable.store.journal import schema as journal_schema
from celery_durable.store.journal.sql import SqlJournal

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DATA = {"due": "2026-11-16T01:00:00.0000000Z", "task": "tasks.backup", "input": {"n": 1}}


def floor_table(metadata: MetaData) -> Table:
    """A table shaped like the events table (same columns and indexes) under another name."""
    events = journal_schema.events
    return Table(
        "bench_floor",
        metadata,
        *(
            Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
            for c in events.columns
        ),
        UniqueConstraint("stream", "version", name="uq_bench_floor_stream_version"),
        Index("ix_bench_floor_category_position", "category", "position"),
        sqlite_autoincrement=True,
    )


def floor_engine(url: str, synchronous: str | None) -> Engine:
    engine = create_engine(url)
    if synchronous is not None:

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA busy_timeout = 30000")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute(f"PRAGMA synchronous = {synchronous}")
            cursor.close()

    return engine


@contextmanager
def pg_schema(base_url: str) -> Iterator[str]:
    name = f"bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
    url = make_url(base_url).update_query_dict({"options": f"-csearch_path={name}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{name}" CASCADE')
        admin.dispose()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(n: int, op: Callable[[int], None]) -> list[float]:
    samples = []
    for i in range(n):
        start = time.perf_counter()
        op(i)
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


def bench_backend(label: str, url: str, synchronous: str | None, n: int, reps: int) -> list[str]:
    options: dict[str, Any] = {}
    if synchronous is not None:
        options["sqlite_synchronous"] = synchronous
    journal = SqlJournal(url, **options)
    journal.ensure_ready()
    engine = floor_engine(url, synchronous)
    metadata = MetaData()
    table = floor_table(metadata)
    metadata.create_all(engine)
    event_ = NewEvent(type="RunDecided", data=DATA)
    floor_stmt = insert(table)
    counter = {"floor": 0}

    def floor_op(i: int) -> None:
        counter["floor"] += 1
        with engine.begin() as conn:
            conn.execute(
                floor_stmt,
                {
                    "stream": "schedule/floor",
                    "version": counter["floor"],
                    "category": "schedule",
                    "type": event_.type,
                    "data": '{"due":"2026-11-16T01:00:00.0000000Z"}',
                    "recorded_at": datetime.now(timezone.utc),
                },
            )

    def append_op(category: str, rep: int) -> Callable[[int], None]:
        stream = f"{category}/bench-{rep}"

        def op(i: int) -> None:
            journal.append(stream, i, [event_])

        return op

    samples: dict[str, list[float]] = {"floor": [], "schedule": [], "run": []}
    per_rep_ratio: dict[str, list[float]] = {"schedule": [], "run": []}
    # Warm-up: pools, statement caches, the file's first pages.
    timed(50, floor_op)
    timed(50, append_op("schedule", -1))
    timed(50, append_op("run", -1))
    cases = ["floor", "schedule", "run"]
    for rep in range(reps):
        medians: dict[str, float] = {}
        order = cases[rep % 3 :] + cases[: rep % 3]  # rotate to cancel drift
        for case in order:
            op = floor_op if case == "floor" else append_op(case, rep)
            got = timed(n, op)
            samples[case].extend(got)
            medians[case] = statistics.median(got)
        for case in ("schedule", "run"):
            per_rep_ratio[case].append(medians[case] / medians["floor"])

    floor_median = statistics.median(samples["floor"])
    lines = [
        f"| {label} | floor INSERT+COMMIT | {floor_median:.0f} | "
        f"{percentile(samples['floor'], 0.9):.0f} | 1.00 | |"
    ]
    for case in ("schedule", "run"):
        median = statistics.median(samples[case])
        ratios = per_rep_ratio[case]
        lines.append(
            f"| {label} | append {case}/… | {median:.0f} | {percentile(samples[case], 0.9):.0f} | "
            f"{median / floor_median:.2f} | {min(ratios):.2f}-{max(ratios):.2f} |"
        )

    # append_many throughput: 10,000 events in batches of 1,000 appends (one event each).
    total, batch = 10_000, 1_000
    rates = []
    for rep in range(max(1, min(reps, 3))):
        start = time.perf_counter()
        for b in range(total // batch):
            journal.append_many(
                [
                    Append(stream=f"run/many-{rep}-{b}-{i}", expected_version=0, events=[event_])
                    for i in range(batch)
                ]
            )
        rates.append(total / (time.perf_counter() - start))
    lines.append(
        f"| {label} | append_many 10k (batches of 1k) | | | | "
        f"{statistics.median(rates):,.0f} events/s |"
    )
    journal.close()
    engine.dispose()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="appends per case per repetition")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--skip-pg", action="store_true")
    parser.add_argument("--skip-sqlite", action="store_true")
    args = parser.parse_args()

    rows: list[str] = []
    if not args.skip_sqlite:
        for sync in ("FULL", "NORMAL"):
            with tempfile.TemporaryDirectory() as tmp:
                url = f"sqlite:///{tmp}/bench.db"
                rows += bench_backend(f"SQLite WAL {sync}", url, sync, args.n, args.reps)
    if not args.skip_pg:
        with pg_schema(args.pg_url) as url:
            rows += bench_backend("PostgreSQL", url, None, args.n, args.reps)

    print(f"n={args.n} per case per repetition, {args.reps} repetitions, interleaved\n")
    print("| backend | operation | median µs | p90 µs | ratio to floor | per-rep ratio / rate |")
    print("|---|---|---:|---:|---:|---:|")
    for line in rows:
        print(line)


if __name__ == "__main__":
    main()
