"""Start a Celery worker and beat as child processes, and stop them again.

They are the same commands you would run in production, in their own process group (so a
Ctrl-C in the terminal reaches this program first, which then stops them in order), with
their logs in the data folder. Stopping sends SIGTERM (Celery's warm shutdown: a running task
finishes) and, after a grace period, SIGKILL to the whole group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType

PROJECT_ROOT = Path(__file__).resolve().parent.parent

WORKER_ARGS = (
    "worker",
    "--pool=solo",
    "--concurrency=1",
    "--without-mingle",
    "--without-gossip",
    "--loglevel=INFO",
)
BEAT_ARGS = ("beat", "--scheduler=celery_durable.beat:DurableScheduler", "--loglevel=INFO")


class ServiceDied(RuntimeError):
    """A child process ended while it should be running."""


class Service:
    """One ``celery -A example_project.app …`` child process."""

    def __init__(self, name: str, args: tuple[str, ...], data_dir: Path) -> None:
        self.name = name
        self.args = args
        self.data_dir = data_dir
        self.log_path = data_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def command(self) -> str:
        return " ".join(("celery", "-A", "example_project.app", *self.args))

    def start(self) -> None:
        env = dict(os.environ, EXAMPLE_DATA_DIR=str(self.data_dir))
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(PROJECT_ROOT) + (os.pathsep + path if path else "")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "example_project.app", *self.args],
                cwd=self.data_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def check(self) -> None:
        """Raise :class:`ServiceDied` (with the end of the log) if the process has ended."""
        if self.process is not None and self.process.poll() is not None:
            raise ServiceDied(
                f"the {self.name} exited with code {self.process.returncode}; "
                f"the end of {self.log_path}:\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def terminate(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self._signal(signal.SIGTERM)

    def wait(self, timeout: float) -> None:
        """Wait for the process to end; SIGKILL its process group after ``timeout``."""
        if self.process is None:
            return
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait()

    def _signal(self, sig: int) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)


class Services:
    """A worker and a beat, started on entering the block and stopped on leaving it."""

    def __init__(self, data_dir: Path) -> None:
        self.worker = Service("worker", WORKER_ARGS, data_dir)
        self.beat = Service("beat", BEAT_ARGS, data_dir)
        self.all = (self.worker, self.beat)

    def __enter__(self) -> Services:
        try:
            for service in self.all:
                service.start()
        except BaseException:
            self.stop()
            raise
        return self

    def check(self) -> None:
        for service in self.all:
            service.check()

    def stop(self, timeout: float = 20.0) -> None:
        # Both at once: a message beat sends meanwhile stays in the broker for the next start.
        for service in self.all:
            service.terminate()
        for service in self.all:
            service.wait(timeout)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
