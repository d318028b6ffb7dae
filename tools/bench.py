"""`make bench`: throughput, latency, empty micro-batches and rule-apply delay of the real job on this machine.

Throughput: a pre-generated workload evaluated with an available-now trigger in bounded micro-batches,
once with the bench rules and once with every window × 60 (per-batch cost must follow the batch, not the
window). Latency: the continuous job fed at a fixed rate; an alert's latency is the time it was handed to
consumers (console, Kafka) minus the transaction's ingestionTimestamp; its Delta latency is when the
parquet file holding it was written. Peak memory = RSS of the driver, its JVM and Python workers.
For the median micro-batch of each mode it prints where the time went. Scale (`--mode scale`): whole
`fraudrules backtest` commands over one file of 1,000,000 and 5,000,000 records, their wall time and the peak
memory of their process trees.

Profiles: `local` (the default: what a laptop runs: one shard, local path tables through delta-rs, the vectorized
stateful input) and `cluster` (what the bundle runs: 16 shards and state partitions, catalog tables through Spark's
Delta writer in a local catalog, PySpark's own input regrouping), on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from fraudrules import event_schema, tables
from fraudrules.config import EVALUATE_QUERY, JobConfig
from fraudrules.engine import job
from fraudrules.engine.pyspark_compat import UPSTREAM_ENV
from fraudrules.generator import LoginWorkload, RateWriter, RichWorkload, Workload, write_jsonl
from fraudrules.rules import store
from fraudrules.rules.model import Rule, load_rules_file, parse_rule
from fraudrules.session import get_spark

BENCH_RULES = Path(__file__).with_name("bench_rules.json")
# --schema rich: the rich event schema's transactions (11 fields, nested ones) and 6 rules on nested text keys
SCHEMAS = {
    "default": (None, Workload, BENCH_RULES),
    "rich": (event_schema.builtin_path("rich"), RichWorkload, Path(__file__).with_name("bench_rules_rich.json")),
}
SCHEMA = "default"  # the --schema of this run
PROFILES = ("local", "cluster")
CLUSTER_SHARDS = 16  # the bundle's shards and state partitions
BENCH_SCHEMA = "fraudrules_bench"
SCALE = ((1_000_000, 10), (1_000_000, 1_440), (5_000_000, 10))  # (records in one file, window minutes)
LOGIN_RULE = {"ruleId": 100, "ruleState": "ACTIVE", "ruleType": "LOGIN_ANOMALY"}
PER_FILE = 5_000
BATCH = 50_000  # transactions a micro-batch of the throughput mode
DURATIONS = ("latestOffset", "getBatch", "queryPlanning", "addBatch", "walCommit", "commitOffsets")
STATE_METRICS = ("rocksdbCommitFileSyncLatencyMs", "rocksdbPutLatency", "rocksdbGetLatency", "rocksdbLoadLatencyMs")


class PeakMemory(threading.Thread):
    """Samples the memory of a process (default this one) and all its descendants: summed RSS (pages shared by the
    forked Python workers counted in each) and PSS (shared pages split between their sharers: the real footprint)."""

    def __init__(self, interval_s: float = 0.5, pid: int | None = None):
        super().__init__(daemon=True)
        self.interval_s, self.rss, self.pss, self._halt = interval_s, 0, 0, threading.Event()
        self.pid = pid or os.getpid()

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            rss, pss = _tree_memory(self.pid)
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
    ddl, _, path = SCHEMAS[SCHEMA]
    rules = load_rules_file(str(path), event_schema.of(ddl))
    return [replace(r, window_minutes=r.window_minutes * window_factor) for r in rules]


def workload(**kwargs) -> Workload:
    """The benchmark's transactions, of the schema chosen."""
    return SCHEMAS[SCHEMA][1](**kwargs)


def job_config(**kwargs) -> JobConfig:
    """A JobConfig on the schema chosen."""
    return JobConfig(event_schema=SCHEMAS[SCHEMA][0], **kwargs)


def profiled(cfg: JobConfig, profile: str) -> JobConfig:
    """A mode's configuration under a profile: the cluster one with the bundle's shards and catalog tables."""
    if profile == "local":
        return cfg
    schema = f"{BENCH_SCHEMA}_{os.path.basename(cfg.data_dir).replace('-', '_')}"
    return cfg.with_(shards=CLUSTER_SHARDS, shuffle_partitions=CLUSTER_SHARDS, catalog="spark_catalog", schema=schema)


def _fresh(spark, cfg: JobConfig, rules: list[Rule]) -> None:
    shutil.rmtree(cfg.data_dir, ignore_errors=True)
    if cfg.uses_catalog:
        spark.sql(f"DROP SCHEMA IF EXISTS {cfg.catalog}.{cfg.schema} CASCADE")
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


def throughput(spark, root: str, count: int, profile: str, window_factor: int = 1) -> tuple[list[str], float]:
    """Lines to print and the median evaluation batch time (ms)."""
    mode = job_config(
        data_dir=os.path.join(root, f"throughput-x{window_factor}"), available_now=True, max_records_per_trigger=BATCH
    )
    cfg = profiled(mode, profile)
    _fresh(spark, cfg, bench_rules(window_factor))
    write_jsonl(cfg.landing, workload(count=count).transactions(), per_file=PER_FILE)
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
        f"of <={BATCH:,}, {alerts:,} alerts",
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


def latency(spark, root: str, rate: float, seconds: float, logins: bool, profile: str) -> list[str]:
    """The continuous job at `rate` tx/s (with the login detector beside it when `logins`)."""
    name = "latency-logins" if logins else "latency"
    cfg = profiled(job_config(data_dir=os.path.join(root, name), logins=logins), profile)
    _fresh(spark, cfg, bench_rules() + ([parse_rule(LOGIN_RULE)] if logins else []))
    running = job.start(spark, cfg, printer=None)
    writers = [RateWriter(cfg.landing, workload(count=10**9, seed=99, first_id=10**9).transactions(), rate=rate)]
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


def scale(root: str, profile: str) -> list[str]:
    """Whole `fraudrules backtest` commands over one file (SCALE): wall time and the peak memory of the command's
    process tree (a fresh JVM and its Python workers each time)."""
    folder = os.path.join(root, "scale")
    os.makedirs(folder, exist_ok=True)
    lines = [f"scale: `fraudrules backtest` of one file, {len(bench_rules())} rules, the whole command"]
    for records, window in SCALE:
        source = _one_file(folder, records)
        rules = os.path.join(folder, f"rules-{window}m.json")
        Path(rules).write_text(json.dumps([r.to_json() | {"windowMinutes": window} for r in bench_rules()]))
        command = [sys.executable, "-m", "fraudrules.cli", "backtest", "--transactions", source, "--rules", rules]
        command += ["--out", os.path.join(folder, "alerts.jsonl"), "--data-dir", os.path.join(folder, "work")]
        command += ["--fresh"] + (["--event-schema", SCHEMAS[SCHEMA][0]] if SCHEMAS[SCHEMA][0] else [])
        env = dict(os.environ)
        if profile == "cluster":
            command += ["--catalog", "spark_catalog", "--schema", f"{BENCH_SCHEMA}_scale"]
            command += ["--shards", str(CLUSTER_SHARDS), "--shuffle-partitions", str(CLUSTER_SHARDS)]
            env[UPSTREAM_ENV] = "1"
        started = time.monotonic()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        memory = PeakMemory(pid=proc.pid)
        memory.start()
        out, err = proc.communicate()
        elapsed, peak = time.monotonic() - started, memory.stop()
        what = f"  {records:,} records ({os.path.getsize(source) / 2**20:,.0f} MiB), {window}-minute windows:"
        if proc.returncode:
            lines.append(f"{what} FAILED (exit {proc.returncode}) after {elapsed:.1f} s: {err.strip()[-500:]}")
            continue
        alerts = next((line.split(";")[0] for line in out.splitlines() if line.startswith("alerts: ")), "alerts: ?")
        lines.append(f"{what} {elapsed:.1f} s, peak {peak}; {alerts}")
    return lines


def _one_file(folder: str, records: int) -> str:
    """The scale workload (20,000 payees, 5,000 beneficiaries) of the schema chosen as one JSON-lines file, written
    once."""
    path = os.path.join(folder, f"transactions-{SCHEMA}-{records}.json")
    if not os.path.exists(path):
        transactions = workload(count=records, payees=20_000, beneficiaries=5_000).transactions()
        write_jsonl(os.path.join(folder, "new"), transactions, per_file=records)
        os.replace(os.path.join(folder, "new", "part-000000.json"), path)
        os.rmdir(os.path.join(folder, "new"))
    return path


def main(root: str, mode: str, count: int, rate: float, seconds: float, profile: str) -> None:
    """Run the chosen modes, printing each one's figures as soon as it has them."""
    shards = CLUSTER_SHARDS if profile == "cluster" else JobConfig().shards
    writes = "catalog tables, Spark's Delta writer" if profile == "cluster" else "path tables, delta-rs"
    print(
        f"fraudrules bench, profile {profile}, on {os.cpu_count()} cores (local[2], {shards} shards, {writes}, "
        f"RocksDB state store), {SCHEMA} event schema, {time.strftime('%Y-%m-%d')}",
        flush=True,
    )
    if profile == "cluster":
        os.environ[UPSTREAM_ENV] = "1"  # set before the JVM starts: its Python workers inherit it
    if mode in ("all", "throughput", "latency"):
        bench(root, mode, count, rate, seconds, profile)
    if mode == "scale":
        print("\n".join(scale(root, profile)), flush=True)


def bench(root: str, mode: str, count: int, rate: float, seconds: float, profile: str) -> None:
    """The throughput and latency modes, in one session."""
    spark = get_spark("fraudrules-bench", cfg=profiled(JobConfig(data_dir=root), profile))
    memory = PeakMemory()
    memory.start()
    if mode in ("all", "throughput"):
        throughput(spark, root, count // 4, profile)  # JIT warm-up, not reported: the two measured runs start alike
        lines, base = throughput(spark, root, count, profile)
        print("\n".join(lines), flush=True)
        lines, wide = throughput(spark, root, count, profile, window_factor=60)
        print("\n".join(lines), flush=True)
        print(f"per-batch cost, windows x60 / x1 (median micro-batch): {wide / base:.2f}", flush=True)
    if mode in ("all", "latency"):
        print("\n".join(latency(spark, root, rate, seconds, False, profile)), flush=True)
        print("\n".join(latency(spark, root, rate, seconds, True, profile)), flush=True)
    print(f"peak memory (driver + JVM + Python workers): {memory.stop()}", flush=True)
    spark.stop()


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default="bench/work", help="wiped and rewritten by every mode")
    p.add_argument(
        "--mode",
        choices=["all", "throughput", "latency", "scale"],
        default="all",
        help="all: throughput and latency; scale: whole backtests of 1M and 5M records in one file",
    )
    p.add_argument("--profile", choices=PROFILES, default="local", help="local: a laptop's; cluster: the bundle's")
    p.add_argument("--count", type=int, default=200_000, help="transactions of the throughput mode")
    p.add_argument("--rate", type=float, default=1_000.0, help="transactions/s of the latency mode")
    p.add_argument("--seconds", type=float, default=60.0, help="measured seconds of the latency mode")
    p.add_argument("--schema", choices=sorted(SCHEMAS), default="default", help="event schema, workload and rules")
    a = p.parse_args(argv)
    global SCHEMA
    SCHEMA = a.schema
    main(a.data_dir, a.mode, a.count, a.rate, a.seconds, a.profile)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
