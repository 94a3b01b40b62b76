"""``memory``: peak RSS of a beat process with 100,000 schedules all due at once (the start-up
runs' peaks are shown in the same table)."""

from __future__ import annotations

import argparse

from .burst import burst_beat_once
from .common import Recorder, fmt


def run(a: argparse.Namespace, rec: Recorder) -> None:
    burst_beat_once(a, "postgres", a.n_memory, 0, rec, bench="memory_burst")


def table(rec: Recorder, a: argparse.Namespace) -> list[str]:
    """The markdown lines of this benchmark's table (none without its rows)."""
    out: list[str] = []
    w = out.append
    st = rec.of("startup")
    mem = rec.of("memory_burst")
    if mem or st:
        w("\n### Memory: peak RSS (VmHWM) of the beat process\n")
        w("| case | reps | peak RSS (MiB) | time (s) | beat CPU (s) |")
        w("|---|---|---|---|---|")
        for ds in ("no_history", "history"):
            rows = [x for x in st if x["dataset"] == ds and x["mode"] == "beat"]
            if rows:
                w(
                    f"| {a.n_startup:,} schedules ({ds}), start-up + 1,000 due | {len(rows)} "
                    f"| {fmt([x['peak_rss_mib'] for x in rows], 1)} "
                    f"| {fmt([x['t_due_started_s'] for x in rows])} "
                    f"| {fmt([x.get('cpu_due_started_s') for x in rows])} |"
                )
        if mem:
            w(
                f"| {a.n_memory:,} schedules all due at once (every state in memory), launch→all "
                f"started | {len(mem)} | {fmt([x['peak_rss_mib'] for x in mem], 1)} "
                f"| {fmt([x['t_all_started_s'] for x in mem])} "
                f"| {fmt([x.get('cpu_all_started_s') for x in mem])} |"
            )
    return out
