"""`make demo-rules`: the rules lifecycle on a running job, with the measured rule-apply delay."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

from fraudrules import tables
from fraudrules.config import JobConfig
from fraudrules.engine import job
from fraudrules.generator import RateWriter, Workload
from fraudrules.session import get_spark

RULE = {
    "ruleId": 42,
    "ruleState": "ACTIVE",
    "groupingKeyNames": ["payeeId"],
    "aggregateFieldName": "paymentAmount",
    "aggregatorFunctionType": "SUM",
    "limitOperatorType": "GREATER",
    "limit": "300",
    "windowMinutes": 1,
}
STEPS = [
    ("add rule 42: SUM(paymentAmount) by payee over 1 min > 300", RULE),
    ("pause it", {**RULE, "ruleState": "PAUSE"}),
    ("activate it again", RULE),
    ("raise its limit to 600", {**RULE, "limit": "600"}),
    ("delete it", {**RULE, "limit": "600", "ruleState": "DELETE"}),
]


def _drop(folder: str, name: str, change: object) -> None:
    tmp = os.path.join(os.path.dirname(folder), f".{name}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(change, fh)
    os.replace(tmp, os.path.join(folder, name))


def main(data_dir: str, rate: float = 100.0, step_seconds: float = 12.0) -> int:
    shutil.rmtree(data_dir, ignore_errors=True)
    cfg = JobConfig(data_dir=data_dir)
    spark = get_spark("fraudrules-demo-rules")
    quiet = job.start(spark, cfg, printer=lambda line: line.startswith("[rules]") and print(line, flush=True))
    writer = RateWriter(cfg.landing, Workload(count=10**9, payees=20, seed=5).transactions(), rate=rate, realtime=True)
    writer.start()
    dropped: dict[int, float] = {}  # version -> when its file landed (each step makes the next version)
    try:
        time.sleep(step_seconds)
        for i, (what, change) in enumerate(STEPS):
            print(f"--> {what}", flush=True)
            _drop(cfg.rules_landing, f"change-{i:02d}.json", change)
            dropped[i + 1] = time.time()
            time.sleep(step_seconds)
    finally:
        writer.stop()
        quiet.stop()
    alerts = tables.read(spark, cfg, "alerts").groupBy("ruleId", "ruleVersion").count().orderBy("ruleVersion")
    history = tables.read(spark, cfg, "rule_history").select("ruleId", "version", "ruleState", "ruleJson")
    applied = tables.read(spark, cfg, "rule_applied").select("ruleId", "version", "delayMs", "firstEvaluatedAt")
    report = (
        history.join(alerts.withColumnRenamed("ruleVersion", "version"), ["ruleId", "version"], "left")
        .join(applied, ["ruleId", "version"], "left")
        .orderBy("version")
        .collect()
    )
    # apply delay: from the change's commit to `rule_history` to the first event evaluated under it (the job's
    # own figure, rule_applied.delayMs); from the file: from the file landing, the rules query's wait included
    print(f"\n{'version':>7} {'state':<7} {'limit':>6} {'alerts':>7} {'apply delay':>12} {'from the file':>14}")
    for r in report:
        delay = f"{r.delayMs / 1000:.2f} s" if r.delayMs is not None else "-"
        waited = r.firstEvaluatedAt and r.firstEvaluatedAt.timestamp() - dropped[r.version]
        since_drop = f"{waited:.2f} s" if waited else "-"
        limit = json.loads(r.ruleJson).get("limit", "")
        print(f"{r.version:>7} {r.ruleState:<7} {limit:>6} {r['count'] or 0:>7} {delay:>12} {since_drop:>14}")
    spark.stop()
    return 0


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.demo_rules", description=__doc__)
    p.add_argument("--data-dir", default="data/demo-rules", help="wiped first")
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--step-seconds", type=float, default=12.0)
    a = p.parse_args(argv)
    return main(a.data_dir, a.rate, a.step_seconds)


if __name__ == "__main__":
    sys.exit(cli())
