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
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from fraudrules.engine import progress
from fraudrules.engine.committer import Committer
from fraudrules.engine.outbox import OUTBOX
from fraudrules.engine.progress import Printer
from fraudrules.engine.publisher import Publisher
from fraudrules.rules.model import LOGIN_RULE
from fraudrules.tables import per_distinct


def _rule_fields(rule_json: str) -> dict:
    """Alert columns describing the rule that fired, from the rule version's JSON."""
    r = json.loads(rule_json)
    if r.get("ruleType") == LOGIN_RULE:
        fields = {
            "groupingKeyNames": ["userId"],
            "aggregateFieldName": "failedLogins",
            "aggregatorFunctionType": "COUNT",
            "limitOperatorType": "GREATER_EQUAL",
            "limit": str(r["minFailures"]),
        }
    else:
        fields = {
            "groupingKeyNames": r["groupingKeyNames"],
            "aggregateFieldName": r["aggregateFieldName"],
            "aggregatorFunctionType": r["aggregatorFunctionType"],
            "limitOperatorType": r["limitOperatorType"],
            "limit": str(r["limit"]),
        }
    return fields | {"windowMinutes": int(r["windowMinutes"]), "shadowOf": r.get("shadowOf")}


# The alert columns of `_rule_fields`, typed as the outbox types them.
_RULE_COLS = "groupingKeyNames aggregateFieldName aggregatorFunctionType limitOperatorType limit windowMinutes shadowOf"
_RULE_FIELDS = pa.struct(OUTBOX["shadow_alerts"].field(name) for name in _RULE_COLS.split())


def _of_kind(out: pa.Table, kind: str) -> pa.Table:
    return out.filter(pc.equal(out["kind"], kind))


def _table(schema: pa.Schema, columns: Mapping[str, object], rows: int) -> pa.Table:
    """Rows of `schema` from `columns`: arrays, or one value for every row; a column missing is null."""
    if not rows:
        return schema.empty_table()

    def column(values: object, type_: pa.DataType) -> pa.Array | pa.ChunkedArray:
        if values is None:
            return pa.nulls(rows, type_)
        if isinstance(values, pa.Array | pa.ChunkedArray):
            return values.cast(type_)
        return pa.repeat(pa.scalar(values, type_), rows)

    return pa.Table.from_arrays([column(columns.get(f.name), f.type) for f in schema], schema=schema)


def _columns(rows: pa.Table) -> dict[str, pa.ChunkedArray]:
    return dict(zip(rows.column_names, rows.columns, strict=True))


def _text(values: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.fill_null(pc.cast(values, pa.string()), "")


def _rule_columns(rules: pa.ChunkedArray) -> dict[str, pa.Array]:
    """The columns of `_rule_fields` for each row, each rule version's JSON parsed once, not once per alert."""
    fields = per_distinct(rules, _rule_fields, _RULE_FIELDS)
    return dict(zip((f.name for f in _RULE_FIELDS), fields.flatten(), strict=True))


def alert_rows(out: pa.Table, batch_id: int, published_ms: int, kind: str = "alert") -> pa.Table:
    """The processor's alert rows as rows of the alerts table (outbox form); with kind "shadow", the SHADOW rules'
    hits as rows of `shadow_alerts`: alert columns plus the live rule shadowed."""
    schema = OUTBOX["shadow_alerts" if kind == "shadow" else "alerts"]
    a = _of_kind(out, kind)
    login = pc.is_null(a["transactionId"])
    rule, transaction, user = (_text(a[c]) for c in ("ruleId", "transactionId", "userId"))
    window_id = pc.binary_join_element_wise(rule, ":", transaction, "")
    login_id = pc.binary_join_element_wise(rule, ":u", user, ":", pc.cast(a["eventTime"], pa.string()), "")
    derived = {
        "alertId": pc.if_else(login, login_id, window_id),
        "kind": pc.if_else(login, LOGIN_RULE, "WINDOW"),
        "eventTimeMs": a["eventTime"],
        "producedAtMs": a["producedAt"],
        "publishedAtMs": published_ms,
        "watermarkMs": a["watermark"],
        "batchId": batch_id,
    }
    return _table(schema, _columns(a) | _rule_columns(a["rule"]) | derived, a.num_rows)


def shadow_rows(out: pa.Table, batch_id: int, now_ms: int) -> pa.Table:
    """The SHADOW rules' hits as rows of `shadow_alerts`: alert columns plus the live rule shadowed."""
    return alert_rows(out, batch_id, now_ms, kind="shadow")


def late_rows(out: pa.Table, batch_id: int, now_ms: int) -> pa.Table:
    late = _of_kind(out, "late")
    kind = pc.if_else(pc.is_null(late["transactionId"]), "login", "transaction")
    changed = {"kind": kind, "eventTimeMs": late["eventTime"], "watermarkMs": late["watermark"]}
    late_columns = _columns(late) | changed | {"detectedAtMs": now_ms, "batchId": batch_id}
    return _table(OUTBOX["late_events"], late_columns, late.num_rows)


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
        out = df.toArrow()
        published = int(time.time() * 1000)  # handed to consumers: the publisher and the console
        alerts = alert_rows(out, batch_id, published)
        if self.publisher:
            self.publisher.submit(batch_id, alerts)
        late = late_rows(out, batch_id, published)
        ingestion = alerts["ingestionTimestamp"]
        measured = ingestion.filter(pc.greater(ingestion, 0)).to_numpy()
        p50, p99, pmax = _percentiles((published - measured).astype(np.float64))
        stats = [json.loads(s) for s in _of_kind(out, "stats")["details"].to_pylist()]
        seen = _of_kind(out, "rule")
        heartbeat = {
            "query": self.query,
            "batchId": batch_id,
            "committedAtMs": published,
            "inputRows": pc.sum(pc.cast(seen["aggregate"], pa.int64())).as_py() or 0,
            "alerts": alerts.num_rows,
            "lateEvents": late.num_rows,
            "watermarkMs": pc.max(out["watermark"]).as_py(),
            "latencyP50Ms": p50,
            "latencyP99Ms": p99,
            "latencyMaxMs": pmax,
            **_shard_totals(stats),
        }
        rule_seen = {"ruleId": seen["ruleId"], "ruleVersion": seen["ruleVersion"], "firstMs": seen["producedAt"]}
        self.committer.outbox.put(
            batch_id,
            {
                "alerts": alerts,
                "shadow_alerts": shadow_rows(out, batch_id, published),  # to Delta only, never published
                "late_events": late,
                "batches": pa.Table.from_pylist([heartbeat], schema=OUTBOX["batches"]),
                "rule_seen": _table(OUTBOX["rule_seen"], rule_seen | {"batchId": batch_id}, seen.num_rows),
            },
        )
        self.committer.wake.set()
        if self.printer:
            for line in progress.batch_lines(self.query, batch_id, heartbeat, alerts, self.show):
                self.printer(line)
