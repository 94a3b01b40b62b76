"""The embedded broker: kombu's ``filesystem://`` transport, with each message written whole.

kombu's filesystem channel creates the message file in the queue folder and then writes the
message into it. A consumer polling the same folder can take the file in between, read nothing
and stop with ``JSONDecodeError`` (seen here under load, when beat sends while the worker polls;
reported upstream: https://github.com/celery/kombu/issues/1551). This channel writes the message
to a staging folder next to the queue and renames it into place, so a consumer only ever sees
complete files (a rename within one file system is atomic).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.objects import cached_property


class Channel(filesystem.Channel):
    """``filesystem.Channel`` whose ``_put`` publishes a message file only once it is written."""

    @cached_property
    def staging_folder(self) -> Path:
        """``<queue folder>.staging``: beside the queue folder, so on the same file system."""
        folder = Path(f"{os.path.normpath(self.data_folder_out)}.staging")
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        # The same name as kombu's (time first, so consumers still take the oldest first).
        name = f"{round(filesystem.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        staged = self.staging_folder / name
        try:
            staged.write_bytes(str_to_bytes(filesystem.dumps(payload)))
            os.replace(staged, Path(self.data_folder_out) / name)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add file {name!r} to directory") from exc


class Transport(filesystem.Transport):
    """Give as ``broker_transport`` with a ``filesystem://`` URL."""

    Channel = Channel
