"""`make bench`: throughput, latency, empty micro-batches and rule-apply delay of the real job on this machine.

Throughput: a pre-generated workload evaluated with an available-now trigger in bounded micro-batches,
once with the bench rules and once with every window × 60 (per-batch cost must follow the batch, not the
window). Latency: the continuous job fed at a fixed rate; an alert's latency is the time it was handed to
consumers (console, Kafka) minus the transaction's ingestionTimestamp; its Delta latency is when the
parquet file holding it was written. Peak memory = RSS of the driver, its JVM and Python workers.
For the median micro-batch of each mode it prints where the time went. Scale (`--mode scale`): whole
`fraudrules backtest` commands over one file of 1,000,000 and 5,000,000 records, their wall time and the peak
memory of their process trees. CPU (`--mode cpu`): one whole `fraudrules backtest` of `--count` transactions and
where its CPU went: by process (the driver JVM, each kind of Python worker) and by kind of JVM thread
(tools/cpu_profile.py).

Kafka end to end (`--mode kafka`, the figure users see): a local single-node broker
(tools/support/kafka_broker.py) and the job as production runs it, `fraudrules run --no-generator --source kafka`
in a child process with the bench rules.
A producer sends the workload at `--rate` tx/s in small batches (every 15 ms), each record's ingestionTimestamp the
wall clock at send; a consumer reads the alerts topic as alerts arrive. An alert's latency is its receive time minus
its transaction's stamp (carried in the alert), over the transactions sent in `--seconds` after `--warmup` (which
counts from the job's first micro-batch of transactions: its start-up is not in it); the job gets time to evaluate
all of them before it is stopped (SIGINT). Also: the same window's alerts in the job's
Delta table, the latency split by step (send → evaluated → on the driver → received) and the peak PSS of the job's
process tree. `--rates 1000,2000,5000`: a fresh job at each rate, then the highest one with p99 <= 1 s.
`--preload-hours 24`: long-lived state first: before the job starts, its topic receives that many hours of event
time at `--preload-rate` tx/s (default 50: 4.3M transactions for 24 hours), ending where the live workload's event
time starts, and every bench rule's window is that long; the job drains this backlog on its own checkpoints, then
the live producer starts and the warm-up counts from there.

Profiles: `local` (the default: what a laptop runs: one shard, local path tables through delta-rs, the vectorized
stateful input) and `cluster` (what the bundle runs: 16 shards and state partitions, catalog tables through Spark's
Delta writer in a local catalog, PySpark's own input regrouping), on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from fraudrules import event_schema, kafka_client, tables
from fraudrules.compat import spark_checkpoint
from fraudrules.compat.pyspark import UPSTREAM_ENV
from fraudrules.config import EVALUATE_QUERY, JobConfig
from fraudrules.engine import job
from fraudrules.engine.lines import open_fs
from fraudrules.engine.outbox import OUTBOX_FOLDER, Outbox
from fraudrules.engine.publisher import PROGRESS as PUBLISHED
from fraudrules.generator import TRANSACTIONS_PER_LOGIN, LoginWorkload, RateWriter, RichWorkload, Workload, write_jsonl
from fraudrules.rules import store
from fraudrules.rules.model import Rule, load_rules_file, parse_rule
from fraudrules.session import get_spark
from tools import cpu_profile

BENCH_RULES = Path(__file__).with_name("bench_rules.json")
# --events rich: the rich event schema's transactions (11 fields, nested ones) and 6 rules on nested text keys
EVENT_KINDS = {
    "default": (None, Workload, BENCH_RULES),
    "rich": (event_schema.builtin_path("rich"), RichWorkload, Path(__file__).with_name("bench_rules_rich.json")),
}
EVENTS = "default"  # the --events of this run
RULES_TABLE = False  # --rules-table: the Kafka job's rules from a Delta rules table's change feed
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
    rss = pss = 0
    for pid in cpu_profile.process_tree(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                kib = {line.split(":")[0]: int(line.split()[1]) for line in fh if line[:4] in ("Rss:", "Pss:")}
        except (OSError, ValueError, IndexError):
            continue
        rss, pss = rss + kib.get("Rss", 0) * 1024, pss + kib.get("Pss", 0) * 1024
    return rss, pss


def bench_rules(window_factor: int = 1) -> list[Rule]:
    ddl, _, path = EVENT_KINDS[EVENTS]
    rules = load_rules_file(str(path), event_schema.of(ddl))
    return [replace(r, window_minutes=r.window_minutes * window_factor) for r in rules]


def rules_file(folder: str, window_minutes: int) -> str:
    """The bench rules with every window `window_minutes` long, as a rules file in `folder` (its path)."""
    path = os.path.join(folder, f"rules-{window_minutes}m.json")
    Path(path).write_text(json.dumps([r.to_json() | {"windowMinutes": window_minutes} for r in bench_rules()]))
    return path


def workload(**kwargs) -> Workload:
    """The benchmark's transactions, of the schema chosen."""
    return EVENT_KINDS[EVENTS][1](**kwargs)


def job_config(**kwargs) -> JobConfig:
    """A JobConfig on the schema chosen."""
    return JobConfig(event_schema=EVENT_KINDS[EVENTS][0], **kwargs)


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


def _percentiles(ms: np.ndarray, quantiles: tuple[int, ...] = (50, 99)) -> str:
    if len(ms) == 0:
        return "no alerts"
    values = np.percentile(ms, quantiles)
    return ", ".join(f"p{q} {v:,.0f} ms" for q, v in zip(quantiles, values, strict=True)) + f", max {ms.max():,.0f} ms"


def _histogram(ms: np.ndarray, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4), layout="constrained")
    ax.hist(ms, bins=60, color="#4472c4")
    for q, style in ((50, "--"), (99, ":")):
        v = float(np.percentile(ms, q))
        ax.axvline(v, color="black", linestyle=style, label=f"p{q} {v:,.0f} ms")
    ax.set(title=title, xlabel="ingestion → alert handed to consumers (ms)", ylabel="alerts")
    fig.legend(loc="outside lower center", ncols=2)  # below the axes: inside, it covered the p99 line or the bars
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency(spark, root: str, rate: float, seconds: float, logins: bool, profile: str) -> list[str]:
    """The continuous job at `rate` tx/s (and with `logins`, login events at a tenth of it, for the login detector)."""
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
                rate=rate / TRANSACTIONS_PER_LOGIN,
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
        f"{name}: {rate:,.0f} tx/s for {seconds:.0f} s"
        f"{' + logins at ' + f'{rate / TRANSACTIONS_PER_LOGIN:,.0f}/s' if logins else ''}, "
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


# ------------------------------------------------------------------------------------------ Kafka end to end

SUSTAINED_P99_MS = 1_000  # --rates: the highest rate whose p99 stays at or under this
KAFKA_TICK_S = 0.015  # the producer sends a small batch this often, each record stamped at send
KAFKA_KINDS = ("transactions", "logins", "rules", "alerts")  # the job's topics, one set per run
STARTED_LINE = "starting the queries"  # what `fraudrules run` prints once its tables and rules are ready
STARTUP_S = 300  # the job's first micro-batch of transactions, at most this long after the producer starts
# alert JSON fields after the send stamp (ingestionTimestamp), then the consumer's receive time: where the time goes
KAFKA_STAGES = (("producedAtMs", "evaluated"), ("publishedAtMs", "on the driver"), (None, "received"))
LIVE_START_MS = Workload.start_ms  # event time of the live workload's start; a preload ends before it
PRELOAD_DRAIN_S = 3_600  # the job evaluates the preloaded backlog within this long, or the run fails
PRODUCE_POLL_EVERY = 10_000  # the backlog producer serves its delivery reports this often (messages)


@dataclass(frozen=True)
class Preload:
    """`--preload-hours`: a backlog of `hours` of event time at `rate` tx/s, ending before LIVE_START_MS (0.5%
    short of the full span: the random gaps between events add up to within a minute of it), and rules whose windows
    are that long."""

    hours: float
    rate: float

    @property
    def count(self) -> int:
        return int(self.hours * 3600 * self.rate * 0.995)

    @property
    def window_minutes(self) -> int:
        return round(self.hours * 60)

    def events(self):
        span_ms = int(self.hours * 3_600_000)
        return workload(
            count=self.count, seed=98, first_id=1, events_per_second=self.rate, start_ms=LIVE_START_MS - span_ms
        ).transactions()


@dataclass
class KafkaRun:
    """What one Kafka-mode run measured: the latency (receive time − send stamp, ms) of each alert whose transaction
    was sent in the measured window, and the same split by stage (KAFKA_STAGES)."""

    rate: float
    warmup: float
    seconds: float
    latencies: np.ndarray = field(default_factory=lambda: np.empty(0))
    stages: dict[str, np.ndarray] = field(default_factory=dict)
    duplicates: int = 0  # alerts received more than once (the topic is at-least-once)
    in_delta: int | None = None  # the measured window's alerts in the job's Delta alerts table (None: not read)
    behind: int = 0  # transactions the job had not evaluated when the wait for it ended
    memory: str = "?"
    error: str | None = None
    preloaded: str | None = None  # with --preload-hours: what the job held before the live input, and its drain
    driver_ms: float | None = None  # CPU of the job's driver process (its Python) per micro-batch in the window
    batches: int = 0  # evaluate micro-batches committed in the window

    @property
    def p99(self) -> float | None:
        return float(np.percentile(self.latencies, 99)) if len(self.latencies) else None

    @property
    def sustained(self) -> bool:
        """Kept pace with p99 at or under SUSTAINED_P99_MS (a run without alerts proves nothing)."""
        return self.error is None and not self.behind and self.p99 is not None and self.p99 <= SUSTAINED_P99_MS

    def lines(self) -> list[str]:
        head = f"kafka: {self.rate:,.0f} tx/s"
        if self.error is not None:
            return [f"{head}: FAILED: {self.error}"]
        lines = [
            f"{head}, {len(self.latencies):,} alerts measured over {self.seconds:.0f} s after a {self.warmup:.0f} s "
            f"warm-up: send → alert received {_percentiles(self.latencies, (50, 90, 99))}; job peak {self.memory}"
        ]
        delta = "?" if self.in_delta is None else f"{self.in_delta:,}"
        check = f"  the window's alerts: {len(self.latencies):,} received, {delta} in the job's Delta alerts table"
        check += f" ({self.duplicates:,} received twice)" if self.duplicates else ""
        if self.behind:
            check += f"; the job had not evaluated the last {self.behind:,} transactions when the wait ended"
        lines.append(check)
        if self.preloaded:
            lines.append(f"  on long-lived state: {self.preloaded}")
        if self.driver_ms is not None:
            lines.append(
                f"  the driver's Python (sinks, publisher, committers): {self.driver_ms * self.batches / 1000:,.1f} s "
                f"of CPU in the window, {self.driver_ms:,.0f} ms per micro-batch ({self.batches:,} micro-batches)"
            )
        if self.stages and len(self.latencies):
            split = ", ".join(
                f"→ {name} {np.percentile(ms, 50):,.0f} / {np.percentile(ms, 99):,.0f}"
                for name, ms in self.stages.items()
            )
            lines.append(f"  where the time goes (p50 / p99 ms of each step): sent {split}")
        return lines


def highest_sustained(runs: list[KafkaRun]) -> str:
    """The line that names the highest rate at which p99 stayed at or under SUSTAINED_P99_MS."""
    kept = [r.rate for r in runs if r.sustained]
    limit = f"p99 <= {SUSTAINED_P99_MS / 1000:g} s"
    if not kept:
        tried = ", ".join(f"{r.rate:,.0f}" for r in sorted(runs, key=lambda r: r.rate))
        return f"highest rate with {limit}: none of {tried} tx/s"
    return f"highest rate with {limit}: {max(kept):,.0f} tx/s"


def kafka_mode(
    root: str, rates: list[float], warmup: float, seconds: float, profile: str, preload: Preload | None = None
) -> list[KafkaRun]:
    """Kafka end to end at each rate in turn (a fresh job each time) on one local broker, printing each run's lines
    as it ends; the broker and every job are stopped whatever happens."""
    from tools.support.kafka_broker import start_local_broker

    os.makedirs(root, exist_ok=True)
    shutil.rmtree(os.path.join(root, "kafka"), ignore_errors=True)
    broker = start_local_broker(os.path.join(root, "kafka"))
    runs = []
    try:
        for rate in rates:
            try:
                run = kafka_run(root, broker.bootstrap, rate, warmup, seconds, profile, preload)
            except (RuntimeError, TimeoutError) as err:  # this rate's job died or never started: the next may run
                run = KafkaRun(rate, warmup, seconds, error=str(err))
            runs.append(run)
            print("\n".join(run.lines()), flush=True)
    finally:
        broker.stop()
    return runs


def kafka_run(
    root: str, bootstrap: str, rate: float, warmup: float, seconds: float, profile: str, preload: Preload | None = None
) -> KafkaRun:
    """`fraudrules run` on Kafka as production runs it (a child process), fed at `rate` tx/s by a producer that
    stamps each record at send; a consumer times each alert read back from the alerts topic. With `preload`, the job
    first drains a backlog of long-lived state (`Preload`)."""
    from fraudrules.generator import KafkaRateWriter
    from tools.support.kafka_broker import TopicTail, create_topics, end_offsets

    name = f"kafka-{rate:g}"
    data_dir = os.path.join(root, name)
    shutil.rmtree(data_dir, ignore_errors=True)
    os.makedirs(data_dir)
    topics = {kind: f"{name}-{kind}" for kind in KAFKA_KINDS}
    create_topics(bootstrap, list(topics.values()))
    alerts: dict[str, tuple[int, ...]] = {}  # alertId -> send stamp, stage times, receive time (first receipt)
    duplicates = [0]

    def on_alert(msg, received_ms: int) -> None:
        row = json.loads(msg.value())
        if row["alertId"] in alerts:
            duplicates[0] += 1
            return
        stamps = [row.get("ingestionTimestamp") or -1, *(row.get(f) or 0 for f, _ in KAFKA_STAGES[:-1])]
        alerts[row["alertId"]] = (*stamps, received_ms)

    log_path = os.path.join(data_dir, "job.log")
    rules = rules_file(data_dir, preload.window_minutes) if preload else str(EVENT_KINDS[EVENTS][2])
    if preload:
        started = time.monotonic()
        produced = _produce_backlog(bootstrap, topics["transactions"], preload.events())
        print(f"  preload: {produced:,} transactions sent in {time.monotonic() - started:.0f} s", flush=True)
    child = _spawn_job(kafka_command(bootstrap, data_dir, topics, profile, rules), log_path, profile)
    memory = PeakMemory(pid=child.pid)
    memory.start()
    tail = TopicTail(bootstrap, topics["alerts"], on_alert)
    tail.start()
    writer, preloaded = None, None
    checkpoint = JobConfig(data_dir=data_dir).checkpoint(EVALUATE_QUERY)

    def read() -> int:
        return committed_offsets(checkpoint, topics["transactions"])

    try:
        _wait_for_line(child, log_path, STARTED_LINE)
        if preload:
            started = time.monotonic()
            if not _watch(child, log_path, tail, time.time() + PRELOAD_DRAIN_S, until=lambda: read() >= produced):
                raise TimeoutError(f"the job evaluated {read():,} of {produced:,} preloaded transactions in time")
            preloaded = (
                f"{produced:,} transactions over {preload.hours:g} h of event time at {preload.rate:g} tx/s, "
                f"{preload.window_minutes:,}-minute windows; the job evaluated them in "
                f"{time.monotonic() - started:.0f} s before the live input started"
            )
        events = workload(count=10**9, seed=99, first_id=10**9, events_per_second=rate).transactions()
        writer = KafkaRateWriter(bootstrap, topics["transactions"], events, rate, tick_s=KAFKA_TICK_S)
        writer.start()
        # the warm-up counts from the first micro-batch that evaluated transactions: start-up (Python workers, state
        # stores: 25 s or more, longer on a loaded machine) must not eat it, and the backlog it left is drained in it
        if not _watch(child, log_path, tail, time.time() + STARTUP_S, until=lambda: read() > 0):
            raise TimeoutError(f"the job evaluated no transaction in {STARTUP_S} s (log {log_path})")
        since = int(time.time() * 1000 + warmup * 1000)
        until = since + int(seconds * 1000)
        _watch(child, log_path, tail, since / 1000)
        first_cpu, first_batch = _driver_cpu(child.pid), _last_batch(checkpoint)
        _watch(child, log_path, tail, until / 1000)
        batches = _last_batch(checkpoint) - first_batch
        driver_ms = (_driver_cpu(child.pid) - first_cpu) * 1000 / batches if batches > 0 else None
        writer.stop()
        writer.join()
        sent = sum(end_offsets(bootstrap, topics["transactions"]).values())
        # every transaction sent evaluated, so its alerts published: those late ones count (else `behind`)
        _watch(child, log_path, tail, time.time() + max(60.0, seconds), until=lambda: read() >= sent)
        behind = max(0, sent - read())
        # the last micro-batch's alerts may still be on their way to the topic (the publisher's own thread)
        last = _last_batch(checkpoint)
        _watch(child, log_path, tail, time.time() + 30, until=lambda: _published_batch(checkpoint) >= last)
        ends = end_offsets(bootstrap, topics["alerts"])
        _watch(child, log_path, tail, time.time() + 30, until=lambda: tail.caught_up(ends))
        peak = memory.stop()
    finally:
        if writer is not None:
            writer.stop()
            writer.join()
        tail.stop()
        memory.stop()
        _stop_job(child)
    measured = [a for a in alerts.values() if since <= a[0] < until]
    times = np.array(measured, dtype=np.float64).reshape(-1, len(KAFKA_STAGES) + 1)
    steps = np.diff(times, axis=1)
    return KafkaRun(
        rate,
        warmup,
        seconds,
        latencies=times[:, -1] - times[:, 0],
        stages={label: steps[:, i] for i, (_, label) in enumerate(KAFKA_STAGES)},
        duplicates=duplicates[0],
        in_delta=_delta_alerts(data_dir, since, until),
        behind=behind,
        memory=peak,
        preloaded=preloaded,
        driver_ms=driver_ms,
        batches=batches,
    )


def _produce_backlog(bootstrap: str, topic: str, events) -> int:
    """Every event to the topic as fast as the broker takes them, stamped with the time it was sent."""
    producer = kafka_client.producer(bootstrap, **{"linger.ms": 50, "queue.buffering.max.messages": 1_000_000})
    sent = 0
    for event in events:
        event["ingestionTimestamp"] = int(time.time() * 1000)
        kafka_client.send(producer, topic, json.dumps(event).encode())
        sent += 1
        if sent % PRODUCE_POLL_EVERY == 0:
            producer.poll(0)
    if left := producer.flush(300):
        raise RuntimeError(f"{left:,} preloaded transactions were not delivered")
    return sent


def kafka_command(bootstrap: str, data_dir: str, topics: dict[str, str], profile: str, rules: str) -> list[str]:
    """The production command line of the job on Kafka, with the given rules (and the schema's DDL)."""
    command = [sys.executable, "-m", "fraudrules.cli", "run", "--no-generator", "--source", "kafka"]
    command += ["--kafka-bootstrap", bootstrap, "--data-dir", data_dir, "--rules", rules]
    if RULES_TABLE:  # created by the job with the rules file's rules; the rules query follows its change feed
        command += ["--rules-table", os.path.abspath(os.path.join(data_dir, "rules_admin"))]
    for kind, topic in topics.items():
        command += [f"--{kind}-topic", topic]
    if EVENT_KINDS[EVENTS][0]:
        command += ["--event-schema", str(EVENT_KINDS[EVENTS][0])]
    if profile == "cluster":  # as `profiled` and the scale mode: the bundle's shards, catalog tables
        schema = f"{BENCH_SCHEMA}_{os.path.basename(data_dir)}".replace("-", "_").replace(".", "_")
        command += ["--catalog", "spark_catalog", "--schema", schema]
        command += ["--shards", str(CLUSTER_SHARDS), "--shuffle-partitions", str(CLUSTER_SHARDS)]
    return command


def _spawn_job(command: list[str], log_path: str, profile: str) -> subprocess.Popen:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    if profile == "cluster":
        env[UPSTREAM_ENV] = "1"
    with open(log_path, "wb") as out:
        # Own process group: a Ctrl-C in the terminal reaches only the bench, which stops the job in order.
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )


def _log_tail(log_path: str, lines: int = 20) -> str:
    text = Path(log_path).read_text(errors="replace") if os.path.exists(log_path) else ""
    return "\n".join(text.splitlines()[-lines:])


def _alive(child: subprocess.Popen, log_path: str) -> None:
    if child.poll() is not None:
        raise RuntimeError(f"the job exited with {child.returncode} (log {log_path}):\n{_log_tail(log_path)}")


def _wait_for_line(child: subprocess.Popen, log_path: str, text: str, timeout_s: float = 300) -> None:
    """Until the job's output has `text` (it exiting first, or the timeout, is an error)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _alive(child, log_path)
        if text in Path(log_path).read_text(errors="replace"):
            return
        time.sleep(0.5)
    raise TimeoutError(f"the job did not print {text!r} in {timeout_s:.0f} s (log {log_path})")


def _watch(child, log_path: str, tail, deadline: float, until=lambda: False) -> bool:
    """Until the wall clock reaches `deadline` or `until()` holds (its value), the job and the consumer alive."""
    while time.time() < deadline:
        _alive(child, log_path)
        if tail.error is not None:
            raise RuntimeError(f"reading the alerts topic: {tail.error}")
        if until():
            return True
        time.sleep(0.2)
    return until()


def _driver_cpu(pid: int) -> float:
    """CPU seconds the job's driver process has used: its Python (the sinks, the publisher and the committers), not
    the JVM or the Python workers."""
    return cpu_profile.process_tree(pid).get(pid, 0.0)


def _last_batch(checkpoint: str) -> int:
    """A query's last committed micro-batch (-1 before any)."""
    batch = spark_checkpoint.newest_committed(*open_fs(checkpoint))
    return -1 if batch is None else batch


def _published_batch(checkpoint: str) -> int:
    """The last micro-batch whose alerts the job's publisher has written to the alerts topic (-1 before any)."""
    return Outbox(os.path.join(checkpoint, OUTBOX_FOLDER)).progress(PUBLISHED).committed


def committed_offsets(checkpoint: str, topic: str) -> int:
    """Records of a Kafka topic (summed over partitions) that a query's last committed micro-batch had read: its
    offset log entry's line for a Kafka source, `{topic: {partition: offset}}`."""
    batch = _last_batch(checkpoint)
    if batch < 0:
        return 0
    try:
        planned = spark_checkpoint.planned(*open_fs(checkpoint), batch)[1]
    except OSError:  # purged by Spark since
        return 0
    for line in planned:
        try:
            source = json.loads(line)
        except ValueError:
            continue
        if isinstance(source, dict) and isinstance(source.get(topic), dict):
            return sum(int(v) for v in source[topic].values())
    return 0


def _stop_job(child: subprocess.Popen, timeout_s: float = 120) -> None:
    """SIGINT (the job drains its micro-batches and stops Spark), then its whole process group is gone; SIGKILL
    when it takes longer than `timeout_s`."""
    if child.poll() is None:
        os.kill(child.pid, signal.SIGINT)
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"  the job did not stop in {timeout_s:.0f} s after SIGINT: SIGKILL", flush=True)
    started = time.monotonic()
    while time.monotonic() - started < 30:  # its JVM and Python workers end with the driver; after 15 s, SIGKILL
        child.poll()  # reaps the driver once it is gone
        try:
            os.killpg(child.pid, signal.SIGKILL if time.monotonic() - started > 15 else 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        print(f"  processes of the job's group {child.pid} are still there", flush=True)
    child.wait()


def _delta_alerts(data_dir: str, since: int, until: int) -> int | None:
    """Alerts of transactions sent in [since, until) in the job's Delta alerts table (read with delta-rs: no Spark
    here); None when it cannot be read."""
    import glob

    import pyarrow.compute as pc

    found = [os.path.join(data_dir, "tables", "alerts")]
    found += glob.glob(os.path.join(data_dir, "catalog", "warehouse", "*", "alerts"))  # the cluster profile's
    for path in found:
        if not os.path.isdir(os.path.join(path, "_delta_log")):
            continue
        try:
            from deltalake import DeltaTable

            rows = DeltaTable(path).to_pyarrow_table(columns=["alertId", "ingestionTimestamp"])
        except Exception:  # a figure the run can do without
            return None
        stamp = rows.column("ingestionTimestamp")
        window = pc.and_(pc.greater_equal(stamp, since), pc.less(stamp, until))
        return len(pc.unique(rows.filter(window).column("alertId")))
    return None


def scale(root: str, profile: str) -> list[str]:
    """Whole `fraudrules backtest` commands over one file (SCALE): wall time and the peak memory of the command's
    process tree (a fresh JVM and its Python workers each time)."""
    folder = os.path.join(root, "scale")
    os.makedirs(folder, exist_ok=True)
    lines = [f"scale: `fraudrules backtest` of one file, {len(bench_rules())} rules, the whole command"]
    for records, window in SCALE:
        source = _one_file(folder, records)
        started = time.monotonic()
        proc = _backtest(source, rules_file(folder, window), folder, profile)
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


def _backtest(source: str, rules: str, folder: str, profile: str) -> subprocess.Popen:
    """A whole `fraudrules backtest` command of the profile over `source`, started in a child process; its tables
    in `folder`/work, its alerts in `folder`/alerts.jsonl."""
    command = [sys.executable, "-m", "fraudrules.cli", "backtest", "--transactions", source, "--rules", rules]
    command += ["--out", os.path.join(folder, "alerts.jsonl"), "--data-dir", os.path.join(folder, "work")]
    command += ["--fresh"] + (["--event-schema", EVENT_KINDS[EVENTS][0]] if EVENT_KINDS[EVENTS][0] else [])
    env = dict(os.environ)
    if profile == "cluster":
        command += ["--catalog", "spark_catalog", "--schema", f"{BENCH_SCHEMA}_{os.path.basename(folder)}"]
        command += ["--shards", str(CLUSTER_SHARDS), "--shuffle-partitions", str(CLUSTER_SHARDS)]
        env[UPSTREAM_ENV] = "1"
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def cpu(root: str, count: int, profile: str) -> list[str]:
    """Where the CPU of a whole `fraudrules backtest` goes (tools/cpu_profile.py): `count` transactions of the
    bench workload in files of PER_FILE, the bench rules."""
    folder = os.path.join(root, "cpu")
    shutil.rmtree(folder, ignore_errors=True)
    source = os.path.join(folder, "tx")
    files = -(-write_jsonl(source, workload(count=count).transactions(), per_file=PER_FILE) // PER_FILE)
    proc = _backtest(source, str(EVENT_KINDS[EVENTS][2]), folder, profile)
    sampler = cpu_profile.Sampler(proc.pid)
    sampler.start()
    out, err = proc.communicate()
    found = sampler.stop()
    what = f"cpu: `fraudrules backtest` of {count:,} transactions ({files} files), {len(bench_rules())} rules"
    if proc.returncode:
        return [f"{what}: FAILED (exit {proc.returncode}) after {found.seconds:.1f} s: {err.strip()[-500:]}"]
    alerts = next((line.split(";")[0] for line in out.splitlines() if line.startswith("alerts: ")), "alerts: ?")
    return [f"{what}; {alerts}", *found.report()]


def _one_file(folder: str, records: int) -> str:
    """The scale workload (20,000 payees, 5,000 beneficiaries) of the schema chosen as one JSON-lines file, written
    once."""
    path = os.path.join(folder, f"transactions-{EVENTS}-{records}.json")
    if not os.path.exists(path):
        transactions = workload(count=records, payees=20_000, beneficiaries=5_000).transactions()
        write_jsonl(os.path.join(folder, "new"), transactions, per_file=records)
        os.replace(os.path.join(folder, "new", "part-000000.json"), path)
        os.rmdir(os.path.join(folder, "new"))
    return path


def main(
    root: str,
    mode: str,
    count: int,
    rate: float,
    seconds: float,
    profile: str,
    rates: list[float] | None = None,
    warmup: float = 40.0,
    preload: Preload | None = None,
    minutes: float = 90.0,
    every: float = 5.0,
    maintain_every: float = 30.0,
    dq_minutes: float = 15.0,
) -> None:
    """Run the chosen modes, printing each one's figures as soon as it has them."""
    shards = CLUSTER_SHARDS if profile == "cluster" else JobConfig().shards
    writes = "catalog tables, Spark's Delta writer" if profile == "cluster" else "path tables, delta-rs"
    print(
        f"fraudrules bench, profile {profile}, on {os.cpu_count()} cores (local[2], {shards} shards, {writes}, "
        f"RocksDB state store), {EVENTS} event schema"
        f"{', rules from a Delta rules table (change feed)' if RULES_TABLE else ''}, {time.strftime('%Y-%m-%d')}",
        flush=True,
    )
    if profile == "cluster":
        os.environ[UPSTREAM_ENV] = "1"  # set before the JVM starts: its Python workers inherit it
    if mode in ("all", "throughput", "latency"):
        bench(root, mode, count, rate, seconds, profile)
    if mode == "scale":
        print("\n".join(scale(root, profile)), flush=True)
    if mode == "cpu":
        print("\n".join(cpu(root, count, profile)), flush=True)
    if mode == "soak":
        from tools import soak

        if not soak.soak(os.path.join(root, "soak"), minutes, rate, every, maintain_every, dq_minutes):
            raise SystemExit("soak: the alerts received, the alerts table and the backtest differ")
    if mode == "kafka":
        runs = kafka_mode(root, rates or [rate], warmup, seconds, profile, preload)
        if rates:
            print(highest_sustained(runs), flush=True)


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
        choices=["all", "throughput", "latency", "scale", "kafka", "cpu", "soak"],
        default="all",
        help="all: throughput and latency; scale: whole backtests of 1M and 5M records in one file; kafka: "
        "`fraudrules run` on a local broker, alerts timed from the producer's send to the consumer's receive; "
        "cpu: where the CPU of a whole backtest of --count transactions goes, by process and JVM thread; soak: "
        "the job on Kafka at --rate for --minutes with its table maintenance on (tools/soak.py)",
    )
    p.add_argument("--minutes", type=float, default=90.0, help="soak mode: how long the job is fed")
    p.add_argument("--every", type=float, default=5.0, help="soak mode: a line of figures every this many minutes")
    p.add_argument(
        "--maintain-every", type=float, default=30.0, help="soak mode: `fraudrules maintain` this often (minutes)"
    )
    p.add_argument(
        "--dq-minutes", type=float, default=15.0, help="soak mode: the data-quality run at the end is stopped after"
    )
    p.add_argument("--profile", choices=PROFILES, default="local", help="local: a laptop's; cluster: the bundle's")
    p.add_argument("--count", type=int, default=200_000, help="transactions of the throughput and cpu modes")
    p.add_argument("--rate", type=float, default=1_000.0, help="transactions/s of the latency and kafka modes")
    p.add_argument(
        "--rates",
        type=_rates,
        help="kafka mode: these rates in turn (e.g. 1000,2000,5000), a fresh job each, then the highest one with "
        f"p99 <= {SUSTAINED_P99_MS / 1000:g} s",
    )
    p.add_argument("--seconds", type=float, default=60.0, help="measured seconds of the latency and kafka modes")
    p.add_argument("--warmup", type=float, default=40.0, help="kafka mode: seconds of input not measured first")
    p.add_argument(
        "--events", choices=sorted(EVENT_KINDS), default="default", help="the events' schema, workload and rules"
    )
    p.add_argument(
        "--preload-hours",
        type=float,
        default=0.0,
        help="kafka mode: first this many hours of event time as a backlog the job drains, with every rule's "
        "window that long (long-lived state under the live input)",
    )
    p.add_argument("--preload-rate", type=float, default=50.0, help="transactions/s of event time of the preload")
    p.add_argument(
        "--rules-table",
        action="store_true",
        help="kafka and soak modes: the job's rules from a Delta rules table it follows through its change feed",
    )
    a = p.parse_args(argv)
    global EVENTS, RULES_TABLE
    EVENTS, RULES_TABLE = a.events, a.rules_table
    if a.rules_table and a.mode not in ("kafka", "soak"):
        p.error("--rules-table is for --mode kafka or soak")
    if a.rates and a.mode != "kafka":
        p.error("--rates is for --mode kafka")
    if a.preload_hours and a.mode != "kafka":
        p.error("--preload-hours is for --mode kafka")
    if a.preload_hours < 0 or a.preload_rate <= 0:
        p.error("--preload-hours must be >= 0 and --preload-rate > 0")
    preload = Preload(a.preload_hours, a.preload_rate) if a.preload_hours else None
    if min(a.minutes, a.every, a.maintain_every, a.dq_minutes) <= 0:
        p.error("--minutes, --every, --maintain-every and --dq-minutes must be positive")
    main(
        a.data_dir,
        a.mode,
        a.count,
        a.rate,
        a.seconds,
        a.profile,
        a.rates,
        a.warmup,
        preload,
        a.minutes,
        a.every,
        a.maintain_every,
        a.dq_minutes,
    )
    return 0


def _rates(text: str) -> list[float]:
    """`--rates 1000,2000,5000`: positive numbers."""
    try:
        rates = [float(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of rates") from None
    if not rates or min(rates) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: rates must be positive")
    return rates


if __name__ == "__main__":
    sys.exit(cli())
