"""The ``apply_async`` + ``producer.batch()`` floor from a cold launch: run as a script.

``python tests/bench/dispatch_bench/floor_cold.py N`` with the beat's environment
(``PYTHONPATH`` holding ``tests/bench``, ``BENCH_BROKER``): it imports Celery and the beat's app
module (``dispatch_app``: the same app, task and ``Durable(app)``), then publishes N messages
of ``bench.noop(i)`` inside ``producer.batch(max_size=1000)`` on a connection it opens for
them, and prints, as one JSON line, the wall-clock time at which the last batch was flushed
and the process's CPU seconds. The driver starts its clock just before ``Popen``, as it does
for the beat, so the floor counts its own interpreter start, imports and connection
(2026-12-06: the launch burst was compared with a floor whose clock starts once it is
connected). It does not import Celery's command line (``celery.bin.celery``), which
``celery beat`` does: a script that publishes has no need of it.

This file imports nothing of the benchmark driver, so that the launch costs what a user's
publishing script costs.
"""

from __future__ import annotations

import json
import sys
import time


def main(n: int) -> None:
    """Import the app, publish ``n`` messages in batches of 1,000, print the times."""
    t_start = time.time()
    import dispatch_app  # the beat's app module: Celery, the app, Durable(app), the task

    t_imported = time.time()
    noop = dispatch_app.noop
    with dispatch_app.app.producer_or_acquire() as producer, producer.batch(max_size=1000):
        for i in range(n):
            noop.apply_async((i,), task_id=f"floor@{i}", producer=producer)
    t_end = time.time()
    print(
        json.dumps(
            {
                "t_start": t_start,
                "t_imported": t_imported,
                "t_end": t_end,
                "cpu_s": time.process_time(),
            }
        )
    )


if __name__ == "__main__":
    main(int(sys.argv[1]))
