"""Tables as created by the job, and the table writer's contract: what Delta reads back, whichever writer wrote.

Every writer test runs three ways: delta-rs on local path tables (what a laptop runs), Spark's Delta writer on path
tables, and Spark's Delta writer on catalog tables written with `saveAsTable` (what the bundle runs)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal
from importlib import metadata
from pathlib import Path

import pyarrow as pa
import pytest
from delta.tables import DeltaTable as SparkDeltaTable
from deltalake import DeltaTable

from fraudrules import tables
from fraudrules.compat import delta_log
from fraudrules.config import JOB_TABLES, JobConfig
from fraudrules.engine.outbox import OUTBOX, TIMES, with_times
from fraudrules.tables.schemas import arrow_fields
from tests.conftest import CATALOG_SCHEMA

pytestmark = pytest.mark.spark


def test_job_tables_checkpoint_every_100_commits(spark, tmp_path):
    """Delta's default (a checkpoint every 10 commits, written by the committing query) stalls the job's
    frequent bronze and result commits; every table is created with the project's properties."""
    cfg = JobConfig(data_dir=str(tmp_path))
    assert sorted(tables.ensure(spark, cfg)) == sorted(JOB_TABLES)
    for name in ("transactions", "alerts", "batches"):
        detail = tables.delta(spark, cfg, name).detail().first()
        assert {k: v for k, v in detail.properties.items() if k != tables.LINES_FROM_1} == tables.PROPERTIES, name
        assert tables.schema(name) == tables.read(spark, cfg, name).schema, name


def test_a_path_tables_first_commit_comes_with_the_checksum_delta_writes(spark, tmp_path):
    """Version 0 of a path table has the checksum Delta's own `CREATE TABLE` writes, apart from the table's id and
    times, and Delta takes it: it reads version 0's protocol and schema from it, not with a Spark job."""
    cfg = JobConfig(data_dir=str(tmp_path))
    tables.ensure(spark, cfg, "rule_history")
    theirs = tmp_path / "by_delta"
    builder = SparkDeltaTable.create(spark).location(str(theirs)).addColumns(tables.schema("rule_history"))
    for key, value in tables.PROPERTIES.items():
        builder = builder.property(key, value)
    builder.execute()

    def checksum(table: str) -> dict:
        found = json.loads((Path(table) / "_delta_log" / f"{0:020d}.crc").read_text())
        found["metadata"] = {k: v for k, v in found["metadata"].items() if k not in ("id", "createdTime")}
        found["metadata"]["schemaString"] = json.loads(found["metadata"]["schemaString"])
        return found

    ours, delta_s = checksum(cfg.table("rule_history")), checksum(str(theirs))
    assert ours == {k: delta_s[k] for k in ours}
    assert set(delta_s) - set(ours) == {"txnId", "fileSizeHistogram"}  # optional: which commit, file sizes
    log = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, cfg.table("rule_history"))
    snapshot = log.unsafeVolatileSnapshot()
    assert snapshot.version() == 0 and snapshot.checksumOpt().isDefined()
    assert json.loads(snapshot.metadata().schemaString()) == tables.schema("rule_history").jsonValue()


def test_with_another_delta_a_path_table_is_created_by_delta_itself(spark, tmp_path, monkeypatch):
    """`first_commit` writes as one Delta release does; with another, `ensure` has Delta create the table (SQL):
    the same schema and properties, and no checksum of ours."""
    installed = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "9.9.9" if name == "delta-spark" else installed(name))
    assert not delta_log.writes_first_commits()
    cfg = JobConfig(data_dir=str(tmp_path))
    assert tables.ensure(spark, cfg, "rule_history", "transactions") == ["rule_history", "transactions"]
    commit = (Path(cfg.table("rule_history")) / "_delta_log" / f"{0:020d}.json").read_text()
    assert '"operation":"CREATE TABLE"' in commit and '"engineInfo":"Apache-Spark' in commit  # Delta's, not ours
    for name in ("rule_history", "transactions"):
        assert tables.schema(name) == tables.read(spark, cfg, name).schema, name
        properties = tables.delta(spark, cfg, name).detail().first().properties
        assert {k: v for k, v in properties.items() if k != tables.LINES_FROM_1} == tables.PROPERTIES
    assert tables.ensure(spark, cfg, "rule_history") == []


@pytest.mark.parametrize("name", [n for n in tables.SCHEMAS if n != "transactions"])
def test_the_sparkless_arrow_types_of_a_table_are_the_ones_spark_gives(spark, name):
    """`schemas.arrow_fields` (what the outbox derives its rows from at import, before any session) reads a
    table's DDL as Spark's parser and Arrow conversion do."""
    from pyspark.sql.pandas.types import to_arrow_schema

    ours = pa.schema(arrow_fields(tables.SCHEMAS[name]))
    assert ours.equals(to_arrow_schema(tables.schema(name), timezone="UTC")), (ours, name)


RULE = {
    "ruleId": 7,
    "version": 2,
    "ruleState": "ACTIVE",
    "groupingKeyNames": ["payeeId", "beneficiaryId"],
    "filter": [{"field": "paymentType", "op": "=", "numeric": False, "values": ["CRD"]}],
    "limit": "300",
    "sig": 12345678901,
    "ruleJson": "{}",
    "updatedAt": datetime(2026, 11, 25, 14, 0, 0, 123456, tzinfo=timezone.utc),
}
WRITERS = {
    "delta-rs": (tables.DeltaRsWriter, False),
    "spark-path": (tables.SparkWriter, False),
    "spark-catalog": (tables.SparkWriter, True),
}


@pytest.fixture(params=list(WRITERS))
def made(request, spark, tmp_path) -> tuple[tables.TableWriter, JobConfig]:
    """A writer of each kind, and the configuration of its tables (fresh ones)."""
    kind, catalog = WRITERS[request.param]
    cfg = JobConfig(data_dir=str(tmp_path))
    if catalog:
        schema = f"{CATALOG_SCHEMA}_{abs(hash(str(tmp_path))) % 10**8}"
        cfg = cfg.with_(catalog="spark_catalog", schema=schema)
    return kind(spark, cfg), cfg


def test_the_configuration_chooses_the_writer(spark, tmp_path):
    local = JobConfig(data_dir=str(tmp_path))
    assert type(tables.writer(spark, local)) is tables.DeltaRsWriter
    assert type(tables.writer(spark, local.with_(catalog="c", schema="s"))) is tables.SparkWriter
    assert type(tables.writer(spark, local.with_(data_dir="s3://bucket/fraud"))) is tables.SparkWriter


def test_append_overwrite_read_count(spark, made):
    """Appends and overwrites of small tables: Spark reads the rows back exactly, the writer too, and counts."""
    writer, cfg = made
    tables.ensure(spark, cfg, "rule_history", "rules")
    writer.append("rule_history", [RULE, {**RULE, "version": 3}])
    writer.overwrite("rules", [RULE])
    writer.overwrite("rules", [{**RULE, "version": 3}])

    back = tables.read(spark, cfg, "rule_history").orderBy("version").collect()
    assert [r.version for r in back] == [2, 3]
    assert back[0].filter[0].asDict(recursive=True) == RULE["filter"][0]
    assert back[0].groupingKeyNames == RULE["groupingKeyNames"] and back[0].sig == RULE["sig"]
    assert back[0].updatedAt == RULE["updatedAt"].replace(tzinfo=None)  # the session's time zone is UTC
    assert writer.arrow("rule_history", ["version", "updatedAt"]).sort_by("version").to_pylist()[0] == {
        "version": 2,
        "updatedAt": RULE["updatedAt"],
    }
    assert [r.version for r in tables.read(spark, cfg, "rules").collect()] == [3]
    assert writer.count("rule_history") == 2 and writer.count("rules") == 1


def test_rows_of_an_earlier_release_are_told_from_rows_that_count_lines_from_1(spark, made):
    """A table holding source positions records since when its rows count lines from 1: a new one from its creation,
    one of an earlier release from the next start (`ensure`), after its rows and before any new one, once."""
    writer, cfg = made
    tables.ensure(spark, cfg, "quarantine", "alerts")

    def properties(name: str) -> dict:
        return tables.delta(spark, cfg, name).detail().first().properties

    assert tables.LINES_FROM_1 in properties("quarantine") and tables.LINES_FROM_1 not in properties("alerts")
    where = cfg.table("quarantine") if cfg.uses_catalog else f"delta.`{cfg.table('quarantine')}`"
    spark.sql(f"ALTER TABLE {where} UNSET TBLPROPERTIES ('{tables.LINES_FROM_1}')")  # as an earlier release made it
    old = {"kind": "transaction", "raw": "x", "reason": "r", "srcName": "f", "srcPos": 0}
    writer.append("quarantine", [{**old, "quarantinedAt": datetime.now(timezone.utc)}])
    assert tables.ensure(spark, cfg, "quarantine", "alerts") == []
    since = datetime.fromisoformat(properties("quarantine")[tables.LINES_FROM_1])
    assert tables.read(spark, cfg, "quarantine").first().quarantinedAt < since.replace(tzinfo=None)  # session: UTC
    versions = tables.delta(spark, cfg, "quarantine").history().count()
    tables.ensure(spark, cfg, "quarantine")
    assert tables.delta(spark, cfg, "quarantine").history().count() == versions  # marked once
    assert properties("quarantine")[tables.LINES_FROM_1] == since.isoformat(timespec="milliseconds")


def test_a_transaction_is_appended_once(spark, made):
    """Delta's SetTransaction: a commit of (app, version) is made once; a version at or below the app's last is
    skipped, another app's is not; the commit says which batch it holds."""
    writer, cfg = made
    tables.ensure(spark, cfg, "rule_history")
    writer.append("rule_history", [RULE], tables.Txn("query-a", 5))
    writer.append("rule_history", [RULE], tables.Txn("query-a", 5))  # a replay
    writer.append("rule_history", [RULE], tables.Txn("query-a", 4))  # an older batch
    writer.append("rule_history", [{**RULE, "version": 3}], tables.Txn("query-b", 0))
    writer.append("rule_history", [{**RULE, "version": 3}], tables.Txn("query-b", 0))  # a replay of batch 0
    writer.append("rule_history", [{**RULE, "version": 4}], tables.Txn("query-a", 6))
    assert sorted(r.version for r in tables.read(spark, cfg, "rule_history").collect()) == [2, 3, 4]
    notes = [r.userMetadata for r in tables.delta(spark, cfg, "rule_history").history().collect()]
    assert '{"app": "query-a", "batch": 6}' in notes


def test_decimals_round_half_up_to_the_column_as_spark_casts(spark, made):
    """An aggregate with more digits than its column's scale is rounded half up (ties away from zero), the same
    whichever writer commits it."""
    writer, cfg = made
    tables.ensure(spark, cfg, "alerts")
    base = dict.fromkeys(OUTBOX["alerts"].names) | {"ruleId": 1, "eventTimeMs": 0, "producedAtMs": 0, "limit": "0.5"}
    values = {"a": "0.1234567890123456789", "b": "-0.0000000000000000005", "c": "12345678901234567890.25"}
    rows = [base | {"alertId": k, "aggregate": v} for k, v in values.items()]
    writer.append("alerts", with_times(pa.Table.from_pylist(rows, schema=OUTBOX["alerts"]), TIMES["alerts"]))
    back = {r.alertId: r.aggregate for r in tables.read(spark, cfg, "alerts").collect()}
    assert back == {
        "a": Decimal("0.123456789012345679"),
        "b": Decimal("-0.000000000000000001"),
        "c": Decimal("12345678901234567890.25"),
    }


def test_a_new_stream_reads_every_row_with_or_without_the_first_commit_in_the_log(spark, tmp_path):
    """A table stream starts from the first commit while the log has it, else from the snapshot (after log
    cleanup): the same rows either way."""
    cfg = JobConfig(data_dir=str(tmp_path))
    tables.ensure(spark, cfg, "rule_history")
    for version in (1, 2, 3):
        tables.writer(spark, cfg).append("rule_history", [{**RULE, "version": version}])

    def streamed(name: str) -> list[int]:
        query = tables.read_stream(spark, cfg, "rule_history").writeStream.format("memory").queryName(name)
        query.trigger(availableNow=True).start().awaitTermination()
        return sorted(r.version for r in spark.table(name).collect())

    assert streamed("from_first_commit") == [1, 2, 3]
    DeltaTable(cfg.table("rule_history")).create_checkpoint()
    log = tmp_path / "tables" / "rule_history" / "_delta_log"
    for version in (0, 1):  # what log cleanup leaves: a checkpoint, the newest commits
        (log / f"{version:020d}.json").unlink()
    assert streamed("from_snapshot") == [1, 2, 3]
