"""The dispatch benchmarks, one module each, run by ``tests/bench/bench_dispatch.py``.

``common`` (paths, statistics, processes, journals, brokers), ``seeding`` (schedules written
straight into a journal, and queries that watch it), ``consumer`` (a Redis list reader),
``pyspy`` (sampling a process); then one module per benchmark: ``peers``, ``burst``, ``startup``,
``steady``, ``memory``, ``visibility``. Each has ``run(a, rec)`` and ``table(rec, a)``.
"""
