"""A TCP forwarder on localhost that a test can cut and restore: a real network outage."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from typing import Any


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to ``target``; ``cut()`` drops and refuses connections."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def restore(self) -> None:
        """Start accepting and forwarding connections."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._stop.clear()
        # The thread gets the listener itself: a cut() right after this may close it (and
        # clear the attribute) before the thread first runs.
        self._thread = threading.Thread(target=self._serve, args=(listener,), daemon=True)
        self._thread.start()

    def cut(self) -> None:
        """Close the listener and every forwarded connection."""
        self._stop.set()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()
            self._sockets.clear()

    def _serve(self, listener: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        try:
            sel.register(listener, selectors.EVENT_READ, None)
        except (OSError, ValueError):  # cut before this thread first ran
            sel.close()
            return
        pairs: dict[socket.socket, socket.socket] = {}
        while not self._stop.is_set():
            for key, _ in sel.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is listener:
                    try:
                        client, _ = listener.accept()
                        upstream = socket.create_connection(self.target, timeout=5)
                    except OSError:
                        continue
                    for s in (client, upstream):
                        s.setblocking(False)
                        sel.register(s, selectors.EVENT_READ, None)
                    pairs[client], pairs[upstream] = upstream, client
                    with self._lock:
                        self._sockets.update((client, upstream))
                    continue
                other = pairs.get(sock)
                try:
                    data = sock.recv(65536)
                    if not data or other is None:
                        raise OSError("closed")
                    other.setblocking(True)
                    other.sendall(data)
                    other.setblocking(False)
                except OSError:
                    for s in (sock, other):
                        if s is not None:
                            with contextlib.suppress(Exception):
                                sel.unregister(s)
                            with contextlib.suppress(OSError):
                                s.close()
                            pairs.pop(s, None)
        sel.close()
        for s in list(pairs):
            with contextlib.suppress(OSError):
                s.close()


def app_behind_proxy(redis_url: str, name: str) -> tuple[Any, TcpProxy]:
    """A Celery app with the task ``backup`` whose broker is ``redis_url`` seen through a
    running :class:`TcpProxy` (cut it for a broker outage)."""
    from urllib.parse import urlsplit

    from celery import Celery

    parts = urlsplit(redis_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 6379)
    proxy.restore()
    app = Celery(name, broker=f"redis://127.0.0.1:{proxy.port}{parts.path}", set_as_current=False)

    @app.task(name="backup", shared=False)
    def backup(folder: str) -> str:  # pragma: no cover - the tests read the queue
        return folder

    return app, proxy
