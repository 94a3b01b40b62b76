"""A fan-out without beat while its children's worker is killed again and again (W10, W11, D8).

One solo worker takes the parent (``kids.fan_out`` of ``tests/support/children_app.py``), a
prefork worker (two processes) the children; no dispatcher runs. ``--kills`` times, a moment
(0.3–1.5 s) after the children's worker is ready, its process group gets SIGKILL and a new one
starts; then the last one runs until the fan-out ends or nothing changes for 25 s. Prints the
parent's status and the children's states.

``--mode raw`` kills the worker while it takes messages. kombu's Redis transport takes a
message off the list (``BRPOP``) before it records it unacknowledged, so a kill in between
loses it: that child stays ``queued`` and the parent waits for the dispatcher (D8), which is
not running. ``--mode cancel`` first stops the worker taking messages (``cancel_consumer``)
and waits out its last ``BRPOP``, as ``tests/e2e/test_children_e2e.py`` does without beat.

Usage (use a Redis database nothing else uses: it is emptied first)::

    python tests/chaos/children_kills.py --mode raw --kills 8 --n 1000 \
        --redis redis://127.0.0.1:6379/13
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.support.processes import python_command, running_process, wait_for  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--mode", choices=("raw", "cancel"), default="raw")
    parser.add_argument("--kills", type=int, default=8)
    parser.add_argument("--n", type=int, default=1000, help="children (inputs)")
    parser.add_argument("--work", default="0.05", help="seconds of work in each child")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/13")
    args = parser.parse_args()

    import redis

    client = redis.Redis.from_url(args.redis)
    client.flushdb()
    client.close()
    tmp = Path(tempfile.mkdtemp(prefix=f"children-kills-{args.mode}-"))
    prefix = f"ck-{uuid.uuid4().hex[:6]}-"
    env = {
        "E2E_BROKER": args.redis,
        "E2E_BACKEND": args.redis,
        "E2E_JOURNAL": f"sqlite:///{tmp}/journal.db",
        "E2E_QUEUE": prefix,
        "E2E_LEASE": "10",
        "E2E_VISIBILITY": "4",
        "E2E_WORK": args.work,
    }
    os.environ.update(env)
    from tests.support import children_app as app_module

    names = iter(range(1, 10_000))

    def worker(pool: str, queue: str) -> tuple[str, object]:
        name = f"k{next(names)}"
        cmd = python_command(
            "-m", "celery", "-A", "tests.support.children_app", "worker", f"--pool={pool}",
            f"--concurrency={2 if pool == 'prefork' else 1}", "-Q", queue, "-n", f"{name}@%h",
            "--without-heartbeat", "--without-mingle", "--without-gossip", "--loglevel=INFO",
        )  # fmt: skip
        return name, running_process(cmd, log_path=tmp / f"{name}.log", env=env)

    rid = f"fan-{uuid.uuid4().hex[:6]}"
    kids = f"{prefix}kids"
    durable = app_module.durable
    _, parents = worker("solo", f"{prefix}parents")
    with parents as parent:  # type: ignore[attr-defined]
        wait_for(lambda: "ready" in parent.read_log(), timeout=60)
        app_module.app.send_task("kids.fan_out", args=[args.n, 20], task_id=rid)
        for _ in range(args.kills):
            name, kids_worker = worker("prefork", kids)
            with kids_worker as doomed:  # type: ignore[attr-defined]
                wait_for(lambda d=doomed: "ready" in d.read_log(), timeout=60)
                time.sleep(random.uniform(0.3, 1.5))
                if args.mode == "cancel":
                    node = f"{name}@{socket.gethostname()}"
                    app_module.app.control.cancel_consumer(
                        kids, destination=[node], reply=True, timeout=10
                    )
                    time.sleep(2)  # kombu's BRPOP blocks 1 s at a time
                doomed.kill()
        _, last_worker = worker("prefork", kids)
        with last_worker:  # type: ignore[attr-defined]
            seen, since = None, time.monotonic()
            while time.monotonic() - since < 25:
                if durable.runs.rows([rid]).get(rid, {}).get("status") == "finished":
                    break
                states = Counter(s for _, s in durable.children(rid))
                if states != seen:
                    seen, since = states, time.monotonic()
                time.sleep(1)
            status = durable.runs.rows([rid]).get(rid, {}).get("status")
            states = Counter(s for _, s in durable.children(rid))
    stuck = [r for r, s in durable.children(rid) if s == "queued"]
    print(
        f"mode={args.mode} kills={args.kills} parent={status} children={dict(states)} "
        f"queued for good={stuck} logs={tmp}"
    )


if __name__ == "__main__":
    main()
