"""Exactly-once across crashes: the job is SIGKILLed mid-run three times, restarted on its checkpoints,
and its alerts (transactions and logins) must equal a backtest of the same input: none lost, none twice."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fraudrules import event_schema
from tools.support.crash_demo import PRODUCTION_SHARDS, Demo, Report

pytestmark = pytest.mark.e2e


def test_sigkill_and_restart_loses_and_duplicates_nothing(tmp_path, request):
    """As the bundle runs: catalog tables through Spark's Delta writer, 16 shards and state partitions, PySpark's own
    input regrouping. The local path (delta-rs, 2 shards, the vectorized input) is the SQL-edits test's below."""
    root = str(tmp_path / "demo")
    demo = Demo(root, count=400, logins_count=160, per_file=135, seed=11, shards=PRODUCTION_SHARDS, production=True)
    demo.prepare()
    report = Report(kills=demo.crash_loop(kills=3, rng_seed=11, max_steps=1))
    spark = request.getfixturevalue("spark")  # only now: no second Spark while the child runs
    demo.compare(spark, report)
    print(report.summary())
    assert len(report.kills) == 3, report.summary()  # every kill hit a running job
    outcomes = {o.label: o for o in report.outcomes}
    for label in ("transactions", "logins"):
        o = outcomes[label]
        assert o.expected > 0 and o.found == o.expected, o.line()
        assert (o.lost, o.duplicated, o.unexpected, o.different) == (0, 0, 0, 0), o.line()
    assert report.reconciled, "\n".join(report.reconciliation)
    assert report.ok


def test_the_demo_follows_the_event_schema(tmp_path):
    """With the rich schema: rich records (mistyped nested fields first among the bad ones), the rich sample rules
    (a nested key among them), and the schema given to the crashed job and to the backtest alike."""
    ddl = event_schema.builtin_path("rich")
    demo = Demo(root=str(tmp_path / "demo"), count=300, logins_count=10, per_file=100, event_schema=ddl).prepare()
    lines = demo.lines["transactions"]
    assert sum('"merchant": {' in line for line in lines) == 300  # every generated record has its merchant
    assert [json.loads(line).get("merchant") for line in lines if '"merchant": "FR"' in line] == ["FR"]
    assert sum('"items": "many"' in line for line in lines) == 1
    command = demo.child_command()
    assert command[command.index("--event-schema") + 1] == ddl
    assert demo.rules.endswith("sample_rules_rich.json") and demo.backtest_cfg.event_schema == ddl


def test_rules_edited_with_sql_while_the_job_is_killed_apply_once_at_their_positions(tmp_path):
    """`make crash-demo ARGS="--rules-from cdc"` (the Delta rules table; the local path: delta-rs, 2 shards, the
    vectorized input): an admin inserts, updates, disables and deletes a rule with SQL while the job is killed twice;
    each edit is one version, and the alerts (transactions and logins) equal a backtest that applies the changes where
    the job's evaluation did: none lost, none twice."""
    args = ["--rules-from", "cdc", "--data-dir", str(tmp_path / "demo"), "--kills", "2", "--count", "1200"]
    args += ["--logins-count", "200", "--per-file", "150", "--seed", "5"]
    demo = subprocess.run(
        [sys.executable, "-m", "tools.crash_demo", *args],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = demo.stdout + demo.stderr
    assert demo.returncode == 0, out
    assert "RESULT: exactly once, nothing lost" in out, out
    assert "crashes: 2 × SIGKILL, then a run to the end" in out, out
    for label in ("transactions", "logins"):
        (outcome,) = [x for x in out.splitlines() if x.startswith(f"{label} ") and " alerts expected " in x]
        expected, found = re.search(r"alerts expected +(\d+), found +(\d+) ", outcome).groups()
        assert int(expected) > 0 and found == expected, outcome
        assert "lost 0, duplicated 0, unexpected 0, different aggregate 0" in outcome, outcome
    (line,) = [x for x in out.splitlines() if x.startswith("rule 42:")]
    assert "4 SQL edits by the admin, 4 versions in rule_history (v1 ACTIVE at batch" in line, line
    assert "v3 PAUSE at batch" in line and "v4 DELETE at batch" in line and "MISMATCH" not in line, line
