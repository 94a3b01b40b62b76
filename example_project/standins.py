"""Stand-ins for the outside systems the jobs talk to: a backup store and a billing system.

Real systems like these accept an *idempotency key* with each request and remember it, so a
request sent twice (a retried HTTP call, a task replayed after a crash) is done once. The
stand-ins do the same, persistently: a SQLite table in the data folder whose primary key is
the idempotency key (backups) or the invoice number (billing). They survive a worker restart,
which memory would not.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def _connect(path: Path) -> Iterator[sqlite3.Connection]:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        yield conn
    finally:
        conn.close()


class BackupStore:
    """Stores folder snapshots, once per idempotency key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _setup(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS backups ("
            " idempotency_key TEXT PRIMARY KEY, folder TEXT NOT NULL, files TEXT NOT NULL)"
        )

    def put(self, idempotency_key: str, folder: str, files: list[dict[str, Any]]) -> bool:
        """Store a snapshot; ``False`` when this key was stored before (nothing is stored)."""
        with _connect(self.path) as conn:
            self._setup(conn)
            cursor = conn.execute(
                "INSERT OR IGNORE INTO backups VALUES (?, ?, ?)",
                (idempotency_key, folder, json.dumps(files)),
            )
            return cursor.rowcount == 1

    def keys(self) -> list[str]:
        """Every idempotency key stored, in key order."""
        with _connect(self.path) as conn:
            self._setup(conn)
            return [
                row[0] for row in conn.execute("SELECT idempotency_key FROM backups ORDER BY 1")
            ]


class Billing:
    """Issues invoices, once per invoice number."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _setup(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS invoices ("
            " number TEXT PRIMARY KEY, customer TEXT NOT NULL, amount_cents INTEGER NOT NULL)"
        )

    def issue(self, number: str, customer: str, amount_cents: int) -> bool:
        """Issue invoice ``number``; ``False`` when it was issued before (nothing happens)."""
        with _connect(self.path) as conn:
            self._setup(conn)
            cursor = conn.execute(
                "INSERT OR IGNORE INTO invoices VALUES (?, ?, ?)", (number, customer, amount_cents)
            )
            return cursor.rowcount == 1

    def numbers(self) -> list[str]:
        """Every invoice number issued, in order."""
        with _connect(self.path) as conn:
            self._setup(conn)
            return [row[0] for row in conn.execute("SELECT number FROM invoices ORDER BY 1")]
