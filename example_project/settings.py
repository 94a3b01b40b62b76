"""Where the example project keeps its data, and which broker and journal it uses.

Embedded defaults need no server: a SQLite journal and kombu's ``filesystem://`` transport,
both in the data folder (``example_project/data``, or ``EXAMPLE_DATA_DIR``). The environment
variables ``CELERY_BROKER_URL`` and ``CELERY_DURABLE_URL`` move the same code to, say, Redis
and PostgreSQL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ZONE = "Europe/Oslo"
"""The zone the jobs are scheduled and shown in."""

DEFAULT_DATA_DIR = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class Settings:
    """The example's configuration, read once from the environment."""

    data_dir: Path
    broker_url: str
    journal_url: str
    broker_transport_options: dict[str, Any]
    broker_transport: str | None = None
    """The transport class for the embedded broker (``example_project/broker.py``)."""

    @property
    def embedded_broker(self) -> bool:
        return self.broker_url.startswith("filesystem://")

    @classmethod
    def from_env(cls) -> Settings:
        data_dir = Path(os.environ.get("EXAMPLE_DATA_DIR") or DEFAULT_DATA_DIR).resolve()
        broker_url = os.environ.get("CELERY_BROKER_URL") or "filesystem://"
        journal_url = os.environ.get("CELERY_DURABLE_URL") or f"sqlite:///{data_dir / 'journal.db'}"
        options: dict[str, Any] = {}
        transport = None
        if broker_url.startswith("filesystem://"):
            # kombu's filesystem transport, writing each message whole (see broker.py).
            transport = "example_project.broker:Transport"
            # One folder is both the outbox and the inbox: every process (beat, worker, this
            # one) reads and writes the same queue files. Processed messages are deleted.
            queue = data_dir / "broker" / "queue"
            control = data_dir / "broker" / "control"
            options = {
                "data_folder_in": str(queue),
                "data_folder_out": str(queue),
                "control_folder": str(control),
                "store_processed": False,
                # Look for new messages every 0.2 s instead of every second.
                "polling_interval": 0.2,
            }
        return cls(
            data_dir=data_dir,
            broker_url=broker_url,
            journal_url=journal_url,
            broker_transport_options=options,
            broker_transport=transport,
        )

    def make_dirs(self) -> None:
        """Create the data folder and, for the embedded broker, its queue folders."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for key in ("data_folder_in", "control_folder"):
            if key in self.broker_transport_options:
                Path(self.broker_transport_options[key]).mkdir(parents=True, exist_ok=True)
