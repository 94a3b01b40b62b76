"""``peers``: stock beat's PersistentScheduler and RedBeat, and kombu's publish floor, run by
the peer scripts of ``../shared/peers`` in their own virtualenv (``--peers-python``)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .common import RESULTS, Recorder, free_port


def run(a: argparse.Namespace, rec: Recorder, stamp: str) -> None:
    py = Path(a.peers_python)
    peers = Path(a.peers_dir)
    if not py.exists():
        print(
            f"NOTE: peers skipped: {py} does not exist. Create it with\n"
            f"  python3 -m venv /tmp/peersvenv && /tmp/peersvenv/bin/pip install -r "
            f"{peers}/requirements-lock.txt",
            flush=True,
        )
        return
    work = Path(tempfile.mkdtemp(prefix="bdisp_peers_"))
    rport, pport = free_port(), free_port()
    env = dict(
        os.environ,
        PEERS_WORK=str(work),
        PEERS_REDIS_PORT=str(rport),
        PEERS_PG_PORT=str(pport),
        BENCH_REDIS_URL=f"redis://127.0.0.1:{rport}",
    )
    try:
        subprocess.run(
            ["bash", str(peers / "servers.sh"), "start"],
            env=env,
            check=True,
            timeout=120,
            stdout=sys.stdout,
            stderr=sys.stderr,
        )
        beat_out = RESULTS / f"peers_beat_{stamp}.jsonl"
        pub_out = RESULTS / f"peers_publish_{stamp}.jsonl"
        cmd = [
            str(py),
            str(peers / "bench_beat.py"),
            "--n",
            str(a.n_burst),
            "--reps",
            str(a.peer_reps),
            "--schedulers",
            *a.peer_schedulers.split(","),
            "--timeout",
            str(a.peer_timeout),
            "--out",
            str(beat_out),
        ]
        print("+", " ".join(cmd), flush=True)
        budget = a.peer_reps * len(a.peer_schedulers.split(",")) * (a.peer_timeout + 30) + 60
        subprocess.run(cmd, env=env, cwd=str(work), timeout=budget, check=False)
        cmd = [
            str(py),
            str(peers / "bench_publish.py"),
            "--n",
            str(a.n_burst),
            "--reps",
            str(max(a.peer_reps, 3)),
            "--variants",
            "apply_async",
            "apply_async_producer",
            "apply_async_batch",
            "--out",
            str(pub_out),
        ]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, env=env, cwd=str(work), timeout=600, check=False)
        for path, kind in ((beat_out, "peer_beat"), (pub_out, "peer_publish")):
            if path.exists():
                for line in path.read_text().splitlines():
                    row = json.loads(line)
                    row.pop("log_tail", None)
                    rec.add({"bench": kind, **row})
    finally:
        subprocess.run(
            ["bash", str(peers / "servers.sh"), "stop"], env=env, timeout=60, check=False
        )
        shutil.rmtree(work, ignore_errors=True)


def peer_bounds(x: dict[str, Any], n: int, timeout: float) -> None:
    """Times and rates of a peer row; for a run stopped at the timeout, the bounds it proves
    (all N would take at least the timeout; the rates are at most what it reached)."""
    if x.get("t_all_s"):
        x["t_all_bound_s"] = x["t_all_s"]
        x["e2e_rate_bound"] = n / x["t_all_s"]
        x["rate_bound"] = x.get("rate_per_s")
        return
    queued = x.get("queued_at_end") or 0
    x["t_all_bound_s"] = timeout
    x["e2e_rate_bound"] = queued / timeout
    first = x.get("t_first_s")
    x["rate_bound"] = (queued - 1) / (timeout - first) if first is not None else None
