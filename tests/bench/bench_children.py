"""Fan-out/fan-in through ``durable.map_children`` against a Celery ``chord`` (W11).

Same run, same two workers (one prefork with two processes, one solo; the app of
``tests/support/children_app.py``), Redis broker and result backend, PostgreSQL journal in a
fresh schema: ``N`` children of a one-step durable task through ``map_children`` (``at_most``
given), then a ``chord`` of ``N`` plain tasks with a collecting callback. Reports wall time
launch → result of each, their ratio, and the CPU seconds the workers used in each phase
(user + system of the worker process groups, from ``/proc``).

Usage::

    python tests/bench/bench_children.py [--n 1000] [--at-most 100] \
        [--redis redis://127.0.0.1:6379/2] [--pg-url postgresql+psycopg://postgres@127.0.0.1/test]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--at-most", type=int, default=100)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/2")
    parser.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    redis.Redis.from_url(args.redis).flushdb()
    tmp = Path(tempfile.mkdtemp(prefix="bench-children-"))
    with isolated_schema(args.pg_url) as journal:
        env = {"E2E_BROKER": args.redis, "E2E_JOURNAL": journal}
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
            procs = []
            for i, (pool, conc, queues) in enumerate(commands):
                cmd = python_command(
                    "-m", "celery", "-A", "tests.support.children_app", "worker",
                    f"--pool={pool}", f"--concurrency={conc}", "-Q", queues, "-n", f"b{i}@%h",
                    "--without-heartbeat", "--without-mingle", "--without-gossip",
                    "--loglevel=INFO",
                )  # fmt: skip
                proc = stack.enter_context(
                    running_process(cmd, log_path=tmp / f"b{i}.log", env=env)
                )
                procs.append(proc)
            for proc in procs:
                wait_for(lambda p=proc: "ready" in p.read_log(), timeout=60, processes=[proc])
            time.sleep(2)  # let both workers settle before timing
            groups = [p.pid for p in procs]

            cpu0 = cpu_seconds(groups)
            started = time.perf_counter()
            rid = f"bench-{uuid.uuid4().hex[:8]}"
            client.send_task("kids.fan_out", args=[args.n, args.at_most], task_id=rid)
            result = durable.result(rid, timeout=1800)
            durable_wall = time.perf_counter() - started
            durable_cpu = cpu_seconds(groups) - cpu0
            assert result == [x * x for x in range(args.n)]

            cpu0 = cpu_seconds(groups)
            started = time.perf_counter()
            oracle = chord(client.signature("kids.plain_square", (x,)) for x in range(args.n))(
                client.signature("kids.collect")
            ).get(timeout=1800)
            chord_wall = time.perf_counter() - started
            chord_cpu = cpu_seconds(groups) - cpu0
            assert oracle == result
        durable.close()
    print(f"children={args.n} at_most={args.at_most} workers: prefork(2) + solo, Redis, PostgreSQL")
    print(f"map_children  wall {durable_wall:8.2f} s   worker CPU {durable_cpu:8.2f} s")
    print(f"chord         wall {chord_wall:8.2f} s   worker CPU {chord_cpu:8.2f} s")
    print(f"ratio (map_children / chord): wall {durable_wall / chord_wall:.2f}x, "
          f"CPU {durable_cpu / max(chord_cpu, 1e-9):.2f}x")  # fmt: skip


def contextlib_exit_stack():  # type: ignore[no-untyped-def]
    import contextlib

    return contextlib.ExitStack()


if __name__ == "__main__":
    main()
