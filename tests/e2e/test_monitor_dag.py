"""`dag.test()` of fraud_stream against a real local job: a hung job (frozen, heartbeat stale) is restarted,
a killed one is started again, and the DAG never waits for the continuous job."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from fraudrules import monitor

from tests.airflow_support import dag_test, needs_airflow

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.spark,
    needs_airflow,
    pytest.mark.skipif(shutil.which("java") is None, reason="needs a JVM"),
]

RATE = 20  # transactions per second: enough for a batch every few seconds, little CPU
STALE_AFTER_S = 5


def _pids(data_dir: Path) -> list[int]:
    path = monitor.run_dir(str(data_dir)) / monitor.RESTARTS_FILE
    return [json.loads(line)["pid"] for line in path.read_text().splitlines()] if path.exists() else []


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@pytest.fixture
def job_dir(tmp_path):
    """A data dir whose job processes (every one started during the test) are all gone afterwards."""
    data_dir = tmp_path / "data"
    yield data_dir
    monitor.stop(str(data_dir), timeout_s=20)
    for pid in _pids(data_dir):  # each leads its own process group (its JVM included)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGCONT)
            os.killpg(pid, signal.SIGKILL)


def test_stream_dag_restarts_a_hung_job_and_starts_a_dead_one(job_dir):
    conf = {
        "target": "local",
        "data_dir": str(job_dir),
        "rate": RATE,
        "stale_after_s": STALE_AFTER_S,
        "startup_grace_s": 240,
        "job_args": ["--trigger-seconds", "1"],
    }
    first = monitor.start(str(job_dir), rate=RATE, extra_args=["--trigger-seconds", "1"])
    assert first["started"]

    def committed() -> bool:
        if not monitor.process(str(job_dir))["alive"]:
            log = (monitor.run_dir(str(job_dir)) / monitor.LOG_FILE).read_text(errors="replace")
            raise AssertionError(f"the job died:\n{log[-4000:]}")
        return monitor.heartbeat(str(job_dir))["last_batch_id"] is not None

    _wait(committed, 240, "a first batch")
    healthy = monitor.status(str(job_dir))
    assert healthy["action"] == "none" and healthy["flags"]["running"], healthy

    # Hung: the whole job frozen, so no batch commits while its process lives on.
    os.killpg(first["pid"], signal.SIGSTOP)
    time.sleep(STALE_AFTER_S + 2)
    out, log = dag_test("fraud_stream", conf)
    assert out["state"] == "success", log[-6000:]
    health = out["xcom"]["probe.return_value"]
    assert health["flags"]["running"] and health["flags"]["stale_heartbeat"], health
    assert health["action"] == "restart" and "stale heartbeat" in health["reason"]
    done = out["xcom"]["heal.return_value"]
    assert done["action"] == "restart" and done["started"] and done["stopped"]["pid"] == first["pid"]
    second = done["pid"]
    assert second != first["pid"]
    assert not monitor._alive(first["pid"]), "the hung job was not stopped"
    assert monitor.process(str(job_dir))["alive"] and monitor.process(str(job_dir))["pid"] == second

    # Dead: killed outright; the next run starts it again (without waiting for it to do anything).
    os.killpg(second, signal.SIGKILL)
    _wait(lambda: not monitor._alive(second), 30, "the killed job to disappear")
    started = time.time()
    out, log = dag_test("fraud_stream", conf)
    assert out["state"] == "success", log[-6000:]
    health = out["xcom"]["probe.return_value"]
    assert health["flags"]["dead"] and not health["flags"]["running"], health
    assert health["action"] == "start"
    done = out["xcom"]["heal.return_value"]
    assert done["action"] == "start" and done["started"]
    third = done["pid"]
    assert third not in (first["pid"], second) and monitor._alive(third)
    assert out["xcom"]["assess.return_value"]["action"] == "start"
    assert time.time() - started < 120, "the DAG waited for the job"
    reasons = [json.loads(line)["reason"] for line in (monitor.run_dir(str(job_dir)) / "restarts.jsonl").open()]
    assert reasons[1].startswith("stale heartbeat") and reasons[2] == f"process {second} is not running"

    stopped = monitor.stop(str(job_dir), timeout_s=30)
    assert stopped["stopped"] and not monitor._alive(third)
