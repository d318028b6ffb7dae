"""`make bench ARGS="--mode soak --minutes M"`: the continuous job as production runs it (`fraudrules run
--no-generator` on Kafka, alerts published to a topic), fed at a steady rate of transactions, and a tenth as many
logins as `make run`'s generator sends (the login detector's state and tables age too), for M minutes with its table
maintenance on (the writers' compaction, and `fraudrules maintain` every `--maintain-every` minutes while it writes,
as the `fraud_maintenance` DAG would). Every `--every` minutes a line: send → alert p50/p99 of the alerts whose events
were sent in those minutes, the job's process-tree memory (PSS: the mean of a sample every 5 s, its JVM and its Python
processes apart, and the largest sample), the alerts and transactions tables' live data files,
bytes and Parquet files on disk, the checkpoint folder's size, and the time of a full read of `alerts` (every row,
through delta-rs). At the end: the time of the data-quality run, `fraudrules maintain` on the data dir, and the check
that the alerts received equal the alerts table and a backtest of the same input (the transactions and logins read
back from their topics).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np

from fraudrules.config import EVALUATE_QUERY, JobConfig
from fraudrules.generator import TRANSACTIONS_PER_LOGIN, KafkaRateWriter, LoginWorkload
from tools import bench, cpu_profile

MIB = 2**20
MEMORY_SAMPLE_S = 5.0


class MemorySamples(threading.Thread):
    """The job's process-tree PSS every MEMORY_SAMPLE_S seconds, split into its JVM and its Python processes (the
    driver and Spark's Python workers): an interval's mean says where memory stands, one sample only where the JVM's
    collector happened to be."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.samples, self._halt = pid, [], threading.Event()  # (time, JVM PSS, Python PSS)

    def run(self) -> None:
        while not self._halt.wait(MEMORY_SAMPLE_S):
            jvm = python = 0
            for pid in cpu_profile.process_tree(self.pid):
                pss = _pss(pid)
                if _command(pid) == "java":
                    jvm += pss
                else:
                    python += pss
            self.samples.append((time.time(), jvm, python))

    def stop(self) -> None:
        self._halt.set()

    def between(self, lo: float, hi: float) -> np.ndarray:
        """The samples taken in [lo, hi): rows of (JVM, Python) bytes."""
        rows = [(j, p) for t, j, p in list(self.samples) if lo <= t < hi]
        return np.array(rows, dtype=np.float64).reshape(-1, 2)


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            return next((int(line.split()[1]) * 1024 for line in fh if line.startswith("Pss:")), 0)
    except (OSError, ValueError, IndexError):
        return 0


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


@dataclass
class Interval:
    """One reporting interval's figures."""

    start_min: float
    end_min: float
    latencies: np.ndarray
    memory: np.ndarray  # rows of (JVM PSS, Python PSS), bytes, one per sample
    tables: dict[str, tuple[int, int, int]]  # table -> live files, bytes, Parquet files on disk
    checkpoints: int
    read_s: float
    read_rows: int

    def line(self) -> str:
        lat = bench._percentiles(self.latencies) if len(self.latencies) else "no alerts"
        shapes = "; ".join(
            f"{name} {files:,} files ({disk:,} on disk) {size / MIB:,.1f} MiB"
            for name, (files, size, disk) in self.tables.items()
        )
        return (
            f"  min {self.start_min:3.0f}-{self.end_min:<3.0f} {len(self.latencies):>8,} alerts: send → alert {lat}; "
            f"job {self.memory_text()}; {shapes}; checkpoints {self.checkpoints / MIB:,.1f} MiB; "
            f"full read of alerts {self.read_s:.2f} s ({self.read_rows:,} rows)"
        )

    def memory_text(self) -> str:
        if not len(self.memory):
            return "PSS not sampled"
        jvm, python = self.memory.mean(axis=0) / MIB
        peak = self.memory.sum(axis=1).max() / MIB
        return f"PSS mean {jvm + python:,.0f} MiB (JVM {jvm:,.0f}, Python {python:,.0f}), max {peak:,.0f} MiB"


def folder_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile (the job's own cleanup)
                total += os.path.getsize(os.path.join(root, name))
    return total


def table_shape(path: str) -> tuple[int, int, int]:
    """Live data files and bytes (the snapshot a reader opens), and the Parquet files on disk (VACUUM removes the
    others once they are older than the retention)."""
    from deltalake import DeltaTable

    from fraudrules.tables import file_sizes

    sizes = file_sizes(DeltaTable(path)).to_pylist()
    on_disk = sum(1 for f in os.listdir(path) if f.endswith(".parquet"))
    return len(sizes), int(sum(sizes)), on_disk


def full_read(path: str) -> tuple[float, int]:
    """Seconds to read every row of a table (all columns) through delta-rs, and the rows."""
    from deltalake import DeltaTable

    started = time.monotonic()
    rows = DeltaTable(path).to_pyarrow_table().num_rows
    return time.monotonic() - started, rows


def soak(root: str, minutes: float, rate: float, every_min: float, maintain_every_min: float, dq_min: float) -> bool:
    """The soak run; True when the alerts received, the alerts table and the backtest agree."""
    from tools.support.kafka_broker import TopicTail, create_topics, end_offsets, start_local_broker

    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    broker = start_local_broker(os.path.join(root, "kafka"))
    data_dir = os.path.join(root, "soak")
    cfg = JobConfig(data_dir=data_dir)
    topics = {kind: f"soak-{kind}" for kind in bench.KAFKA_KINDS}
    create_topics(broker.bootstrap, list(topics.values()))
    received: dict[str, tuple[int, int]] = {}  # alertId -> (send stamp, receive time)
    copies = [0]

    def on_alert(msg, received_ms: int) -> None:
        row = json.loads(msg.value())
        if row["alertId"] in received:
            copies[0] += 1
        else:
            received[row["alertId"]] = (row.get("ingestionTimestamp") or -1, received_ms)

    log_path = os.path.join(root, "job.log")
    rules = str(bench.EVENT_KINDS[bench.EVENTS][2])
    child = bench._spawn_job(bench.kafka_command(broker.bootstrap, data_dir, topics, "local", rules), log_path, "local")
    tail = TopicTail(broker.bootstrap, topics["alerts"], on_alert)
    tail.start()
    memory = MemorySamples(child.pid)
    memory.start()
    writers: list[KafkaRateWriter] = []
    checkpoint = cfg.checkpoint(EVALUATE_QUERY)
    print(
        f"soak: {rate:,.0f} tx/s and {rate / TRANSACTIONS_PER_LOGIN:,.0f} logins/s for {minutes:g} minutes, "
        f"a line every {every_min:g} minutes, `fraudrules maintain` every {maintain_every_min:g} minutes "
        f"(job log {log_path})",
        flush=True,
    )
    try:
        bench._wait_for_line(child, log_path, bench.STARTED_LINE)
        events = bench.workload(count=10**9, seed=99, first_id=10**9, events_per_second=rate).transactions()
        login_rate = rate / TRANSACTIONS_PER_LOGIN
        logins = LoginWorkload(count=10**9, seed=99, events_per_second=login_rate, attack_every=200).events()
        for kind, stream, r in (("transactions", events, rate), ("logins", logins, login_rate)):
            writers.append(KafkaRateWriter(broker.bootstrap, topics[kind], stream, r, tick_s=bench.KAFKA_TICK_S))
            writers[-1].start()
        started = time.time()
        next_maintain = started + maintain_every_min * 60
        for k in range(1, int(np.ceil(minutes / every_min)) + 1):
            end = started + min(k * every_min, minutes) * 60
            while time.time() < end:
                bench._watch(child, log_path, tail, min(end, next_maintain))
                if time.time() >= next_maintain and time.time() < end:
                    print("\n".join(f"    {line}" for line in maintain(data_dir)), flush=True)
                    next_maintain += maintain_every_min * 60
            lo, hi = started + (k - 1) * every_min * 60, end
            print(interval(data_dir, checkpoint, memory.between(lo, hi), received, lo, hi, started).line(), flush=True)
        _stop(writers)
        sent = sum(end_offsets(broker.bootstrap, topics["transactions"]).values())
        reached = bench._watch(
            child,
            log_path,
            tail,
            time.time() + 300,
            until=lambda: bench.committed_offsets(checkpoint, topics["transactions"]) >= sent,
        )
        last = bench._last_batch(checkpoint)
        bench._watch(child, log_path, tail, time.time() + 60, until=lambda: bench._published_batch(checkpoint) >= last)
        ends = end_offsets(broker.bootstrap, topics["alerts"])
        bench._watch(child, log_path, tail, time.time() + 60, until=lambda: tail.caught_up(ends))
        print(f"  {sent:,} transactions sent; the job evaluated all of them: {reached}", flush=True)
    finally:
        _stop(writers)
        tail.stop()
        memory.stop()
        bench._stop_job(child)
    try:
        return finish(root, data_dir, broker.bootstrap, topics, rules, received, copies[0], dq_min)
    finally:
        broker.stop()


def _stop(writers: list[KafkaRateWriter]) -> None:
    for writer in writers:
        writer.stop()
        writer.join()


def interval(
    data_dir: str,
    checkpoint: str,
    memory: np.ndarray,
    received: dict[str, tuple[int, int]],
    lo: float,
    hi: float,
    started: float,
) -> Interval:
    stamps = np.array(list(received.values()), dtype=np.int64).reshape(-1, 2)
    chosen = (stamps[:, 0] >= lo * 1000) & (stamps[:, 0] < hi * 1000)
    tables_dir = os.path.join(data_dir, "tables")
    read_s, rows = full_read(os.path.join(tables_dir, "alerts"))
    return Interval(
        (lo - started) / 60,
        (hi - started) / 60,
        (stamps[chosen, 1] - stamps[chosen, 0]).astype(np.float64),
        memory,
        {name: table_shape(os.path.join(tables_dir, name)) for name in ("alerts", "transactions")},
        folder_bytes(os.path.dirname(checkpoint)),
        read_s,
        rows,
    )


def _fraudrules(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "fraudrules.cli", *args]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        return subprocess.CompletedProcess(command, -1, str(err.stdout or ""), f"timed out after {timeout:.0f} s")


def maintain(data_dir: str) -> list[str]:
    """`fraudrules maintain` on the running job's tables: its output, and its time."""
    started = time.monotonic()
    done = _fraudrules("maintain", "--data-dir", data_dir)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return [*lines, f"(fraudrules maintain: exit {done.returncode}, {time.monotonic() - started:.1f} s)"]


def finish(
    root: str,
    data_dir: str,
    bootstrap: str,
    topics: dict[str, str],
    rules: str,
    received: dict,
    copies: int,
    dq_min: float,
) -> bool:
    """The checks at the end: data quality, maintenance, alerts received = table = backtest."""
    started = time.monotonic()
    dq = _fraudrules("quality", "--data-dir", data_dir, "--max-age-minutes", "1440", timeout=dq_min * 60)
    print(f"  data-quality run: exit {dq.returncode} in {time.monotonic() - started:.1f} s", flush=True)
    print("\n".join(f"    {line}" for line in (dq.stdout + dq.stderr).strip().splitlines()[-12:]), flush=True)
    print("  fraudrules maintain at the end:", flush=True)
    print("\n".join(f"    {line}" for line in maintain(data_dir)), flush=True)
    from deltalake import DeltaTable

    table_ids = DeltaTable(os.path.join(data_dir, "tables", "alerts")).to_pyarrow_table(columns=["alertId"])
    in_table = table_ids.column("alertId").to_pylist()
    backtested = backtest(root, bootstrap, topics, rules)
    same = set(received) == set(in_table) == backtested and len(in_table) == len(set(in_table))
    print(
        f"  alerts: {len(received):,} received ({copies:,} received again: the topic is at-least-once), "
        f"{len(in_table):,} in the alerts table ({len(in_table) - len(set(in_table)):,} duplicated), "
        f"{len(backtested):,} in a backtest of the same input: {'EQUAL' if same else 'DIFFERENT'}",
        flush=True,
    )
    return same


def backtest(root: str, bootstrap: str, topics: dict[str, str], rules: str) -> set[str]:
    """The alert ids of `fraudrules backtest` over every transaction and login of the topics, in topic order."""
    source = os.path.join(root, "input")
    counts = {kind: _dump(bootstrap, topics[kind], os.path.join(source, kind)) for kind in ("transactions", "logins")}
    alerts = os.path.join(root, "backtest-alerts.jsonl")
    started = time.monotonic()
    inputs = [arg for kind in counts for arg in (f"--{kind}", os.path.join(source, kind))]
    done = _fraudrules("backtest", *inputs, "--rules", rules, "--out", alerts)
    print(
        f"  backtest of the {counts['transactions']:,} transactions and {counts['logins']:,} logins: "
        f"exit {done.returncode} in {time.monotonic() - started:.0f} s"
    )
    if done.returncode:
        print(done.stdout[-2000:] + done.stderr[-2000:], flush=True)
        return set()
    with open(alerts, encoding="utf-8") as fh:
        return {json.loads(line)["alertId"] for line in fh}


def _dump(bootstrap: str, topic: str, folder: str) -> int:
    """Every message of `topic`, partition by partition in offset order, as JSON lines in `folder`; how many."""
    from confluent_kafka import TopicPartition

    from tools.support.kafka_broker import _reader, end_offsets

    os.makedirs(folder, exist_ok=True)
    ends = end_offsets(bootstrap, topic)
    consumer = _reader(bootstrap)
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    left, n, deadline = sum(ends.values()), 0, time.monotonic() + 1_800
    with open(os.path.join(folder, "events.jsonl"), "wb") as out:
        while n < left and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, timeout=5):
                if msg.error() is None:
                    out.write(msg.value() + b"\n")
                    n += 1
    consumer.close()
    return n
