"""Health (fraudrules.ops.health), the JVM-free Delta reader and the local supervisor, without Spark: a
hand-written Delta `batches` table and a stand-in job process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fraudrules.compat import delta_log
from fraudrules.config import EVALUATE_QUERY, JobConfig
from fraudrules.engine import lines
from fraudrules.ops import health, supervisor
from tests.support.delta_writer import BATCHES, DeltaWriter, batch_row


@pytest.fixture
def data_dir(tmp_path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def batches(data_dir) -> DeltaWriter:
    return DeltaWriter(Path(JobConfig(data_dir=str(data_dir)).table("batches")))


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
        argv = argv or ["python", "-m", "fraudrules.cli", "run", "--rate", "0"]
        health.register(str(data_dir), argv, pid=proc.pid, now=started_at)  # as `fraudrules run` records itself

    yield proc, record
    proc.kill()
    proc.wait()


def test_delta_reader_follows_adds_removes_and_checkpoints(batches, data_dir):
    now = time.time()
    first = batches.append([batch_row(0, now - 30)])
    batches.append([batch_row(1, now - 20), batch_row(1, now - 20, query="ingest")])
    batches.checkpoint()
    batches.append([batch_row(0, now - 30, p99=60.0)], remove=first)  # a rewrite of batch 0's file
    batches.append([])  # an empty file, as Spark writes for an empty partition
    path = JobConfig(data_dir=str(data_dir)).table("batches")
    files, columns = delta_log.delta_snapshot(path)
    assert sorted(f["path"] for f in files) == sorted(batches.live)
    assert columns == BATCHES.names
    df = delta_log.read_delta(path)
    assert sorted(zip(df["query"], df["batchId"], df["latencyP99Ms"], strict=True)) == [
        ("evaluate", 0, 60.0),
        ("evaluate", 1, 50.0),
        ("ingest", 1, 50.0),
    ]
    assert list(delta_log.read_delta(path, ["batchId"], newest_files=1).columns) == ["batchId"]


def test_delta_reader_refuses_what_it_cannot_read(tmp_path):
    table = DeltaWriter(tmp_path / "t")
    name = table.append([batch_row(0, time.time())])
    log = tmp_path / "t" / "_delta_log" / f"{table.version:020d}.json"
    log.write_text(json.dumps({"add": {"path": name, "partitionValues": {}, "deletionVector": {"x": 1}}}) + "\n")
    with pytest.raises(NotImplementedError, match="deletion vectors"):
        delta_log.read_delta(tmp_path / "t")


def test_heartbeat_is_the_newest_evaluate_batch(batches, data_dir):
    now = time.time()
    batches.append([batch_row(i, now - 100 + i, p99=10.0 * i) for i in range(5)])
    batches.append([batch_row(9, now - 1, query="ingest")])
    beat = health.heartbeat(str(data_dir), now=now)
    assert beat["last_batch_id"] == 4 and beat["batches"] == 5
    assert beat["age_s"] == pytest.approx(96, abs=0.01)
    assert beat["watermark_ms"] == 4_000
    assert beat["p99_ms"] == [0.0, 10.0, 20.0, 30.0, 40.0]


def test_status_prints_latencies_rounded_and_creates_nothing(batches, data_dir):
    now = time.time()
    batches.append([batch_row(1, now - 1, p99=2370.9999999999995), batch_row(2, now, p99=12.345678)])
    printed = json.dumps(health.status(str(data_dir), now=now + 0.123456789))
    assert '"p99_ms": [2371.0, 12.3]' in printed and f'"checked_at": {round(now + 0.123456789, 3)}' in printed
    assert sorted(p.name for p in data_dir.iterdir()) == ["tables"]  # no run folder, no remembered status


def test_never_started(data_dir):
    verdict = health.status(str(data_dir))
    assert verdict["action"] == "start" and verdict["reason"] == "never started here"
    assert not verdict["flags"]["dead"] and not verdict["flags"]["running"]


def test_healthy_running_job(batches, data_dir, fake_job):
    _proc, record = fake_job
    now = time.time()
    record(started_at=now - 300)
    batches.append([batch_row(i, now - 20 + i) for i in range(10)])
    verdict = health.status(str(data_dir), now=now)
    assert verdict["action"] == "none" and verdict["flags"]["running"] and verdict["problems"] == []


def test_the_job_records_itself_and_keeps_what_the_supervisor_wrote_about_it(data_dir, fake_job):
    proc, _ = fake_job
    supervised = {"pid": proc.pid, "started_at": 1.0, "argv": ["fraudrules", "run"], "log": "/var/log/job.log"}
    health.write_json(health.run_dir(str(data_dir)) / health.PID_FILE, supervised)
    mine = health.register(str(data_dir), ["fraudrules", "run", "--rate", "5"], pid=proc.pid, now=2.0)
    assert mine == {
        "pid": proc.pid,
        "started_at": 2.0,
        "argv": ["fraudrules", "run", "--rate", "5"],
        "log": supervised["log"],
    }
    assert health.process(str(data_dir))["alive"] and health.process(str(data_dir))["rate"] == 5.0
    other = health.register(str(data_dir), ["fraudrules", "run"], pid=os.getpid())  # another process: no log
    assert other["log"] is None and not health.alive(os.getpid())  # pytest is no `fraudrules run`


def test_hung_job_with_waiting_input_is_restarted_but_an_idle_one_is_not(batches, data_dir, fake_job):
    _proc, record = fake_job
    now = time.time()
    record(started_at=now - 3600)
    batches.append([batch_row(1, now - 600)])
    th = health.Thresholds(stale_after_s=120)
    landing = Path(JobConfig(data_dir=str(data_dir)).landing)
    landing.mkdir(parents=True)
    idle = health.status(str(data_dir), th, now=now)  # no generator, nothing landed: idle, not hung
    assert idle["action"] == "none" and not idle["flags"]["stale_heartbeat"]

    (landing / "new.json").write_text("{}\n")
    hung = health.status(str(data_dir), th, now=now)
    assert hung["flags"]["running"] and hung["flags"]["stale_heartbeat"]
    assert hung["action"] == "restart" and hung["reason"] == "stale heartbeat: last batch 600 s ago"
    assert hung["lag"]["pending_files"] == 1

    record(started_at=now - 3600, argv=["python", "-m", "fraudrules.cli", "run", "--rate", "200"])
    (landing / "new.json").unlink()
    generating = health.status(str(data_dir), th, now=now)  # its own generator should have produced input
    assert generating["action"] == "restart"


def test_fresh_job_gets_a_startup_grace(batches, data_dir, fake_job):
    _proc, record = fake_job
    now = time.time()
    batches.append([batch_row(1, now - 3600)])  # a batch of an earlier process
    record(started_at=now - 30)
    th = health.Thresholds(stale_after_s=10, startup_grace_s=60)
    assert health.status(str(data_dir), th, now=now)["action"] == "none"
    slow = health.status(str(data_dir), th, now=now + 60)
    assert slow["action"] == "restart" and slow["reason"].startswith("no batch committed in")


def test_dead_job(batches, data_dir, fake_job):
    proc, record = fake_job
    now = time.time()
    record(started_at=now - 300)
    batches.append([batch_row(1, now - 200)])
    proc.kill()
    proc.wait()
    verdict = health.status(str(data_dir), health.Thresholds(stale_after_s=120), now=now)
    assert verdict["action"] == "start" and verdict["reason"] == f"process {proc.pid} is not running"
    assert verdict["flags"]["dead"] and verdict["flags"]["stale_heartbeat"]


def test_a_clean_stop_reads_as_stopped_a_crash_as_dead(batches, data_dir, fake_job):
    proc, record = fake_job
    now = time.time()
    record(started_at=now - 300)
    batches.append([batch_row(1, now - 200)])
    assert not health.mark_stopped(str(data_dir), pid=proc.pid + 1)  # another process's stop: not this record
    assert health.mark_stopped(str(data_dir), pid=proc.pid, now=now - 10)  # `fraudrules run` after a clean stop
    proc.kill()
    proc.wait()
    verdict = health.status(str(data_dir), health.Thresholds(stale_after_s=120), now=now)
    assert verdict["action"] == "start" and verdict["reason"] == f"process {proc.pid} stopped cleanly"
    assert verdict["process"]["stopped_at"] == round(now - 10, 3) and verdict["problems"] == []
    flags = verdict["flags"]
    assert flags["stopped"] and not flags["dead"] and not flags["stale_heartbeat"] and not flags["running"]
    record(started_at=now)  # started again, then gone without a clean stop: dead
    crashed = health.status(str(data_dir), health.Thresholds(stale_after_s=120), now=now)
    assert crashed["flags"]["dead"] and not crashed["flags"]["stopped"]
    assert crashed["reason"] == f"process {proc.pid} is not running"


def test_latency_high_and_rising_of_a_running_job(batches, data_dir, fake_job):
    proc, record = fake_job
    now = time.time()
    record(started_at=now - 300)
    batches.append([batch_row(i, now - 20 + i, p99=100.0 if i < 6 else 900.0) for i in range(12)])
    verdict = health.status(str(data_dir), health.Thresholds(p99_ms=500), now=now)
    assert verdict["flags"]["latency_high"] and verdict["flags"]["latency_rising"]
    assert verdict["action"] == "none"  # a restart does not make a slow job fast
    assert any("latency p99 900 ms" in p for p in verdict["problems"])
    # stopped cleanly: its last batches' latency is no problem of now (they may be its first)
    assert health.mark_stopped(str(data_dir), pid=proc.pid, now=now - 1)
    proc.kill()
    proc.wait()
    stopped = health.status(str(data_dir), health.Thresholds(p99_ms=500), now=now)
    assert stopped["flags"]["stopped"] and stopped["problems"] == []
    assert not stopped["flags"]["latency_high"] and not stopped["flags"]["latency_rising"]


def test_lag_from_the_sources_ledger_and_committed_offsets(data_dir):
    cfg = JobConfig(data_dir=str(data_dir))
    landing, checkpoint = Path(cfg.landing), Path(cfg.checkpoint(EVALUATE_QUERY))
    landing.mkdir(parents=True)
    read, partly, unseen = landing / "a.json", landing / "b.json", landing / "c.json"
    for i, path in enumerate((read, partly, unseen)):
        path.write_text('{"x": 1}\n{"x": 2}\n')
        os.utime(path, (1_000 * (i + 1), 1_000 * (i + 1)))
    lines.Ledger(lines.ledger_of(str(checkpoint))).add(lines.list_files(*lines.open_fs(str(landing)))[:2], 0)
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    rules = '{"sourceVersion":1,"reservoirVersion":3,"index":-1,"isStartingVersion":false}'
    meta = '{"batchWatermarkMs":0}'
    (checkpoint / "offsets" / "4").write_text(f'v1\n{meta}\n{{"file":1,"byte":9,"line":1}}\n{rules}\n')
    (checkpoint / "commits" / "4").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    (checkpoint / "offsets" / "5").write_text(f'v1\n{meta}\n{{"file":3,"byte":0,"line":0}}\n{rules}\n')  # not committed
    backlog = health.lag(str(data_dir), now=2_500)
    assert backlog == {"pending_files": 2, "oldest_pending_age_s": 500.0}  # b (half read) and c (not yet seen)


def test_stop_ends_the_process_group(data_dir, fake_job):
    proc, record = fake_job
    record(started_at=time.time())
    stopped = supervisor.stop(str(data_dir), timeout_s=5)
    assert stopped["stopped"] and stopped["pid"] == proc.pid
    assert proc.wait(timeout=10) is not None
    assert supervisor.stop(str(data_dir))["reason"] == "not running"


def test_the_databricks_target_is_judged_by_the_same_rules():
    now = time.time()
    th = health.Thresholds(stale_after_s=120, startup_grace_s=180)
    down = {"launched": True, "alive": False, "down": "no active run of Databricks job 7"}
    stopped = health.judge_facts({"runner": down, "heartbeat": None}, th, now)
    assert stopped["action"] == "start" and stopped["reason"] == "no active run of Databricks job 7"
    assert stopped["flags"]["dead"] and not stopped["flags"]["stale_heartbeat"]  # no warehouse: no heartbeat

    run = {"launched": True, "alive": True, "started_at": now - 3600, "down": "-"}
    hung = {"last_commit_ms": (now - 600) * 1000, "age_s": 600.0, "p99_ms": []}
    verdict = health.judge_facts({"runner": run, "heartbeat": hung}, th, now)
    assert verdict["action"] == "restart" and verdict["reason"] == "stale heartbeat: last batch 600 s ago"

    slow = {"last_commit_ms": (now - 5) * 1000, "age_s": 5.0, "p99_ms": [10.0] * 6 + [9_000.0] * 6}
    verdict = health.judge_facts({"runner": run, "heartbeat": slow}, th, now)
    assert verdict["action"] == "none" and verdict["flags"]["latency_high"] and verdict["flags"]["latency_rising"]


@pytest.mark.parametrize(
    ("argv", "rate"),
    [(["run"], 200.0), (["run", "--rate", "50"], 50.0), (["run", "--no-generator"], 0.0), (["run", "--rate"], 200.0)],
)
def test_generator_rate_of_a_run_command_line(argv, rate):
    assert health.generator_rate(argv) == rate
