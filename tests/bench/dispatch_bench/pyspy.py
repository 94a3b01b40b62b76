"""With ``--py-spy``: sample a beat process and summarise where its time goes."""

from __future__ import annotations

import argparse
import signal
import subprocess
from pathlib import Path

from .common import RESULTS, _children


def start_py_spy(
    a: argparse.Namespace, pid: int, name: str, duration: float
) -> tuple[subprocess.Popen[bytes], Path] | None:
    """With ``--py-spy``: sample the beat process (raw collapsed stacks, 50 Hz, non-blocking)."""
    if not a.py_spy:
        return None
    if not Path(a.py_spy).exists():
        print(f"NOTE: no py-spy at {a.py_spy}; not profiling {name}", flush=True)
        return None
    out = RESULTS / f"pyspy_{name}.txt"
    cmd = [
        a.py_spy,
        "record",
        "--pid",
        str(pid),
        "--rate",
        "50",
        "--nonblocking",
        "--format",
        "raw",
        "--output",
        str(out),
        "--duration",
        str(int(duration)),
    ]
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _children.append(spy)
    return spy, out


def finish_py_spy(spy: tuple[subprocess.Popen[bytes], Path] | None) -> None:
    if spy is None:
        return
    proc, out = spy
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    if proc in _children:
        _children.remove(proc)
    if out.exists():
        summary = summarize_py_spy(out)
        out.with_suffix(".summary.txt").write_text(summary)
        print(summary, flush=True)


def _frame_name(frame: str) -> str:
    """``func (path/to/file.py:12)`` -> ``func (file.py)``."""
    if " (" not in frame:
        return frame
    func_, _, where = frame.partition(" (")
    return f"{func_} ({where.split(':')[0].rsplit('/', 1)[-1]})"


def summarize_py_spy(path: Path, top: int = 40) -> str:
    """Inclusive and self sample shares per function from py-spy's raw (collapsed) output."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame_name(f) for f in stack.split(";")]
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + n
        own[frames[-1]] = own.get(frames[-1], 0) + n
    lines = [f"{path.name}: {total} samples", "", "inclusive %  function (file)"]
    for f, n in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{100 * n / max(total, 1):6.1f}  {f}")
    lines += ["", "self %  function (file)"]
    for f, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{100 * n / max(total, 1):6.1f}  {f}")
    return "\n".join(lines) + "\n"
