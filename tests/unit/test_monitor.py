"""fraudrules.monitor without Spark: a hand-written Delta `batches` table, a stand-in job process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fraudrules import monitor

BATCHES = pa.schema(
    [
        ("query", pa.string()),
        ("batchId", pa.int64()),
        ("committedAt", pa.timestamp("us")),
        ("inputRows", pa.int64()),
        ("alerts", pa.int64()),
        ("lateEvents", pa.int64()),
        ("watermarkMs", pa.int64()),
        ("latencyP50Ms", pa.float64()),
        ("latencyP99Ms", pa.float64()),
        ("latencyMaxMs", pa.float64()),
    ]
)
SCHEMA_STRING = json.dumps(
    {
        "type": "struct",
        "fields": [{"name": f.name, "type": "string", "nullable": True, "metadata": {}} for f in BATCHES],
    }
)


def _row(batch_id: int, committed: float, p99: float | None = 50.0, query: str = "evaluate") -> dict:
    return {
        "query": query,
        "batchId": batch_id,
        "committedAt": datetime.fromtimestamp(committed, timezone.utc).replace(tzinfo=None),
        "inputRows": None,
        "alerts": 0,
        "lateEvents": 0,
        "watermarkMs": 1_000 * batch_id,
        "latencyP50Ms": None if p99 is None else p99 / 2,
        "latencyP99Ms": p99,
        "latencyMaxMs": p99,
    }


class DeltaWriter:
    """Just enough of a Delta writer: parquet files plus JSON commits (and optionally a checkpoint)."""

    def __init__(self, path: Path):
        self.path, self.version, self.live = path, 0, {}
        (path / "_delta_log").mkdir(parents=True)
        self._commit(
            [
                {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
                {"metaData": {"id": "t", "format": {"provider": "parquet"}, "schemaString": SCHEMA_STRING}},
            ]
        )

    def _commit(self, actions: list[dict]) -> None:
        log = self.path / "_delta_log" / f"{self.version:020d}.json"
        log.write_text("\n".join(json.dumps(a) for a in actions) + "\n")
        self.version += 1

    def append(self, rows: list[dict], remove: str | None = None) -> str:
        name = f"part-{self.version:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=BATCHES), self.path / name)
        add = {"path": name, "partitionValues": {}, "size": 1, "modificationTime": self.version, "dataChange": True}
        self.live[name] = add
        actions = [{"add": add}]
        if remove:
            actions.append({"remove": {"path": remove, "dataChange": True}})
            self.live.pop(remove)
        self._commit(actions)
        return name

    def checkpoint(self) -> None:
        version = self.version - 1
        add_type = pa.struct(
            [
                ("path", pa.string()),
                ("partitionValues", pa.map_(pa.string(), pa.string())),
                ("size", pa.int64()),
                ("modificationTime", pa.int64()),
                ("dataChange", pa.bool_()),
            ]
        )
        meta_type = pa.struct([("id", pa.string()), ("schemaString", pa.string())])
        adds = [{**a, "partitionValues": []} for a in self.live.values()]
        table = pa.table(
            {
                "add": pa.array([*adds, None], type=add_type),
                "metaData": pa.array([*[None] * len(adds), {"id": "t", "schemaString": SCHEMA_STRING}], meta_type),
            }
        )
        pq.write_table(table, self.path / "_delta_log" / f"{version:020d}.checkpoint.parquet")
        (self.path / "_delta_log" / "_last_checkpoint").write_text(json.dumps({"version": version, "size": 1}))


@pytest.fixture
def data_dir(tmp_path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def batches(data_dir) -> DeltaWriter:
    return DeltaWriter(monitor.table_path(str(data_dir), "batches"))


@pytest.fixture
def fake_job(data_dir):
    """A live process that looks like a `fraudrules run` to the monitor, with its pid file."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "fraudrules.cli", "run", "--rate", "0"],
        start_new_session=True,
    )
    deadline = time.time() + 10
    while b"fraudrules" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes() and time.time() < deadline:
        time.sleep(0.05)  # until exec: before it, the child still shows this process's command line

    def record(started_at: float, argv: list[str] | None = None) -> None:
        run = monitor.run_dir(str(data_dir))
        run.mkdir(parents=True, exist_ok=True)
        argv = argv or ["python", "-m", "fraudrules.cli", "run", "--rate", "0"]
        (run / monitor.PID_FILE).write_text(json.dumps({"pid": proc.pid, "started_at": started_at, "argv": argv}))

    yield proc, record
    proc.kill()
    proc.wait()


def test_delta_reader_follows_adds_removes_and_checkpoints(batches, data_dir):
    now = time.time()
    first = batches.append([_row(0, now - 30)])
    batches.append([_row(1, now - 20), _row(1, now - 20, query="ingest")])
    batches.checkpoint()
    batches.append([_row(0, now - 30, p99=60.0)], remove=first)  # a rewrite of batch 0's file
    batches.append([])  # an empty file, as Spark writes for an empty partition
    path = monitor.table_path(str(data_dir), "batches")
    files, columns = monitor.delta_snapshot(path)
    assert sorted(f["path"] for f in files) == sorted(batches.live)
    assert columns == BATCHES.names
    df = monitor.read_delta(path)
    assert sorted(zip(df["query"], df["batchId"], df["latencyP99Ms"], strict=True)) == [
        ("evaluate", 0, 60.0),
        ("evaluate", 1, 50.0),
        ("ingest", 1, 50.0),
    ]
    assert list(monitor.read_delta(path, ["batchId"], newest_files=1).columns) == ["batchId"]


def test_delta_reader_refuses_what_it_cannot_read(tmp_path):
    table = DeltaWriter(tmp_path / "t")
    name = table.append([_row(0, time.time())])
    log = tmp_path / "t" / "_delta_log" / f"{table.version:020d}.json"
    log.write_text(json.dumps({"add": {"path": name, "partitionValues": {}, "deletionVector": {"x": 1}}}) + "\n")
    with pytest.raises(NotImplementedError, match="deletion vectors"):
        monitor.read_delta(tmp_path / "t")


def test_heartbeat_is_the_newest_evaluate_batch(batches, data_dir):
    now = time.time()
    batches.append([_row(i, now - 100 + i, p99=10.0 * i) for i in range(5)])
    batches.append([_row(9, now - 1, query="ingest")])
    beat = monitor.heartbeat(str(data_dir), now=now)
    assert beat["last_batch_id"] == 4 and beat["batches"] == 5
    assert beat["age_s"] == pytest.approx(96, abs=0.01)
    assert beat["watermark_ms"] == 4_000
    assert beat["p99_ms"] == [0.0, 10.0, 20.0, 30.0, 40.0]


def test_never_started(data_dir):
    health = monitor.status(str(data_dir))
    assert health["action"] == "start" and health["reason"] == "never started here"
    assert not health["flags"]["dead"] and not health["flags"]["running"]


def test_healthy_running_job(batches, data_dir, fake_job):
    _proc, record = fake_job
    now = time.time()
    record(started_at=now - 300)
    batches.append([_row(i, now - 20 + i) for i in range(10)])
    health = monitor.status(str(data_dir), now=now)
    assert health["action"] == "none" and health["flags"]["running"] and health["problems"] == []


def test_hung_job_with_waiting_input_is_restarted_but_an_idle_one_is_not(batches, data_dir, fake_job):
    _proc, record = fake_job
    now = time.time()
    record(started_at=now - 3600)
    batches.append([_row(1, now - 600)])
    th = monitor.Thresholds(stale_after_s=120)
    landing = monitor.landing_dir(str(data_dir))
    landing.mkdir(parents=True)
    idle = monitor.status(str(data_dir), th, now=now)  # no generator, nothing landed: idle, not hung
    assert idle["action"] == "none" and not idle["flags"]["stale_heartbeat"]

    (landing / "new.json").write_text("{}\n")
    hung = monitor.status(str(data_dir), th, now=now)
    assert hung["flags"]["running"] and hung["flags"]["stale_heartbeat"]
    assert hung["action"] == "restart" and hung["reason"] == "stale heartbeat: last batch 600 s ago"
    assert hung["lag"]["pending_files"] == 1

    record(started_at=now - 3600, argv=["python", "-m", "fraudrules.cli", "run", "--rate", "200"])
    (landing / "new.json").unlink()
    generating = monitor.status(str(data_dir), th, now=now)  # its own generator should have produced input
    assert generating["action"] == "restart"


def test_fresh_job_gets_a_startup_grace(batches, data_dir, fake_job):
    _proc, record = fake_job
    now = time.time()
    batches.append([_row(1, now - 3600)])  # a batch of an earlier process
    record(started_at=now - 30)
    th = monitor.Thresholds(stale_after_s=10, startup_grace_s=60)
    assert monitor.status(str(data_dir), th, now=now)["action"] == "none"
    slow = monitor.status(str(data_dir), th, now=now + 60)
    assert slow["action"] == "restart" and slow["reason"].startswith("no batch committed in")


def test_dead_job(batches, data_dir, fake_job):
    proc, record = fake_job
    now = time.time()
    record(started_at=now - 300)
    batches.append([_row(1, now - 200)])
    proc.kill()
    proc.wait()
    health = monitor.status(str(data_dir), monitor.Thresholds(stale_after_s=120), now=now)
    assert health["action"] == "start" and health["reason"] == f"process {proc.pid} is not running"
    assert health["flags"]["dead"] and health["flags"]["stale_heartbeat"]


def test_latency_high_and_rising(batches, data_dir, fake_job):
    _proc, record = fake_job
    now = time.time()
    record(started_at=now - 300)
    batches.append([_row(i, now - 20 + i, p99=100.0 if i < 6 else 900.0) for i in range(12)])
    health = monitor.status(str(data_dir), monitor.Thresholds(p99_ms=500), now=now)
    assert health["flags"]["latency_high"] and health["flags"]["latency_rising"]
    assert health["action"] == "none"  # a restart does not make a slow job fast
    assert any("latency p99 900 ms" in p for p in health["problems"])


def test_lag_from_the_file_source_log(data_dir):
    landing = monitor.landing_dir(str(data_dir))
    landing.mkdir(parents=True)
    old, new = landing / "a.json", landing / "b.json"
    old.write_text("{}\n")
    new.write_text("{}\n")
    os.utime(old, (1_000, 1_000))
    os.utime(new, (2_000, 2_000))
    sources = monitor.checkpoint_dir(str(data_dir)) / "sources" / "0"
    sources.mkdir(parents=True)
    (sources / "0").write_text('v1\n{"path":"file:///x/a.json","timestamp":1000000,"batchId":0}\n')
    backlog = monitor.lag(str(data_dir), now=2_500)
    assert backlog == {"pending_files": 1, "oldest_pending_age_s": 500.0, "newest_taken_ms": 1_000_000}


def test_stop_ends_the_process_group(data_dir, fake_job):
    proc, record = fake_job
    record(started_at=time.time())
    stopped = monitor.stop(str(data_dir), timeout_s=5)
    assert stopped["stopped"] and stopped["pid"] == proc.pid
    assert proc.wait(timeout=10) is not None
    assert monitor.stop(str(data_dir))["reason"] == "not running"
