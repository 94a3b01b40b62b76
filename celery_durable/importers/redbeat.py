"""RedBeat's entries in Redis as importer entries (SPEC I2).

Each entry is the hash ``<key prefix><name>`` with a ``definition`` (name, task, args, kwargs,
options, schedule, enabled) and a ``meta`` (``last_run_at``, ``total_run_count``), both in
RedBeat's JSON, decoded here with RedBeat's own decoder. The keys are listed from the sorted
set ``<key prefix>:schedule``. An entry that never ran is due at once, as RedBeat has it.
"""

from __future__ import annotations

import json
from typing import Any

from celery_durable.errors import InvalidSchedule
from celery_durable.importers.entries import SourceEntry

SOURCE = "redbeat"


def read_entries(redis_url: str, key_prefix: str) -> tuple[list[SourceEntry], dict[str, str]]:
    """The entries under ``key_prefix`` and those that cannot be read (name → reason)."""
    import redis
    from redbeat.decoder import RedBeatJSONDecoder

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        keys: list[str] = sorted(str(k) for k in client.zrange(f"{key_prefix}:schedule", 0, -1))
        found: list[SourceEntry] = []
        bad: dict[str, str] = {}
        for key in keys:
            name = key[len(key_prefix) :] if key.startswith(key_prefix) else key
            definition, meta = client.hmget(key, ["definition", "meta"])
            if not definition:
                continue  # removed while listing, as RedBeat itself skips it
            try:
                data = json.loads(definition, cls=RedBeatJSONDecoder)
                state = json.loads(meta, cls=RedBeatJSONDecoder) if meta else {}
                found.append(entry_of(name, data, state))
            except (InvalidSchedule, ValueError, TypeError, KeyError) as exc:
                bad[name] = str(exc)
        return found, bad
    finally:
        client.close()


def entry_of(name: str, data: dict[str, Any], meta: dict[str, Any]) -> SourceEntry:
    """One RedBeat entry (its decoded definition and meta) as an importer entry."""
    from celery.schedules import crontab, schedule

    sched = data.get("schedule")
    if not isinstance(sched, (crontab, schedule)):
        kind = type(sched).__name__
        raise InvalidSchedule(
            f"a RedBeat {kind} schedule has no stored rule (rrule is not imported)"
        )
    last = meta.get("last_run_at")
    return SourceEntry(
        name=str(data.get("name") or name),
        task=str(data.get("task") or ""),
        schedule=sched,
        args=data.get("args") or [],
        kwargs=data.get("kwargs") or {},
        options=dict(data.get("options") or {}),
        enabled=bool(data.get("enabled", True)),
        disabled_reason=f"disabled in {SOURCE}",
        since=last,
        never_ran=last is None,
        due_now=last is None,
    )


__all__ = ["SOURCE", "entry_of", "read_entries"]
