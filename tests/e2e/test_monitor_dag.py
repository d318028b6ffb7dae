"""`dag.test()` of fraud_stream against a real local job: the job is started detached, commits a batch, is
killed; the DAG run sees it dead with a stale heartbeat, starts it again without waiting for it, succeeds.

(Hung-job detection - alive but not committing while input waits - and the latency/lag flags are covered
without Spark in tests/unit/test_health.py.)"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from fraudrules.config import JobConfig
from fraudrules.generator import Workload, write_jsonl
from fraudrules.ops import health, supervisor
from tests.support.airflow_support import dag_test, needs_airflow

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.spark,
    needs_airflow,
    pytest.mark.skipif(shutil.which("java") is None, reason="needs a JVM"),
]

STALE_AFTER_S = 5
JOB_ARGS = ["--trigger-seconds", "1"]


def _land(data_dir: Path, n: int = 200) -> None:
    """Drop a file of fresh transactions into the job's landing folder (the job runs without its generator)."""
    now = int(time.time() * 1000)
    workload = Workload(count=n, start_ms=now, first_id=now * 1000, burst_every=0)
    write_jsonl(JobConfig(data_dir=str(data_dir)).landing, workload.transactions(), per_file=n, prefix=f"t{now}")


def _pids(data_dir: Path) -> list[int]:
    path = health.run_dir(str(data_dir)) / health.RESTARTS_FILE
    return [json.loads(line)["pid"] for line in path.read_text().splitlines()] if path.exists() else []


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@pytest.fixture
def job_dir(tmp_path):
    """A data dir whose job processes (every one started during the test) are all gone afterwards."""
    data_dir = tmp_path / "data"
    yield data_dir
    supervisor.stop(str(data_dir), timeout_s=10)
    for pid in _pids(data_dir):  # each leads its own process group (its JVM included)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def test_stream_dag_restarts_a_killed_job(job_dir):
    first = supervisor.start(str(job_dir), rate=0, extra_args=JOB_ARGS)
    assert first["started"]
    _land(job_dir)

    def committed() -> bool:
        if not health.process(str(job_dir))["alive"]:
            log = (health.run_dir(str(job_dir)) / health.LOG_FILE).read_text(errors="replace")
            raise AssertionError(f"the job died:\n{log[-4000:]}")
        return health.heartbeat(str(job_dir))["last_batch_id"] is not None

    _wait(committed, 300, "the job's first batch")
    healthy = health.status(str(job_dir))
    assert healthy["action"] == "none" and healthy["flags"]["running"], healthy

    os.killpg(first["pid"], signal.SIGKILL)  # the job and its JVM
    _wait(lambda: not health.alive(first["pid"]), 30, "the killed job to disappear")
    _wait(lambda: health.heartbeat(str(job_dir))["age_s"] > STALE_AFTER_S, 30, "the heartbeat to go stale")

    conf = {
        "target": "local",
        "data_dir": str(job_dir),
        "rate": 0,
        "job_args": JOB_ARGS,
        "stale_after_s": STALE_AFTER_S,
    }
    started = time.time()
    out, log = dag_test("fraud_stream", conf)
    assert out["state"] == "success", log[-6000:]
    assert out["tasks"] == {
        "probe": "success",
        "decide": "success",
        "heal_local": "success",
        "assess": "success",
        "unpause_databricks": "skipped",
        "restart_databricks": "skipped",
        "start_databricks": "skipped",
    }
    probed = out["xcom"]["probe.return_value"]
    assert probed["flags"]["dead"] and probed["flags"]["stale_heartbeat"] and not probed["flags"]["running"]
    assert probed["action"] == "start" and probed["reason"] == f"process {first['pid']} is not running"
    assert any(p.startswith("stale heartbeat") for p in probed["problems"]), probed["problems"]
    done = out["xcom"]["heal_local.return_value"]
    assert done["action"] == "start" and done["started"]
    assert done["pid"] != first["pid"] and health.alive(done["pid"])
    assert health.process(str(job_dir))["pid"] == done["pid"]
    assert out["xcom"]["assess.return_value"] == {
        "healthy": False,
        "action": "start",
        "reason": probed["reason"],
    }
    assert time.time() - started < 180, "the DAG waited for the continuous job"
    assert "running: " in log and "fraudrules.ops.supervisor start" in log  # the job environment's command, streamed
    restarts = [json.loads(line) for line in (health.run_dir(str(job_dir)) / health.RESTARTS_FILE).open()]
    assert [r["reason"] for r in restarts] == ["start", probed["reason"]]

    stopped = supervisor.stop(str(job_dir), timeout_s=30)
    assert stopped["stopped"] and not health.alive(done["pid"])
