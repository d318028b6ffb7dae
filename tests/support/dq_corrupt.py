"""Copy a data dir produced by a real run and corrupt the copy (run with the job environment's python):

    python -m tests.support.dq_corrupt SRC_DATA_DIR DST_DATA_DIR

- alerts: one alert's aggregate moved to the wrong side of its limit;
- transactions: one bronze row appended again (duplicate transactionId);
- rules: rule 3's window shrunk from 60 to 1 minute behind the engine's back (no rule_history entry), so
  the state it retains for that rule is older than its window plus lateness: stale state entries;
- rules: rule 2 paused behind the engine's back, so its retained state belongs to no active rule.
"""

from __future__ import annotations

import json
import shutil
import sys

STALE_RULE, PAUSED_RULE = 3, 2


def corrupt(src: str, dst: str) -> dict:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from fraudrules import tables
    from fraudrules.config import JobConfig
    from fraudrules.session import get_spark

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("run", "dq"))
    cfg = JobConfig(data_dir=dst)
    spark = get_spark("dq-corrupt")
    try:
        alert = (
            tables.read(spark, cfg, "alerts")
            .where("limitOperatorType IN ('GREATER', 'GREATER_EQUAL', 'LESS', 'LESS_EQUAL')")
            .orderBy("alertId")
            .first()
        )
        below = "limit - 1" if alert.limitOperatorType.startswith("GREATER") else "limit + 1"
        DeltaTable.forPath(spark, cfg.table("alerts")).update(
            condition=F.col("alertId") == alert.alertId, set={"aggregate": F.expr(below)}
        )
        duplicate = tables.read(spark, cfg, "transactions").orderBy("transactionId").limit(1)
        tx_id = duplicate.first().transactionId
        tables.append(duplicate, cfg, "transactions")

        rules = DeltaTable.forPath(spark, cfg.table("rules"))
        rule = tables.read(spark, cfg, "rules").where(f"ruleId = {STALE_RULE}").first()
        shrunk = json.loads(rule.ruleJson) | {"windowMinutes": 1}
        rules.update(
            condition=F.col("ruleId") == STALE_RULE,
            set={
                "windowMinutes": F.lit(1),
                "windowMs": F.lit(60_000).cast("long"),
                "ruleJson": F.lit(json.dumps(shrunk)),
            },
        )
        rule = tables.read(spark, cfg, "rules").where(f"ruleId = {PAUSED_RULE}").first()
        paused = json.loads(rule.ruleJson) | {"ruleState": "PAUSE"}
        rules.update(
            condition=F.col("ruleId") == PAUSED_RULE,
            set={"ruleState": F.lit("PAUSE"), "ruleJson": F.lit(json.dumps(paused))},
        )
        return {"alertId": alert.alertId, "transactionId": tx_id, "stale_rule": STALE_RULE, "paused_rule": PAUSED_RULE}
    finally:
        spark.stop()


if __name__ == "__main__":
    print(json.dumps(corrupt(sys.argv[1], sys.argv[2])))
