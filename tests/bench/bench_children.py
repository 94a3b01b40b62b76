"""Fan-out/fan-in through ``durable.map_children`` against a Celery ``chord`` (W11).

Same run, same two workers (one prefork with two processes, one solo; the app of
``tests/support/children_app.py``), Redis broker and result backend, PostgreSQL journal in a
fresh schema: ``N`` children of a one-step durable task through ``map_children`` (``at_most``
given), then a ``chord`` of ``N`` plain tasks with a collecting callback. Reports wall time
launch → result of each, their ratio, and the CPU seconds the workers used in each phase
(user + system of the worker process groups, from ``/proc``), and the peak resident memory
of the parent's worker (the solo one, which runs every delivery of the parent).

``--kill-parent-once`` (W11's target: 10,000 children with the parent's worker killed once)
kills the solo worker with SIGKILL once half of the children's ends are recorded in the
parent's journal, and starts it again: the parent's message comes back after Redis'
visibility timeout (10 s in this mode), and the fan-out must still give every result in input
order with no child run twice (each child's ``RunStarted`` is counted afterwards). The peak
memory reported is the larger of the killed worker's and its successor's.

Usage::

    python tests/bench/bench_children.py [--n 1000] [--at-most 100] [--kill-parent-once] \
        [--no-chord] [--redis redis://127.0.0.1:6379/2] \
        [--pg-url postgresql+psycopg://postgres@127.0.0.1/test]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from celery import Celery, chord  # noqa: E402

from celery_durable import Durable  # noqa: E402
from tests.support.processes import python_command, running_process, wait_for  # noqa: E402
from tests.support.services import isolated_schema  # noqa: E402


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes and their children (pool processes)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pgid = int(fields[2])
        if pgid in pids:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def peak_rss_mib(pid: int) -> float:
    """The peak resident set (``VmHWM``) of a live process, in MiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def ends_recorded(journal: Any, stream: str, seen: list[Any]) -> int:
    """``ChildEnded`` events in the parent's stream so far (reads only what is new)."""
    version = seen[-1].version if seen else 0
    seen.extend(journal.read_stream(stream, version))
    return sum(1 for event in seen if event.type == "ChildEnded")


def drained(url: str, timeout: float = 120.0) -> None:
    """Wait until both queues and Redis' unacknowledged messages are empty, then 2 s."""
    broker = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not (broker.llen("kids") or broker.llen("parents") or broker.hlen("unacked")):
            break
        time.sleep(0.2)
    time.sleep(2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--at-most", type=int, default=100)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/2")
    parser.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--kill-parent-once", action="store_true")
    parser.add_argument("--no-chord", action="store_true", help="time map_children only")
    parser.add_argument(
        "--work", type=float, default=0.01,
        help="seconds each child's step and each chord member sleep (the same work in both)",
    )  # fmt: skip
    args = parser.parse_args()
    redis.Redis.from_url(args.redis).flushdb()
    tmp = Path(tempfile.mkdtemp(prefix="bench-children-"))
    with isolated_schema(args.pg_url) as journal:
        env = {"E2E_BROKER": args.redis, "E2E_JOURNAL": journal, "E2E_WORK": str(args.work)}
        if args.kill_parent_once:
            env["E2E_VISIBILITY"] = "10"  # the killed parent's message comes back in 10 s
        client = Celery("bench-client", broker=args.redis, backend=args.redis)
        client.conf.task_routes = {
            "kids.fan_out": {"queue": "parents"},
            "kids.*": {"queue": "kids"},
        }
        durable = Durable(client, journal)
        commands = [
            ("prefork", "2", "kids"),
            ("solo", "1", "parents,kids"),
        ]
        with contextlib_exit_stack() as stack:

            def start(i: int, name: str) -> Any:
                pool, conc, queues = commands[i]
                cmd = python_command(
                    "-m", "celery", "-A", "tests.support.children_app", "worker",
                    f"--pool={pool}", f"--concurrency={conc}", "-Q", queues, "-n", f"{name}@%h",
                    "--without-heartbeat", "--without-mingle", "--without-gossip",
                    "--loglevel=INFO",
                )  # fmt: skip
                proc = stack.enter_context(
                    running_process(cmd, log_path=tmp / f"{name}.log", env=env)
                )
                wait_for(lambda: "ready" in proc.read_log(), timeout=60, processes=[proc])
                return proc

            procs = [start(0, "b0"), start(1, "b1")]
            time.sleep(2)  # let both workers settle before timing
            groups = [p.pid for p in procs]
            parent_rss = 0.0

            cpu0 = cpu_seconds(groups)
            started = time.perf_counter()
            rid = f"bench-{uuid.uuid4().hex[:8]}"
            client.send_task("kids.fan_out", args=[args.n, args.at_most], task_id=rid)
            if args.kill_parent_once:
                seen: list[Any] = []
                stream = f"run/{rid}"
                while ends_recorded(durable.runtime.journal, stream, seen) < args.n // 2:
                    time.sleep(0.5)
                parent_rss = peak_rss_mib(procs[1].pid)
                spent = cpu_seconds(groups) - cpu0
                procs[1].kill()  # SIGKILL: the parent's worker, in the middle of the fan-out
                print(f"killed the parent's worker at {time.perf_counter() - started:.1f} s")
                procs[1] = start(1, "b1-again")
                groups = [p.pid for p in procs]
                cpu0 = cpu_seconds(groups) - spent  # (the killed one's CPU left with it)
            result = durable.result(rid, timeout=3600)
            durable_wall = time.perf_counter() - started
            durable_cpu = cpu_seconds(groups) - cpu0
            parent_rss = max(parent_rss, peak_rss_mib(procs[1].pid))
            assert result == [x * x for x in range(args.n)]
            if args.kill_parent_once:
                # No run ID started twice (W2): one RunStarted in each run's stream.
                streams = [f"run/{rid}:0.{i}" for i in range(args.n)] + [f"run/{rid}"]
                starts = durable.runtime.journal.read_streams(streams, types=["RunStarted"])
                assert sorted(s for s, found in starts.items() for _ in found) == sorted(streams), (
                    "a run started twice"
                )
            print(
                f"children={args.n} at_most={args.at_most}: map_children wall "
                f"{durable_wall:.2f} s, worker CPU {durable_cpu:.2f} s, parent's worker peak "
                f"RSS {parent_rss:.0f} MiB" + (" (killed once)" if args.kill_parent_once else "")
            )
            if args.no_chord:
                durable.close()
                return
            drained(args.redis)  # (a parent's wake-ups may still be queued: not the chord's)

            cpu0 = cpu_seconds(groups)
            started = time.perf_counter()
            oracle = chord(client.signature("kids.plain_square", (x,)) for x in range(args.n))(
                client.signature("kids.collect")
            ).get(timeout=1800)
            chord_wall = time.perf_counter() - started
            chord_cpu = cpu_seconds(groups) - cpu0
            assert oracle == result
        durable.close()
    print(
        f"children={args.n} at_most={args.at_most} work={args.work * 1000:g} ms per child and per "
        "chord member; workers: prefork(2) + solo, Redis, PostgreSQL"
    )
    print(f"map_children  wall {durable_wall:8.2f} s   worker CPU {durable_cpu:8.2f} s")
    print(f"chord         wall {chord_wall:8.2f} s   worker CPU {chord_cpu:8.2f} s")
    print(f"ratio (map_children / chord): wall {durable_wall / chord_wall:.2f}x, "
          f"CPU {durable_cpu / max(chord_cpu, 1e-9):.2f}x")  # fmt: skip


def contextlib_exit_stack():  # type: ignore[no-untyped-def]
    import contextlib

    return contextlib.ExitStack()


if __name__ == "__main__":
    main()
