"""Run background processes (Celery workers, beat, scripts) for end-to-end tests.

Typical use::

    from tests.support.processes import python_command, running_process, wait_for

    cmd = python_command("-m", "celery", "-A", "tests.e2e.app", "worker", "--pool=solo")
    with running_process(cmd, log_path=tmp_path / "worker.log", env={"URL": pg_url}) as worker:
        wait_for(lambda: "ready" in worker.read_log(), timeout=30, processes=[worker])
        ...

On leaving the ``with`` block the process gets ``SIGTERM`` (a Celery worker's warm shutdown),
and if it has not exited after ``stop_timeout`` seconds its whole process group (the worker and
its pool children) gets ``SIGKILL``. If the block raised (e.g. a failed assertion), the tail of
the log is printed to stderr, which pytest shows with the failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

#: The repository root (``tests/support/processes.py`` -> ``.``).
REPO_ROOT = Path(__file__).resolve().parents[2]

T = TypeVar("T")


def python_command(*args: str) -> list[str]:
    """``[sys.executable, *args]``: run Python (``-m celery ...``) with the test interpreter."""
    return [sys.executable, *args]


def child_env(extra: Mapping[str, str] | None = None, *, inherit: bool = True) -> dict[str, str]:
    """Environment for a child: ``os.environ`` (if ``inherit``) + ``extra``; the repo root is
    prepended to ``PYTHONPATH`` so that ``-A tests.something`` and ``celery_durable`` import."""
    env = dict(os.environ) if inherit else {}
    env.update(extra or {})
    pythonpath = [str(REPO_ROOT)]
    if env.get("PYTHONPATH"):
        pythonpath.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    env.setdefault("PYTHONUNBUFFERED", "1")  # so the log is complete when read
    return env


def run_child(
    command: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` to its end with exactly ``env``; text output captured, any exit code."""
    return subprocess.run(
        list(command),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class ProcessExited(AssertionError):
    """A background process exited while it was still expected to run."""


class ManagedProcess:
    """A running background process whose stdout+stderr go to ``log_path``."""

    def __init__(self, popen: subprocess.Popen[bytes], command: Sequence[str], log_path: Path):
        self.popen = popen
        self.command = list(command)
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """Exit code, or ``None`` while running (negative: killed by that signal)."""
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def read_log(self) -> str:
        """Everything the process has written so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.read_log().splitlines()[-lines:])

    def assert_alive(self) -> None:
        """Raise :class:`ProcessExited` (with the log tail) if the process has exited."""
        if not self.is_alive():
            raise ProcessExited(
                f"process {self.command!r} exited with code {self.returncode}; "
                f"log {self.log_path}:\n{self.log_tail()}"
            )

    def send_signal(self, sig: int, *, group: bool = False) -> None:
        """Send ``sig`` to the process (``group=True``: to its whole process group)."""
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.popen.pid, sig)
            else:
                self.popen.send_signal(sig)

    def kill(self) -> int:
        """Crash it: ``SIGKILL`` to the whole process group; returns the exit code."""
        self.send_signal(signal.SIGKILL, group=True)
        return self.popen.wait(10)

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit on its own; returns its exit code."""
        return self.popen.wait(timeout)

    def stop(self, timeout: float = 15.0, sig: int = signal.SIGTERM) -> int:
        """``sig`` (default SIGTERM: warm shutdown) to the process, then after ``timeout``
        seconds SIGKILL to its process group. Any children left in the group are killed too.
        Returns the exit code."""
        self.send_signal(sig)
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            code = self.kill()
        # Leftover children (e.g. a prefork pool orphaned by a crashed parent).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        return code


@contextlib.contextmanager
def running_process(
    command: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    inherit_env: bool = True,
    cwd: Path | str | None = None,
    stop_timeout: float = 15.0,
    stop_signal: int = signal.SIGTERM,
) -> Iterator[ManagedProcess]:
    """Start ``command`` in its own process group, yield a :class:`ManagedProcess`, stop it.

    ``env`` is added to the environment (see :func:`child_env`); ``cwd`` defaults to the repo
    root. stdout and stderr go to ``log_path`` (appended to; its directory is created).
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            list(command),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env(env, inherit=inherit_env),
            cwd=str(cwd) if cwd is not None else str(REPO_ROOT),
            start_new_session=True,
        )
    proc = ManagedProcess(popen, command, log_path)
    failed = False
    try:
        yield proc
    except BaseException:
        failed = True
        raise
    finally:
        code = proc.stop(timeout=stop_timeout, sig=stop_signal)
        if failed:
            print(
                f"\n----- {' '.join(proc.command)} (pid {proc.pid}, exit {code}) "
                f"log {log_path} -----\n{proc.log_tail(200)}\n----- end of log -----",
                file=sys.stderr,
            )


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.1,
    *,
    message: str | None = None,
    processes: Iterable[ManagedProcess] = (),
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy, and
    return that. Raise :class:`TimeoutError` after ``timeout`` seconds, or
    :class:`ProcessExited` as soon as one of ``processes`` has exited (it was needed for the
    predicate to become true). Exceptions raised by ``predicate`` propagate."""
    processes = list(processes)
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        for proc in processes:
            proc.assert_alive()
        if time.monotonic() >= deadline:
            what = message or getattr(predicate, "__name__", repr(predicate))
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)
