"""A thread that pops the broker's ``celery`` list and notes when each run's message arrived."""

from __future__ import annotations

import json
import threading
import time

from .common import redis_client


class Consumer(threading.Thread):
    """Pops the ``celery`` list (oldest first, as a worker's BRPOP would) and records, for each
    message, the wall time it was seen and its ``durable_due`` / ``durable_schedule`` headers."""

    def __init__(self, url: str, keep: bool = True) -> None:
        super().__init__(daemon=True)
        self.r = redis_client(url)
        self.stop_flag = threading.Event()
        self.seen: list[tuple[float, str, str]] = []  # (seen_at, schedule, due text)
        self.by_schedule: dict[str, float] = {}
        self.keep = keep
        self.count = 0

    def run(self) -> None:
        while not self.stop_flag.is_set():
            batch = self.r.rpop("celery", 1000)
            if not batch:
                time.sleep(0.002)
                continue
            seen = time.time()
            for raw in batch:
                headers = json.loads(raw).get("headers") or {}
                sid = headers.get("durable_schedule", "")
                due = headers.get("durable_due", "")
                self.count += 1
                if self.keep:
                    self.seen.append((seen, sid, due))
                if sid not in self.by_schedule:
                    self.by_schedule[sid] = seen

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(10)
