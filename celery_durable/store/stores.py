"""The stores a :class:`~celery_durable.runtime.Runtime` can be built on, and their parts.

Two stores keep the same promises: :class:`~.sql_store.SqlStore` (SQLite, PostgreSQL,
MySQL/MariaDB) and :class:`~.memory.MemoryStore` (this process only, for tests). Each hands out
the same parts: a journal, units of work, the schedule index, the run table and the dispatcher
leases; the unions below are what the services hold (mypy checks every call on both).
"""

from __future__ import annotations

from typing import TypeAlias

from celery_durable.store.index import ScheduleIndex
from celery_durable.store.journal.memory import MemoryJournal
from celery_durable.store.journal.sql import SqlJournal
from celery_durable.store.lease import Lease
from celery_durable.store.memory import MemoryStore
from celery_durable.store.memory.index import MemoryIndex
from celery_durable.store.memory.leases import MemoryLease, MemoryLeases
from celery_durable.store.memory.runs import MemoryRunTable
from celery_durable.store.partitions import PartitionLeases
from celery_durable.store.runs import RunStore
from celery_durable.store.sql_store import SqlStore

AnyStore: TypeAlias = SqlStore | MemoryStore
AnyJournal: TypeAlias = SqlJournal | MemoryJournal
AnyIndex: TypeAlias = ScheduleIndex | MemoryIndex
AnyRunTable: TypeAlias = RunStore | MemoryRunTable
AnyLeases: TypeAlias = PartitionLeases | MemoryLeases
AnyLease: TypeAlias = Lease | MemoryLease

STORES = (SqlStore, MemoryStore)
"""The store classes (for ``isinstance``)."""

__all__ = [
    "STORES",
    "AnyIndex",
    "AnyJournal",
    "AnyLease",
    "AnyLeases",
    "AnyRunTable",
    "AnyStore",
]
