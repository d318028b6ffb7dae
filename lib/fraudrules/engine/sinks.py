"""The queries' foreachBatch sinks: bronze and quarantine, the stateful queries' results, rule changes.

A stateful micro-batch's output is collected once (that one Spark job runs the whole micro-batch). Alerts
go to consumers straight away (console, Kafka alerts topic: at-least-once, keyed by alertId for consumers
to de-duplicate). Every row bound for Delta (alerts, late events, the batch heartbeat, first evaluations
of rule versions) is written to the query's outbox, files in its checkpoint folder, before the micro-batch
ends. A committer thread appends them to the Delta tables, several micro-batches per commit, each commit with
Delta's transaction (query, its last batch id) so that a batch already in a table is never appended again.
A crash between outbox and Delta loses nothing: the next start commits what the outbox holds before the
queries resume. Bronze, quarantine and rule errors are appended by their queries, exactly once per batch
the same way (transaction (query, batch id)).
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from fraudrules import event_schema, tables
from fraudrules.config import RULES_QUERY, JobConfig
from fraudrules.engine import progress
from fraudrules.engine.ingest import with_defaults
from fraudrules.engine.progress import Printer
from fraudrules.engine.sources import client_options
from fraudrules.rules import store
from fraudrules.rules.model import LOGIN_RULE, parse_rules_text
from fraudrules.session import background_thread

BACKGROUND_POOL = "background"

# Outbox rows: plain types (times in ms); the committer derives the tables' timestamps and decimals.
OUTBOX = {
    "alerts": pa.schema(
        [
            ("alertId", pa.string()),
            ("kind", pa.string()),
            ("ruleId", pa.int32()),
            ("ruleVersion", pa.int64()),
            ("transactionId", pa.int64()),
            ("userId", pa.int64()),
            ("key", pa.string()),
            ("groupingKeyNames", pa.list_(pa.string())),
            ("aggregate", pa.string()),
            ("aggregateFieldName", pa.string()),
            ("aggregatorFunctionType", pa.string()),
            ("limitOperatorType", pa.string()),
            ("limit", pa.string()),
            ("windowMinutes", pa.int32()),
            ("eventTimeMs", pa.int64()),
            ("ingestionTimestamp", pa.int64()),
            ("producedAtMs", pa.int64()),
            ("publishedAtMs", pa.int64()),
            ("watermarkMs", pa.int64()),
            ("batchId", pa.int64()),
            ("shard", pa.int32()),
            ("message", pa.string()),
            ("details", pa.string()),
        ]
    ),
    "late_events": pa.schema(
        [
            ("kind", pa.string()),
            ("transactionId", pa.int64()),
            ("userId", pa.int64()),
            ("ruleId", pa.int32()),
            ("ruleVersion", pa.int64()),
            ("key", pa.string()),
            ("eventTimeMs", pa.int64()),
            ("watermarkMs", pa.int64()),
            ("reason", pa.string()),
            ("detectedAtMs", pa.int64()),
            ("batchId", pa.int64()),
        ]
    ),
    "batches": pa.schema(
        [
            ("query", pa.string()),
            ("batchId", pa.int64()),
            ("committedAtMs", pa.int64()),
            ("inputRows", pa.int64()),
            ("alerts", pa.int64()),
            ("lateEvents", pa.int64()),
            ("watermarkMs", pa.int64()),
            ("latencyP50Ms", pa.float64()),
            ("latencyP99Ms", pa.float64()),
            ("latencyMaxMs", pa.float64()),
            ("retainedEvents", pa.int64()),
            ("chunks", pa.int32()),
            ("chunksFromStore", pa.int32()),
            ("transactions", pa.int64()),
            ("pythonMs", pa.float64()),
            ("pythonStages", pa.string()),
        ]
    ),
    "rule_seen": pa.schema(
        [("ruleId", pa.int32()), ("ruleVersion", pa.int64()), ("firstMs", pa.int64()), ("batchId", pa.int64())]
    ),
}
OUTBOX["shadow_alerts"] = OUTBOX["alerts"].append(pa.field("shadowOf", pa.int32()))
# Table timestamps derived from outbox milliseconds when committed (column: milliseconds column).
ALERT_TIMES = {"eventTime": "eventTimeMs", "producedAt": "producedAtMs"}
TIMES = {
    "alerts": ALERT_TIMES,
    "shadow_alerts": ALERT_TIMES,
    "late_events": {"detectedAt": "detectedAtMs"},
    "batches": {"committedAt": "committedAtMs"},
}


def with_times(rows: pa.Table, times: dict[str, str]) -> pa.Table:
    for column, ms in times.items():
        rows = rows.append_column(column, rows.column(ms).cast(pa.timestamp("ms", tz="UTC")))
    return rows


_NULLABLE_INTS = {pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype()}


def _frame(schema: pa.Schema, frame: pd.DataFrame) -> pa.Table:
    """Outbox rows from pandas, column by column (NaN and NA as nulls); a column the frame lacks is null.
    Most micro-batches have no rows for most tables: those cost nothing."""
    if frame.empty:
        return schema.empty_table()
    return pa.Table.from_arrays(
        [
            pa.array(frame[f.name], f.type, from_pandas=True) if f.name in frame else pa.nulls(len(frame), f.type)
            for f in schema
        ],
        schema=schema,
    )


class Outbox:
    """A query's micro-batch results waiting for Delta: one Arrow file per (batch, table), then a marker."""

    def __init__(self, folder: str):
        self.folder = folder

    def _path(self, batch_id: int, part: str) -> str:
        return os.path.join(self.folder, f"{batch_id:020d}.{part}")

    def put(self, batch_id: int, parts: dict[str, pa.Table]) -> None:
        os.makedirs(self.folder, exist_ok=True)
        for name, table in parts.items():
            tmp = self._path(batch_id, f"{name}.{uuid.uuid4().hex}.tmp")
            with pa.OSFile(tmp, "wb") as fh, pa.ipc.new_file(fh, table.schema) as writer:
                writer.write_table(table)
            os.replace(tmp, self._path(batch_id, f"{name}.arrow"))
        with open(self._path(batch_id, "done"), "w"):  # the batch is complete once this exists
            pass

    def pending(self) -> list[int]:
        if not os.path.isdir(self.folder):
            return []
        return sorted(int(n.split(".")[0]) for n in os.listdir(self.folder) if n.endswith(".done"))

    def read(self, batch_id: int, name: str) -> pa.Table | None:
        path = self._path(batch_id, f"{name}.arrow")
        if not os.path.exists(path):
            return None
        with pa.OSFile(path, "rb") as fh:
            return pa.ipc.open_file(fh).read_all()

    def remove(self, batch_ids: list[int]) -> None:
        for b in batch_ids:
            for name in [*OUTBOX, "done"]:
                path = self._path(b, name if name == "done" else f"{name}.arrow")
                if os.path.exists(path):
                    os.remove(path)

    def progress(self, table: str) -> Progress:
        path = os.path.join(self.folder, f"progress-{table}.json")
        if not os.path.exists(path):
            return Progress(-1, None)
        with open(path, encoding="utf-8") as fh:
            return Progress(**json.load(fh))

    def set_progress(self, table: str, progress: Progress) -> None:
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, f"progress-{table}.json")
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"committed": progress.committed, "group": progress.group}, fh)
        os.replace(tmp, path)


@dataclass(frozen=True)
class Progress:
    """How far a table has the outbox's rows: every batch up to `committed`; `group`, the batches of a commit in
    flight (recorded before it is made: after a crash, exactly this group is committed again, and Delta skips it
    if it had made it)."""

    committed: int
    group: list[int] | None


def app_of(cfg: JobConfig, query: str) -> str:
    """The query's Delta transaction app id: its name and id (kept in its checkpoint, new for a new checkpoint)."""
    return f"{query}:{cfg.query_id(query)}"


class Committer(threading.Thread):
    """Appends a query's outbox to Delta in the background: per table, the batches it does not have yet, in one
    commit with the transaction (query, last batch of the commit)."""

    def __init__(
        self, spark: SparkSession, cfg: JobConfig, query: str, printer: Printer | None, min_interval_s: float = 2.0
    ):
        super().__init__(daemon=True, name=f"committer-{query}")
        self.spark, self.cfg, self.query, self.printer = spark, cfg, query, printer
        self.outbox = Outbox(os.path.join(cfg.checkpoint(query), "outbox"))
        self.min_interval_s = min_interval_s
        self.wake, self.halt = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        self.lock = threading.Lock()  # the thread and callers of commit_pending (drains, tests) take turns
        self.reported: set[tuple[int, int]] | None = None  # rule versions whose apply delay is recorded
        self.writer = tables.writer(spark, cfg)

    def run(self) -> None:
        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", BACKGROUND_POOL)
        background_thread(self.spark)
        while not self.halt.is_set():
            self.wake.wait(timeout=self.min_interval_s)
            self.wake.clear()
            try:
                self.commit_pending()
            except Exception as err:  # surfaced to the query by the sink's next micro-batch
                self.error = err
                traceback.print_exc()
                return
            self.halt.wait(self.min_interval_s)

    def stop(self) -> None:
        """Commit what is pending and end the thread."""
        self.halt.set()
        self.wake.set()
        if self.is_alive():
            self.join()
        self.commit_pending()

    def commit_pending(self) -> int:
        with self.lock:
            return self._commit()

    def _commit(self) -> int:
        batches = self.outbox.pending()
        if not batches:
            return 0
        for name, times in TIMES.items():
            self._commit_table(name, name, batches, lambda parts, t=times: with_times(pa.concat_tables(parts), t))
        self._commit_table("rule_applied", "rule_seen", batches, self._rule_applied)
        done = min(self.outbox.progress(table).committed for table in (*TIMES, "rule_applied"))
        self.outbox.remove([b for b in batches if b <= done])
        return len(batches)

    def _commit_table(
        self, table: str, part: str, batches: list[int], rows_of: Callable[[list[pa.Table]], tables.Rows]
    ) -> None:
        """Commit the rows `part` of the batches `table` does not have yet (`rows_of` makes them table rows)."""
        progress = self.outbox.progress(table)
        group = progress.group or [b for b in batches if b > progress.committed]
        if not group:
            return
        self.outbox.set_progress(table, Progress(progress.committed, group))
        parts = [t for b in group if (t := self.outbox.read(b, part)) is not None and t.num_rows]
        rows = rows_of(parts) if parts else []
        if len(rows):
            self.writer.append(table, rows, tables.Txn(app_of(self.cfg, self.query), group[-1]))
        self.outbox.set_progress(table, Progress(group[-1], None))

    def _rule_applied(self, parts: list[pa.Table]) -> list[dict]:
        """Rows of rule_applied: once per rule version, the delay from its change to the first event evaluated
        under it."""
        seen = pa.concat_tables(parts).to_pandas()
        if self.reported is None:
            rows = self.writer.arrow("rule_applied", ["ruleId", "version"]).to_pylist()
            self.reported = {(r["ruleId"], r["version"]) for r in rows}
        first = seen.sort_values(["firstMs", "batchId"]).groupby(["ruleId", "ruleVersion"]).first()
        new = {k: v for k, v in first.iterrows() if (int(k[0]), int(k[1])) not in self.reported}
        if not new:
            return []
        columns = ["ruleId", "version", "ruleState", "updatedAt"]
        history = self.writer.arrow("rule_history", columns).to_pylist()
        changed = {(r["ruleId"], r["version"]): r["updatedAt"] for r in history if r["ruleState"] != "CONTROL"}
        records = []
        for (rule_id, version), first in new.items():
            at = changed.get((int(rule_id), int(version)))
            delay = None if at is None else int(first["firstMs"]) - int(at.timestamp() * 1000)
            records.append(
                {
                    "ruleId": int(rule_id),
                    "version": int(version),
                    "changedAt": at,
                    "delayMs": delay,
                    "firstEvaluatedAt": pd.Timestamp(int(first["firstMs"]), unit="ms", tz="UTC").to_pydatetime(),
                    "batchId": int(first["batchId"]),
                }
            )
            self.reported.add((int(rule_id), int(version)))
        if self.printer:
            for line in progress.rules_in_force_lines(self.query, records):
                self.printer(line)
        return records


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
    fields = pd.DataFrame([_rule_fields(r) for r in a["rule"]])
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
        "transactions": max((s.get("transactions", 0) for s in stats), default=0),
        "pythonMs": sum(slowest["ms"].values()) if slowest else None,
        "pythonStages": json.dumps(slowest["ms"]) if slowest else None,
    }


class ResultSink:
    """foreachBatch target of a stateful query: publish the batch's alerts, hand its rows to the outbox."""

    def __init__(
        self,
        committer: Committer,
        publish: Callable[[pd.DataFrame], None] | None = None,
        printer: Printer | None = progress.say,
        show: int = 5,
    ):
        self.committer, self.publish, self.printer, self.show = committer, publish, printer, show
        self.query = committer.query

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        if self.committer.error is not None:
            raise RuntimeError(f"committing {self.query}'s results to Delta failed") from self.committer.error
        out = df.toArrow().to_pandas(types_mapper=_NULLABLE_INTS.get)  # ids stay exact integers
        now = int(time.time() * 1000)
        alerts = alert_rows(out, batch_id, now)
        if len(alerts) and self.publish:
            self.publish(alerts)
        published = int(time.time() * 1000)
        alerts["publishedAtMs"] = published
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
                "alerts": _frame(OUTBOX["alerts"], alerts),
                "shadow_alerts": _frame(OUTBOX["shadow_alerts"], shadow),
                "late_events": _frame(OUTBOX["late_events"], late),
                "batches": _frame(OUTBOX["batches"], pd.DataFrame([heartbeat])),
                "rule_seen": _frame(OUTBOX["rule_seen"], rule_seen),
            },
        )
        self.committer.wake.set()
        if self.printer:
            for line in progress.batch_lines(self.query, batch_id, heartbeat, alerts, self.show):
                self.printer(line)


class IngestSink:
    """foreachBatch target of an ingest query: bronze and quarantine rows, each exactly once per batch (empty ones
    skipped). The micro-batch is one Spark job (the parse, collected as Arrow: a micro-batch is bounded by
    `max_records_per_trigger`), split and stamped here, and committed by the table writer."""

    def __init__(self, cfg: JobConfig, query: str, kind: str = "transaction"):
        self.cfg, self.query, self.kind = cfg, query, kind
        self.bronze = "transactions" if kind == "transaction" else "logins"

    def __call__(self, parsed: DataFrame, batch_id: int) -> None:
        """The stamps come from Python: a `current_timestamp()` is a constant that Spark compiles into new code
        at every micro-batch."""
        spark = parsed.sparkSession
        background_thread(spark)
        records = with_defaults(parsed).toArrow()
        writer, txn = tables.writer(spark, self.cfg), tables.Txn(app_of(self.cfg, self.query), batch_id)
        stamp = pa.scalar(datetime.now(timezone.utc), pa.timestamp("us", tz="UTC"))
        bad = pc.is_valid(records.column("error"))
        good = records.filter(pc.invert(bad))
        if good.num_rows:
            rows = good.append_column("raw", good.column("value"))
            writer.append(self.bronze, _stamped(rows, "ingestedAt", stamp), txn)
        quarantined = records.filter(bad)
        if quarantined.num_rows:
            rows = pa.table(
                {
                    "kind": pa.array([self.kind] * quarantined.num_rows, pa.string()),
                    "raw": quarantined.column("value"),
                    "reason": quarantined.column("error"),
                    "srcName": quarantined.column("srcName"),
                    "srcPos": quarantined.column("srcPos"),
                }
            )
            writer.append("quarantine", _stamped(rows, "quarantinedAt", stamp), txn)


def _stamped(rows: pa.Table, column: str, stamp: pa.Scalar) -> pa.Table:
    """`rows` plus `column` = `stamp` on every row."""
    micros = np.full(rows.num_rows, stamp.value, dtype=np.int64)
    return rows.append_column(column, pa.array(micros).cast(stamp.type))


class RuleChangeSink:
    """Merges each change set into the rules table; invalid rules go to rule_errors, valid ones still apply."""

    def __init__(self, cfg: JobConfig, printer: Printer | None = progress.say):
        self.cfg, self.printer = cfg, printer
        self.schema = event_schema.for_job(cfg)  # rules naming fields it does not declare go to rule_errors

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        spark = df.sparkSession
        errors = []
        # a few rows (one per change set): sorted here, not by a Spark sort (a sampling job and a shuffle)
        for row in sorted(df.collect(), key=lambda r: (r.modified, r.source)):
            changes, problems = parse_rules_text(row.value, self.schema)
            applied = store.apply(
                spark,
                self.cfg,
                changes,
                author=f"stream:{os.path.basename(row.source)}",
                change_id=f"{RULES_QUERY}:{batch_id}:{row.source}",
            )
            errors += [
                {
                    "ruleId": None if e.rule_id is None else str(e.rule_id),
                    "raw": row.value,
                    "reason": "; ".join(e.problems),
                    "source": row.source,
                }
                for e in problems
            ]
            if self.printer:
                self.printer(
                    f"[rules] {os.path.basename(row.source)}: {len(applied)} rules changed, {len(problems)} rejected"
                )
        if errors:
            received = datetime.now(timezone.utc)
            rows = [{**e, "receivedAt": received} for e in errors]
            txn = tables.Txn(app_of(self.cfg, RULES_QUERY), batch_id)
            tables.writer(spark, self.cfg).append("rule_errors", rows, txn)


def publish_alerts(spark: SparkSession, alerts: pd.DataFrame, cfg: JobConfig) -> None:
    """Write one micro-batch's alerts to the alerts topic: key = alertId, value = the alert as JSON."""
    messages = pd.DataFrame(
        {
            "key": alerts["alertId"].astype(str),
            "value": alerts.to_json(orient="records", lines=True).splitlines(),
        }
    )
    writer = spark.createDataFrame(messages, "key string, value string").write.format("kafka")
    writer = writer.option("topic", str(cfg.kafka_alerts_topic))
    for key, value in client_options(cfg).items():
        writer = writer.option(key, value)
    writer.save()
