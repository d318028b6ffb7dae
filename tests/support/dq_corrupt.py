"""Copy a data dir produced by a real run and corrupt the copy, one way per suite (run with the job environment's
python):

    python -m tests.support.dq_corrupt SRC_DATA_DIR DST_DATA_DIR

- alerts: one alert's aggregate moved to the wrong side of its limit;
- shadow_alerts: the same for one shadow alert;
- transactions: one bronze row appended again (duplicate transactionId) with a payment type the event schema does
  not declare;
- window_state: the bronze row of an old retained event deleted (an entry no transaction keys), and bronze's
  newest 5 s of transactions deleted as well, as when its ingest, which runs every few seconds, is behind the
  evaluation (after a clean stop, say): entries of those are not yet expected to be keyed, so only the old
  event's entries fail;
- logins: one row appended again (the same record twice) and one with an IP address that is none;
- quarantine: one reason no parser gives;
- late_events: a "late" event that is not behind its watermark;
- rules (behind the engine's back, no rule_history entry): rule 3's window shrunk from 60 to 1 minute, so the
  state it retains is older than its window plus lateness (window_state); rule 2 paused, so its retained state
  belongs to no active rule (window_state); login rule 100 paused, so its open sequences belong to no active
  detector rule (login_state); and the rules table no longer is rule_history's newest version (rules).
"""

from __future__ import annotations

import json
import shutil
import sys

STALE_RULE, PAUSED_RULE, LOGIN_RULE = 3, 2, 100
BRONZE_BEHIND_MS = 5_000


def corrupt(src: str, dst: str) -> dict:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from fraudrules import tables
    from fraudrules.config import JobConfig
    from fraudrules.ops import state_reader
    from fraudrules.session import get_spark

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("run", "dq", "airflow"))
    cfg = JobConfig(data_dir=dst)
    spark = get_spark("dq-corrupt", short_lived=True)

    def rewrite_rule(rule_id: int, **changes) -> None:
        rule = tables.read(spark, cfg, "rules").where(f"ruleId = {rule_id}").first()
        text = json.dumps(json.loads(rule.ruleJson) | changes)
        columns = {"windowMinutes": F.lit(changes["windowMinutes"])} if "windowMinutes" in changes else {}
        if "windowMinutes" in changes:
            columns["windowMs"] = F.lit(changes["windowMinutes"] * 60_000).cast("long")
        if "ruleState" in changes:
            columns["ruleState"] = F.lit(changes["ruleState"])
        rules = DeltaTable.forPath(spark, cfg.table("rules"))
        rules.update(condition=F.col("ruleId") == rule_id, set={**columns, "ruleJson": F.lit(text)})

    try:

        def wrong_side(table: str):
            alert = (
                tables.read(spark, cfg, table)
                .where("limitOperatorType IN ('GREATER', 'GREATER_EQUAL', 'LESS', 'LESS_EQUAL')")
                .orderBy("alertId")
                .first()
            )
            below = "limit - 1" if alert.limitOperatorType.startswith("GREATER") else "limit + 1"
            DeltaTable.forPath(spark, cfg.table(table)).update(
                condition=F.col("alertId") == alert.alertId, set={"aggregate": F.expr(below)}
            )
            return alert

        alert = wrong_side("alerts")
        wrong_side("shadow_alerts")
        duplicate = tables.read(spark, cfg, "transactions").orderBy("transactionId").limit(1)
        tx_id = duplicate.first().transactionId
        writer = tables.writer(spark, cfg)
        writer.append("transactions", duplicate.withColumn("paymentType", F.lit("BTC")).toArrow())

        newest = int(tables.read(spark, cfg, "transactions").agg(F.max("eventTime")).first()[0])
        retained = state_reader.events(spark, cfg)
        old = retained[(retained["t"] < newest - cfg.lateness_ms - BRONZE_BEHIND_MS) & (retained["tx"] != tx_id)]
        unkeyed = int(old.sort_values(["t", "tx"])["tx"].iloc[0])
        bronze = DeltaTable.forPath(spark, cfg.table("transactions"))
        bronze.delete((F.col("transactionId") == unkeyed) | (F.col("eventTime") > newest - BRONZE_BEHIND_MS))

        login = tables.read(spark, cfg, "logins").orderBy("srcPos").limit(1)
        bad_ip = login.withColumn("ipAddress", F.lit("999.1.2.3")).withColumn("srcPos", F.lit(10**9).cast("long"))
        writer.append("logins", login.unionByName(bad_ip).toArrow())

        DeltaTable.forPath(spark, cfg.table("quarantine")).update(
            condition=F.col("reason") == "missing payeeId", set={"reason": F.lit("payee went fishing")}
        )
        late = spark.createDataFrame(
            [("transaction", tx_id, None, 1, 1, "{}", 2_000, 1_000, "eventTime behind the watermark on arrival", 0)],
            "kind string, transactionId long, userId long, ruleId int, ruleVersion long, key string, "
            "eventTimeMs long, watermarkMs long, reason string, batchId long",
        ).withColumn("detectedAt", F.current_timestamp())
        writer.append("late_events", late.toArrow())

        rewrite_rule(STALE_RULE, windowMinutes=1)
        rewrite_rule(PAUSED_RULE, ruleState="PAUSE")
        rewrite_rule(LOGIN_RULE, ruleState="PAUSE")
        return {
            "alertId": alert.alertId,
            "transactionId": tx_id,
            "rules": [STALE_RULE, PAUSED_RULE, LOGIN_RULE],
            "unkeyedEntries": int((retained["tx"] == unkeyed).sum()),
            "notYetInBronze": int((retained["t"] > newest - BRONZE_BEHIND_MS).sum()),
        }
    finally:
        spark.stop()


if __name__ == "__main__":
    print(json.dumps(corrupt(sys.argv[1], sys.argv[2])))
