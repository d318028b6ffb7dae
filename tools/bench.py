"""`make bench`: throughput, latency, empty micro-batches and rule-apply delay of the real job on this machine.

Throughput: a pre-generated workload evaluated with an available-now trigger in bounded micro-batches,
once with the bench rules and once with every window × 60 (per-batch cost must follow the batch, not the
window). Latency: the continuous job fed at a fixed rate; an alert's latency is the time it was handed to
consumers (console, Kafka) minus the transaction's ingestionTimestamp; its Delta latency is when the
parquet file holding it was written. Peak memory = RSS of the driver, its JVM and Python workers.
For the median micro-batch of each mode it prints where the time went.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from fraudrules import tables
from fraudrules.config import EVALUATE_QUERY, JobConfig
from fraudrules.engine import job
from fraudrules.generator import LoginWorkload, RateWriter, Workload, write_jsonl
from fraudrules.rules import store
from fraudrules.rules.model import Rule, load_rules_file, parse_rule
from fraudrules.session import get_spark

BENCH_RULES = Path(__file__).with_name("bench_rules.json")
LOGIN_RULE = {"ruleId": 100, "ruleState": "ACTIVE", "ruleType": "LOGIN_ANOMALY"}
PER_FILE = 5_000
FILES_PER_BATCH = 10  # 50,000 transactions a micro-batch
DURATIONS = ("latestOffset", "getBatch", "queryPlanning", "addBatch", "walCommit", "commitOffsets")
STATE_METRICS = ("rocksdbCommitFileSyncLatencyMs", "rocksdbPutLatency", "rocksdbGetLatency", "rocksdbLoadLatencyMs")


class PeakMemory(threading.Thread):
    """Samples the memory of this process and all its descendants: summed RSS (pages shared by the forked
    Python workers counted in each) and PSS (shared pages split between their sharers: the real footprint)."""

    def __init__(self, interval_s: float = 0.5):
        super().__init__(daemon=True)
        self.interval_s, self.rss, self.pss, self._halt = interval_s, 0, 0, threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            rss, pss = _tree_memory(os.getpid())
            self.rss, self.pss = max(self.rss, rss), max(self.pss, pss)

    def stop(self) -> str:
        self._halt.set()
        return f"PSS {self.pss / 2**20:,.0f} MiB (summed RSS {self.rss / 2**20:,.0f} MiB)"


def _tree_memory(root: int) -> tuple[int, int]:
    children: dict[int, list[int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(pid))
    rss = pss = 0
    stack = [root]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                kib = {line.split(":")[0]: int(line.split()[1]) for line in fh if line[:4] in ("Rss:", "Pss:")}
        except (OSError, ValueError, IndexError):
            continue
        rss, pss = rss + kib.get("Rss", 0) * 1024, pss + kib.get("Pss", 0) * 1024
    return rss, pss


def bench_rules(window_factor: int = 1) -> list[Rule]:
    rules = load_rules_file(str(BENCH_RULES))
    return [replace(r, window_minutes=r.window_minutes * window_factor) for r in rules]


def _fresh(spark, cfg: JobConfig, rules: list[Rule]) -> None:
    shutil.rmtree(cfg.data_dir, ignore_errors=True)
    tables.ensure(spark, cfg)
    store.upsert(spark, cfg, rules, "bench")


def _heartbeats(spark, cfg: JobConfig, query: str = EVALUATE_QUERY) -> dict[int, dict]:
    rows = tables.read(spark, cfg, "batches").where(f"query = '{query}'").collect()
    return {r.batchId: r.asDict() for r in rows}


def breakdown(progress, beats: dict[int, dict]) -> list[str]:
    """Where the median micro-batch's time went: Spark's phases, the state store, Python by stage."""
    if not progress:
        return ["  (no micro-batch to break down)"]
    median = sorted(progress, key=lambda p: p.durationMs["triggerExecution"])[len(progress) // 2]
    d = median.durationMs
    phases = ", ".join(f"{k} {d.get(k, 0):,}" for k in DURATIONS)
    lines = [f"  median micro-batch {median.batchId}: {d['triggerExecution']:,} ms = {phases} (ms)"]
    if median.stateOperators:
        m, op = median.stateOperators[0].customMetrics, median.stateOperators[0]
        state = ", ".join(f"{k.removeprefix('rocksdb')} {m.get(k, 0):,}" for k in STATE_METRICS)
        lines.append(f"    state store: {op.numRowsTotal:,} keys, {op.memoryUsedBytes / 2**20:,.0f} MiB, {state} (ms)")
    beat = beats.get(median.batchId)
    if beat and beat.get("pythonStages"):
        stages = ", ".join(f"{k} {v:,.0f}" for k, v in json.loads(beat["pythonStages"]).items())
        lines.append(
            f"    Python (slowest shard): {beat['pythonMs']:,.0f} ms = {stages} (ms); {beat['transactions']:,} "
            f"transactions, {beat['inputRows']:,} keyed events, {beat['retainedEvents']:,} retained in "
            f"{beat['chunks']} chunks ({beat['chunksFromStore']} read from the state store)"
        )
    return lines


def throughput(spark, root: str, count: int, window_factor: int = 1) -> tuple[list[str], float]:
    """Lines to print and the median evaluation batch time (ms)."""
    cfg = JobConfig(
        data_dir=os.path.join(root, f"throughput-x{window_factor}"),
        available_now=True,
        max_records_per_trigger=FILES_PER_BATCH * PER_FILE,
    )
    _fresh(spark, cfg, bench_rules(window_factor))
    write_jsonl(cfg.landing, Workload(count=count).transactions(), per_file=PER_FILE)
    started = time.time()
    running = job.start(spark, cfg, printer=None)
    running.wait()
    elapsed = time.time() - started
    beats = _heartbeats(spark, cfg)
    batches = [p for p in running.evaluate.recentProgress if beats.get(p.batchId, {}).get("transactions")]
    steady = batches[1:] or batches
    steady_tx = sum(beats[p.batchId]["transactions"] for p in steady)
    steady_s = sum(p.durationMs["triggerExecution"] for p in steady) / 1000
    median_ms = statistics.median(p.durationMs["triggerExecution"] for p in steady)
    alerts = tables.read(spark, cfg, "alerts").count()
    label = "" if window_factor == 1 else f", windows x{window_factor}"
    lines = [
        f"throughput{label}: {count:,} transactions, {len(cfg_rules(spark, cfg))} rules, {len(batches)} micro-batches "
        f"of <={FILES_PER_BATCH * PER_FILE:,}, {alerts:,} alerts",
        f"  end to end (incl. first-batch warm-up and the parallel bronze ingest): {count / elapsed:,.0f} tx/s "
        f"({elapsed:.1f} s)",
        f"  sustained (evaluation micro-batches after the first): {steady_tx / steady_s:,.0f} tx/s, "
        f"median micro-batch {median_ms:,.0f} ms",
        *breakdown(steady, beats),
    ]
    return lines, median_ms


def cfg_rules(spark, cfg: JobConfig) -> list[dict]:
    return [r for r in store.current(spark, cfg).values() if r["ruleState"] == "ACTIVE"]


def _percentiles(ms: np.ndarray) -> str:
    if len(ms) == 0:
        return "no alerts"
    p50, p99 = np.percentile(ms, [50, 99])
    return f"p50 {p50:,.0f} ms, p99 {p99:,.0f} ms, max {ms.max():,.0f} ms"


def _histogram(ms: np.ndarray, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.hist(ms, bins=60, color="#4472c4")
    for q, style in ((50, "--"), (99, ":")):
        v = float(np.percentile(ms, q))
        ax.axvline(v, color="black", linestyle=style, label=f"p{q} {v:,.0f} ms")
    ax.set(title=title, xlabel="ingestion → alert handed to consumers (ms)", ylabel="alerts")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency(spark, root: str, rate: float, seconds: float, logins: bool) -> list[str]:
    """The continuous job at `rate` tx/s (with the login detector beside it when `logins`)."""
    name = "latency-logins" if logins else "latency"
    cfg = JobConfig(data_dir=os.path.join(root, name), logins=logins)
    _fresh(spark, cfg, bench_rules() + ([parse_rule(LOGIN_RULE)] if logins else []))
    running = job.start(spark, cfg, printer=None)
    writers = [RateWriter(cfg.landing, Workload(count=10**9, seed=99, first_id=10**9).transactions(), rate=rate)]
    if logins:
        writers.append(
            RateWriter(
                cfg.logins_landing,
                LoginWorkload(count=10**9, attack_every=50).events(),
                rate=rate / 10,
                time_field="eventTimestamp",
            )
        )
    for w in writers:
        w.start()
    _caught_up(running)
    since = int(time.time() * 1000)
    time.sleep(seconds / 2)
    change = bench_rules()[0]
    store.upsert(spark, cfg, [replace(change, limit=change.limit + 1)], "bench")  # a rule change mid-run
    time.sleep(seconds / 2)
    until = int(time.time() * 1000)
    for w in writers:
        w.stop()
        w.join()
    running.process_all_available()
    empty = _empty_batches(running, cfg)
    running.stop()
    alerts = tables.read(spark, cfg, "alerts").where(f"ingestionTimestamp BETWEEN {since} AND {until}")
    rows = alerts.selectExpr(
        "kind",
        "publishedAtMs - ingestionTimestamp AS published",
        "unix_millis(_metadata.file_modification_time) - ingestionTimestamp AS delta",
    ).toPandas()
    published, in_delta = rows["published"].to_numpy(float), rows["delta"].to_numpy(float)
    png = os.path.join(root, f"{name}.png")
    if len(published):
        _histogram(
            published, png, f"Alert latency at {rate:,.0f} tx/s" + (" with the login detector" if logins else "")
        )
    applied = tables.read(spark, cfg, "rule_applied").where(f"ruleId = {change.rule_id}").orderBy("version").collect()
    beats = _heartbeats(spark, cfg)
    progress = [p for p in running.evaluate.recentProgress if beats.get(p.batchId, {}).get("transactions")]
    logins_count = int((rows["kind"] == "LOGIN_ANOMALY").sum())
    return [
        f"{name}: {rate:,.0f} tx/s for {seconds:.0f} s{' + logins at ' + f'{rate / 10:,.0f}/s' if logins else ''}, "
        f"{len(rows):,} alerts ({logins_count} login anomalies), histogram {png}",
        f"  ingestion → alert handed to consumers: {_percentiles(published)}",
        f"  ingestion → alert in the Delta table: {_percentiles(in_delta)}",
        "  rule change → first event evaluated: "
        + (
            ", ".join(f"v{r.version} {r.delayMs:,} ms" for r in applied if r.delayMs is not None and r.version > 1)
            or "-"
        ),
        f"  empty micro-batch (no input rows): {empty}",
        *breakdown(progress, beats),
    ]


def _caught_up(running: job.Job, timeout_s: float = 90.0) -> None:
    """Warm-up, not measured: until the evaluation keeps pace (three micro-batches in a row under 1 s after the
    first ones, which start the workers and read the backlog that piled up meanwhile)."""
    deadline = time.monotonic() + timeout_s
    time.sleep(10)
    while time.monotonic() < deadline:
        recent = running.evaluate.recentProgress[-3:]
        if len(recent) == 3 and all(p.durationMs["triggerExecution"] < 1_000 for p in recent):
            return
        time.sleep(1)


def _empty_batches(running: job.Job, cfg: JobConfig, count: int = 5) -> str:
    """Micro-batches that read a file with no records: what a batch costs by itself."""
    before = {p.batchId for p in running.evaluate.recentProgress}
    for i in range(count):
        path = os.path.join(cfg.landing, f"empty-{i}.json")
        with open(path + ".tmp", "w"):
            pass
        os.replace(path + ".tmp", path)
        running.evaluate.processAllAvailable()
    ms = [p.durationMs["triggerExecution"] for p in running.evaluate.recentProgress if p.batchId not in before]
    return f"median {statistics.median(ms):,.0f} ms over {len(ms)}" if ms else "none ran"


def main(root: str, mode: str, count: int, rate: float, seconds: float) -> None:
    """Run the chosen modes, printing each one's figures as soon as it has them."""
    spark = get_spark("fraudrules-bench")
    memory = PeakMemory()
    memory.start()
    print(
        f"fraudrules bench on {os.cpu_count()} cores (local[2], {JobConfig().shards} shards, RocksDB state store), "
        f"{time.strftime('%Y-%m-%d')}",
        flush=True,
    )
    if mode in ("all", "throughput"):
        throughput(spark, root, count // 4)  # JIT warm-up, not reported: the two measured runs start alike
        lines, base = throughput(spark, root, count)
        print("\n".join(lines), flush=True)
        lines, wide = throughput(spark, root, count, window_factor=60)
        print("\n".join(lines), flush=True)
        print(f"per-batch cost, windows x60 / x1 (median micro-batch): {wide / base:.2f}", flush=True)
    if mode in ("all", "latency"):
        print("\n".join(latency(spark, root, rate, seconds, logins=False)), flush=True)
        print("\n".join(latency(spark, root, rate, seconds, logins=True)), flush=True)
    print(f"peak memory (driver + JVM + Python workers): {memory.stop()}", flush=True)
    spark.stop()


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default="bench/work", help="wiped and rewritten by every mode")
    p.add_argument("--mode", choices=["all", "throughput", "latency"], default="all")
    p.add_argument("--count", type=int, default=200_000, help="transactions of the throughput mode")
    p.add_argument("--rate", type=float, default=1_000.0, help="transactions/s of the latency mode")
    p.add_argument("--seconds", type=float, default=60.0, help="measured seconds of the latency mode")
    a = p.parse_args(argv)
    main(a.data_dir, a.mode, a.count, a.rate, a.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
