"""The tables' schemas (DDL; bronze `transactions` with the declared event schema's columns) and a new table's
properties."""

from __future__ import annotations

import re

import pyarrow as pa
from pyspark.sql.types import StructType

from fraudrules import event_schema
from fraudrules.config import JobConfig
from fraudrules.event_schema import DEFAULT as DEFAULT_EVENTS

FILTER_TYPE = "array<struct<field:string,op:string,numeric:boolean,values:array<string>>>"


RULE_ROW = (
    "ruleId int, version long, ruleState string, groupingKeyNames array<string>, "
    "aggregateFieldName string, aggregatorFunctionType string, limitOperatorType string, "
    f"limit string, windowMinutes int, windowMs long, scale int, filter {FILTER_TYPE}, "
    "unique array<string>, ruleType string, minFailures int, minDistinctIps int, "
    "sig long, activeSince long, epoch long, ruleJson string, updatedAt timestamp, "
    "updatedBy string"
)


ALERT_ROW = (
    "alertId string, kind string, ruleId int, ruleVersion long, transactionId long, userId long, key string, "
    "groupingKeyNames array<string>, aggregate decimal(38,18), aggregateFieldName string, "
    "aggregatorFunctionType string, limitOperatorType string, limit decimal(38,18), windowMinutes int, "
    "eventTime timestamp, eventTimeMs long, ingestionTimestamp long, producedAt timestamp, "
    "producedAtMs long, publishedAtMs long, watermarkMs long, batchId long, shard int, message string, "
    "details string"
)


# Bronze transactions: the declared event schema's typed columns (see `ddl`), then these.
BRONZE_TAIL = "raw string, srcName string, srcPos long, ingestedAt timestamp"


SCHEMAS: dict[str, str] = {
    "transactions": f"{DEFAULT_EVENTS.spark_ddl}, {BRONZE_TAIL}",  # with the default event schema
    "quarantine": ("kind string, raw string, reason string, srcName string, srcPos long, quarantinedAt timestamp"),
    "rules": RULE_ROW,
    # every change, the whole rule as it became (control commands carry their epoch); streamed by the job
    "rule_history": RULE_ROW + ", change string, changeId string",
    "rule_errors": "ruleId string, raw string, reason string, source string, receivedAt timestamp",
    "rules_export": (
        "exportId string, ruleId int, version long, ruleState string, ruleJson string, exportedAt timestamp"
    ),
    "rule_applied": (
        "ruleId int, version long, changedAt timestamp, firstEvaluatedAt timestamp, delayMs long, batchId long"
    ),
    "logins": (
        "userId long, eventType string, ipAddress string, eventTimestamp long, ingestionTimestamp long, raw string, "
        "srcName string, srcPos long, ingestedAt timestamp"
    ),
    "alerts": ALERT_ROW,
    # hits of SHADOW rules: never in `alerts` nor published; `shadowOf` = the live rule challenged, if any
    "shadow_alerts": ALERT_ROW + ", shadowOf int",
    "late_events": (
        "kind string, transactionId long, userId long, ruleId int, ruleVersion long, key string, eventTimeMs long, "
        "watermarkMs long, reason string, detectedAt timestamp, batchId long"
    ),
    "batches": (
        "query string, batchId long, committedAt timestamp, inputRows long, alerts long, lateEvents long, "
        "watermarkMs long, latencyP50Ms double, latencyP99Ms double, latencyMaxMs double, retainedEvents long, "
        "chunks int, chunksFromStore int, transactions long, pythonMs double, pythonStages string, logins long"
    ),
}


def ddl(name: str, cfg: JobConfig | None = None) -> str:
    """A table's DDL: `SCHEMAS`, bronze `transactions` with the job's declared event schema's typed columns."""
    if name == "transactions" and cfg is not None:
        return f"{event_schema.for_job(cfg).spark_ddl}, {BRONZE_TAIL}"
    return SCHEMAS[name]


def schema(name: str, cfg: JobConfig | None = None) -> StructType:
    """A table's schema from its DDL (`ddl`), read by Spark's DDL parser (a session must be active). Not through an
    empty DataFrame: that took 60-90 ms per table, a second at every start of a job."""
    return StructType.fromDDL(ddl(name, cfg))


# Delta writes a checkpoint (a Spark job over the whole log) every `checkpointInterval` commits, synchronously
# in the committing query. The job commits bronze and results every few seconds: at Delta's default of 10 that
# is a multi-second stall of a background query every ~50 s, on the cores the evaluation needs.
PROPERTIES = {"delta.checkpointInterval": "100"}


# Rows read from files name their line in `srcPos` from 1 (a Kafka record's: its offset); releases up to a5f864d
# counted lines from 0. Each table holding such rows records since when its rows count from 1 (ISO time, UTC, to
# compare with the rows' `ingestedAt` / `quarantinedAt`): its creation, or the first start of a later release on a
# table of an earlier one, before any row is written (`ensure`).
LINES_FROM_1 = "fraudrules.srcPos.linesFrom1Since"


LINE_TABLES = ("transactions", "logins", "quarantine")


def properties(name: str, now: str) -> dict[str, str]:
    """A new table's properties (`now`: its creation time, ISO)."""
    return PROPERTIES | ({LINES_FROM_1: now} if name in LINE_TABLES else {})


# The Arrow type of each DDL type the job's own tables use (`arrow_fields`), as Delta stores them.
_ARROW_TYPES = {
    "string": pa.string(),
    "int": pa.int32(),
    "long": pa.int64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}


def arrow_fields(ddl_text: str) -> list[pa.Field]:
    """The columns of a table DDL of plain names (`SCHEMAS` but bronze) as Arrow fields, without Spark's parser: what
    the outbox derives its rows from when it is imported, with no session yet."""
    return [pa.field(*_name_type(column, " ")) for column in _top_level(ddl_text)]


def _arrow_type(text: str) -> pa.DataType:
    text = text.strip()
    if text.startswith("array<"):
        return pa.list_(_arrow_type(text[len("array<") : -1]))
    if text.startswith("struct<"):
        return pa.struct([pa.field(*_name_type(f, ":")) for f in _top_level(text[len("struct<") : -1])])
    if decimal := re.fullmatch(r"decimal\((\d+),\s*(\d+)\)", text):
        return pa.decimal128(int(decimal[1]), int(decimal[2]))
    return _ARROW_TYPES[text]


def _name_type(column: str, sep: str) -> tuple[str, pa.DataType]:
    name, kind = column.strip().split(sep, 1)
    return name, _arrow_type(kind)


def _top_level(text: str) -> list[str]:
    """`text` split at the commas outside <> and ()."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]
