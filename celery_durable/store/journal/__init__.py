"""The journal: append-only event streams in SQL (see docs/journal.md)."""

from __future__ import annotations

from celery_durable.core.journal import Append, Journal, NewEvent, StoredEvent
from celery_durable.store.journal.sql import SqlJournal, open_journal

__all__ = ["Append", "Journal", "NewEvent", "SqlJournal", "StoredEvent", "open_journal"]
