"""`make bench`: sustained throughput and ingestion→alert latency of the real job on this machine.

Throughput mode: a pre-generated workload evaluated with an available-now trigger in bounded
micro-batches. Latency mode: the continuous job fed at a fixed rate; latency per alert = commit of
its micro-batch − the transaction's ingestionTimestamp. Peak memory = RSS of the driver, its JVM and
Python workers together.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from fraudrules import tables
from fraudrules.config import JobConfig
from fraudrules.engine import job
from fraudrules.generator import RateWriter, Workload, write_jsonl
from fraudrules.rules import store
from fraudrules.rules.model import load_rules_file
from fraudrules.session import get_spark

BENCH_RULES = Path(__file__).resolve().parent / "bench_rules.json"
PER_FILE = 5_000
FILES_PER_BATCH = 20  # 100,000 transactions a micro-batch: fixed per-batch costs (Delta commits) amortised


class PeakRss(threading.Thread):
    """Samples the summed RSS of this process and all its descendants."""

    def __init__(self, interval_s: float = 0.5):
        super().__init__(daemon=True)
        self.interval_s, self.peak, self._halt = interval_s, 0, threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            self.peak = max(self.peak, _tree_rss(os.getpid()))

    def stop(self) -> int:
        self._halt.set()
        return self.peak


def _tree_rss(root: int) -> int:
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/statm") as fh:
                rss[int(pid)] = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(pid))
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def _fresh(cfg: JobConfig, spark) -> None:
    shutil.rmtree(cfg.data_dir, ignore_errors=True)
    tables.ensure(spark, cfg)
    store.upsert(spark, cfg, load_rules_file(str(BENCH_RULES)), "bench")


def throughput(spark, root: str, count: int, shards: int) -> list[str]:
    cfg = JobConfig(
        data_dir=os.path.join(root, "throughput"),
        shards=shards,
        available_now=True,
        max_files_per_trigger=FILES_PER_BATCH,
    )
    _fresh(cfg, spark)
    write_jsonl(cfg.landing, Workload(count=count).transactions(), per_file=PER_FILE)
    started = time.time()
    running = job.start(spark, cfg, printer=None)
    running.wait()
    elapsed = time.time() - started
    batches = [p for p in running.evaluate.recentProgress if p.numInputRows]
    steady = batches[1:] or batches
    # a source row is one whole file (read with `wholetext`) of PER_FILE transactions
    steady_tx = sum(p.numInputRows for p in steady) * PER_FILE
    steady_rate = steady_tx / max(1e-9, sum(p.durationMs["triggerExecution"] for p in steady) / 1000)
    alerts = tables.read(spark, cfg, "alerts").count()
    return [
        f"throughput: {count:,} transactions, 5 rules, {len(batches)} micro-batches of "
        f"≤{FILES_PER_BATCH * PER_FILE:,} in {elapsed:.1f} s",
        f"  end to end (incl. first-batch warm-up and the parallel bronze ingest): {count / elapsed:,.0f} tx/s",
        f"  sustained (evaluation batches after the first): {steady_rate:,.0f} tx/s",
        f"  alerts: {alerts:,}",
    ]


def latency(spark, root: str, rate: float, seconds: float, shards: int) -> list[str]:
    cfg = JobConfig(data_dir=os.path.join(root, "latency"), shards=shards)
    _fresh(cfg, spark)
    running = job.start(spark, cfg, printer=None)
    warm = RateWriter(
        cfg.landing, Workload(count=2_000, seed=99, first_id=10**9).transactions(), rate=rate, limit=int(rate)
    )
    warm.start()
    warm.join()
    running.process_all_available()
    since = int(time.time() * 1000)
    writer = RateWriter(
        cfg.landing, Workload(count=int(rate * seconds) + 10).transactions(), rate=rate, limit=int(rate * seconds)
    )
    writer.start()
    writer.join()
    running.process_all_available()
    running.stop()
    alerts = tables.read(spark, cfg, "alerts").where(f"ingestionTimestamp >= {since}")
    commits = tables.read(spark, cfg, "batches").selectExpr("batchId", "unix_millis(committedAt) AS committedMs")
    lat = alerts.join(commits, "batchId").selectExpr("committedMs - ingestionTimestamp AS ms")
    p50, p99, pmax, n = lat.selectExpr("percentile(ms, 0.5)", "percentile(ms, 0.99)", "max(ms)", "count(*)").first()
    return [
        f"latency: {writer.written:,} transactions at {rate:,.0f}/s for {seconds:.0f} s, {n:,} alerts",
        f"  ingestion→alert (Delta commit): p50 {p50:,.0f} ms, p99 {p99:,.0f} ms, max {pmax:,.0f} ms",
    ]


def main(root: str, mode: str, count: int, rate: float, seconds: float, shards: int) -> None:
    """Run the chosen modes, printing each one's figures as soon as it has them."""
    spark = get_spark("fraudrules-bench")
    rss = PeakRss()
    rss.start()
    print(f"fraudrules bench on {os.cpu_count()} cores (local[2], {shards} shards, RocksDB state store)", flush=True)
    if mode in ("all", "throughput"):
        print("\n".join(throughput(spark, root, count, shards)), flush=True)
    if mode in ("all", "latency"):
        print("\n".join(latency(spark, root, rate, seconds, shards)), flush=True)
    print(f"peak memory (driver + JVM + Python workers, RSS): {rss.stop() / 2**20:,.0f} MiB", flush=True)
    spark.stop()


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default="bench/work")
    p.add_argument("--mode", choices=["all", "throughput", "latency"], default="all")
    p.add_argument("--count", type=int, default=200_000)
    p.add_argument("--rate", type=float, default=1_000.0)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--shards", type=int, default=16)
    a = p.parse_args(argv)
    main(a.data_dir, a.mode, a.count, a.rate, a.seconds, a.shards)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
