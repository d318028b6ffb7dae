"""What a cluster runs, on this machine: a `local-cluster[2,1,1024]` master (two executor JVMs, tasks and their
Python workers outside the driver's JVM), the bundle's 16 shards and state partitions, catalog tables through
Spark's Delta writer, PySpark's own input regrouping. Its alerts equal a local run's, alert for alert."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fraudrules.compat.pyspark import UPSTREAM_ENV
from fraudrules.generator import LoginWorkload, write_jsonl

FIXTURES = Path(__file__).parents[1] / "fixtures"
LOGIN_RULE = {"ruleId": 100, "ruleState": "ACTIVE", "ruleType": "LOGIN_ANOMALY"}

pytestmark = pytest.mark.e2e


def backtest(tmp_path: Path, name: str, *options: str, **env: str) -> dict[str, str]:
    """`fraudrules backtest` of the fixtures and some logins: alertId -> aggregate."""
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([*json.loads((FIXTURES / "rules.json").read_text()), LOGIN_RULE]))
    logins = tmp_path / "logins"
    if not logins.exists():
        write_jsonl(str(logins), LoginWorkload(count=400, seed=3, users=30, attack_every=25).events(), per_file=400)
    out = tmp_path / f"{name}.jsonl"
    command = [sys.executable, "-m", "fraudrules.cli", "backtest"]
    command += ["--transactions", str(FIXTURES / "transactions.jsonl")]
    command += ["--logins", str(logins), "--rules", str(rules), "--out", str(out), "--data-dir", str(tmp_path / name)]
    command += ["--max-records-per-trigger", "500", *options]
    environment = {**os.environ, "PYSPARK_PYTHON": sys.executable, **env}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1200, env=environment, check=False)
    # the error's own lines first: a failed query's message ends with its plan, which fills the tail
    errors = [line for line in proc.stderr.splitlines() if "Error" in line or "Exception" in line][:8]
    assert proc.returncode == 0, "\n".join(errors) + "\n...\n" + proc.stderr[-1500:]
    return {a["alertId"]: str(a["aggregate"]) for a in map(json.loads, out.read_text().splitlines())}


def test_executors_in_other_jvms_with_the_bundles_shards_find_the_same_alerts(tmp_path):
    local = backtest(tmp_path, "local")
    cluster = backtest(
        tmp_path,
        "cluster",
        *("--shards", "16", "--shuffle-partitions", "16", "--catalog", "spark_catalog", "--schema", "fraudrules"),
        FRAUDRULES_MASTER="local-cluster[2,1,1024]",
        **{UPSTREAM_ENV: "1"},
    )
    assert len(local) > 4_000 and any(":u" in alert for alert in local)  # window rules and the login detector
    assert cluster == local
