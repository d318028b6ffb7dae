"""The stateful queries' foreachBatch sink: a micro-batch's processor output as alerts, late events, shadow hits,
the batch heartbeat and first evaluations of rule versions.

The output is collected once (that one Spark job runs the whole micro-batch). Alerts go to consumers straight away:
the Kafka alerts topic through the publisher (`engine/publisher.py`: on its own thread, at-least-once, keyed by
alertId for consumers to de-duplicate), and the console. Every row bound for Delta is written to the query's outbox
before the micro-batch ends; the committer appends it to Delta.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame

from fraudrules.engine import outbox, progress
from fraudrules.engine.committer import Committer
from fraudrules.engine.outbox import EXACT_INTS, OUTBOX
from fraudrules.engine.progress import Printer
from fraudrules.engine.publisher import Publisher
from fraudrules.rules.model import LOGIN_RULE


def _rule_fields(rule_json: str) -> dict:
    """Alert columns describing the rule that fired, from the rule version's JSON."""
    r = json.loads(rule_json)
    if r.get("ruleType") == LOGIN_RULE:
        return {
            "groupingKeyNames": ["userId"],
            "aggregateFieldName": "failedLogins",
            "aggregatorFunctionType": "COUNT",
            "limitOperatorType": "GREATER_EQUAL",
            "limit": str(r["minFailures"]),
            "windowMinutes": int(r["windowMinutes"]),
        }
    return {
        "groupingKeyNames": r["groupingKeyNames"],
        "aggregateFieldName": r["aggregateFieldName"],
        "aggregatorFunctionType": r["aggregatorFunctionType"],
        "limitOperatorType": r["limitOperatorType"],
        "limit": str(r["limit"]),
        "windowMinutes": int(r["windowMinutes"]),
    }


def alert_rows(out: pd.DataFrame, batch_id: int, published_ms: int, kind: str = "alert") -> pd.DataFrame:
    """The processor's alert rows (or with kind "shadow", the SHADOW rules' hits) as rows of the alerts
    table (outbox form)."""
    a = out[out["kind"] == kind].reset_index(drop=True)
    if a.empty:
        return pd.DataFrame(columns=OUTBOX["alerts"].names)
    codes, rules = pd.factorize(a["rule"])  # each rule version's JSON parsed once, not once per alert
    fields = pd.DataFrame([_rule_fields(r) for r in rules]).take(codes).reset_index(drop=True)
    login = a["transactionId"].isna()
    rule, text = (
        a["ruleId"].astype("string"),
        {c: a[c].astype("string").fillna("") for c in ("transactionId", "userId")},
    )
    window_id = rule + ":" + text["transactionId"]
    login_id = rule + ":u" + text["userId"] + ":" + a["eventTime"].astype("string")
    return pd.concat([a.drop(columns=["rule"]), fields], axis=1).assign(
        alertId=np.where(login, login_id, window_id),
        kind=np.where(login, LOGIN_RULE, "WINDOW"),
        eventTimeMs=a["eventTime"],
        producedAtMs=a["producedAt"],
        publishedAtMs=published_ms,
        watermarkMs=a["watermark"],
        batchId=batch_id,
    )


def shadow_rows(out: pd.DataFrame, batch_id: int, now_ms: int) -> pd.DataFrame:
    """The SHADOW rules' hits as rows of `shadow_alerts`: alert columns plus the live rule shadowed."""
    shadow_of = [json.loads(r).get("shadowOf") for r in out.loc[out["kind"] == "shadow", "rule"]]
    return alert_rows(out, batch_id, now_ms, kind="shadow").assign(shadowOf=pd.array(shadow_of, dtype="Int32"))


def late_rows(out: pd.DataFrame, batch_id: int, now_ms: int) -> pd.DataFrame:
    late = out[out["kind"] == "late"]
    return late.assign(
        kind=np.where(late["transactionId"].isna(), "login", "transaction"),
        eventTimeMs=late["eventTime"],
        watermarkMs=late["watermark"],
        detectedAtMs=now_ms,
        batchId=batch_id,
    )


def _percentiles(latency: np.ndarray) -> tuple[float | None, float | None, float | None]:
    if len(latency) == 0:
        return None, None, None
    return float(np.percentile(latency, 50)), float(np.percentile(latency, 99)), float(latency.max())


def _shard_totals(stats: list[dict]) -> dict:
    """Heartbeat columns from the shards' stats rows: sums, and the slowest shard's Python time by stage."""
    slowest = max(stats, key=lambda s: sum(s["ms"].values()), default=None)
    return {
        "retainedEvents": sum(s.get("retained", 0) for s in stats),
        "chunks": sum(s.get("chunks", 0) for s in stats),
        "chunksFromStore": sum(s.get("chunksFromStore", 0) for s in stats),
        "transactions": max((s.get("transactions", 0) for s in stats), default=0),  # every shard gets them all
        "logins": max((s.get("logins", 0) for s in stats), default=0),
        "pythonMs": sum(slowest["ms"].values()) if slowest else None,
        "pythonStages": json.dumps(slowest["ms"]) if slowest else None,
    }


class ResultSink:
    """foreachBatch target of a stateful query: hand the batch's alerts to the publisher, its rows to the outbox."""

    def __init__(self, committer: Committer, printer: Printer | None = progress.say, show: int = 5):
        self.committer, self.printer, self.show = committer, printer, show
        self.publisher: Publisher | None = committer.publisher
        self.query = committer.query

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        if self.committer.error is not None:
            raise RuntimeError(f"committing {self.query}'s results to Delta failed") from self.committer.error
        out = df.toArrow().to_pandas(types_mapper=EXACT_INTS.get)  # ids stay exact integers
        published = int(time.time() * 1000)  # handed to consumers: the publisher and the console
        alerts = alert_rows(out, batch_id, published)
        alert_table = outbox.rows(OUTBOX["alerts"], alerts)
        if self.publisher:
            self.publisher.submit(batch_id, alert_table)
        late = late_rows(out, batch_id, published)
        shadow = shadow_rows(out, batch_id, published)  # SHADOW rules' hits: to Delta only, never published
        measured = alerts["ingestionTimestamp"] > 0
        p50, p99, pmax = _percentiles((published - alerts["ingestionTimestamp"][measured]).to_numpy(np.float64))
        stats = [json.loads(s) for s in out.loc[out["kind"] == "stats", "details"]]
        seen = out[out["kind"] == "rule"]
        heartbeat = {
            "query": self.query,
            "batchId": batch_id,
            "committedAtMs": published,
            "inputRows": int(pd.to_numeric(seen["aggregate"]).sum()),
            "alerts": len(alerts),
            "lateEvents": len(late),
            "watermarkMs": int(out["watermark"].max()) if len(out) and out["watermark"].notna().any() else None,
            "latencyP50Ms": p50,
            "latencyP99Ms": p99,
            "latencyMaxMs": pmax,
            **_shard_totals(stats),
        }
        rule_seen = seen.assign(firstMs=seen["producedAt"], batchId=batch_id)
        self.committer.outbox.put(
            batch_id,
            {
                "alerts": alert_table,
                "shadow_alerts": outbox.rows(OUTBOX["shadow_alerts"], shadow),
                "late_events": outbox.rows(OUTBOX["late_events"], late),
                "batches": outbox.rows(OUTBOX["batches"], pd.DataFrame([heartbeat])),
                "rule_seen": outbox.rows(OUTBOX["rule_seen"], rule_seen),
            },
        )
        self.committer.wake.set()
        if self.printer:
            for line in progress.batch_lines(self.query, batch_id, heartbeat, alerts, self.show):
                self.printer(line)
