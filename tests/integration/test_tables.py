"""Tables as created by the job, and their small commits: what Delta reads back."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from fraudrules import tables
from fraudrules.config import JOB_TABLES, JobConfig
from fraudrules.engine.sinks import OUTBOX, TIMES, with_times

pytestmark = pytest.mark.spark


def test_job_tables_checkpoint_every_100_commits(spark, tmp_path):
    """Delta's default (a checkpoint every 10 commits, written by the committing query) stalls the job's
    frequent bronze and result commits; every table is created with the project's properties."""
    cfg = JobConfig(data_dir=str(tmp_path))
    assert sorted(tables.ensure(spark, cfg)) == sorted(JOB_TABLES)
    for name in ("transactions", "alerts", "batches"):
        detail = tables.delta(spark, cfg, name).detail().first()
        assert detail.properties == {"delta.checkpointInterval": "100"}, name
        assert tables.schema(spark, name) == tables.read(spark, cfg, name).schema, name


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


@pytest.fixture(params=[True, False], ids=["delta-rs", "spark"])
def writer(request, monkeypatch):
    """Both ways a small commit is made: delta-rs (local path tables) and Spark's writer (catalog, remote)."""
    monkeypatch.setattr(tables, "native", lambda cfg: request.param)
    return request.param


def test_small_commits_are_delta_commits_spark_reads(spark, tmp_path, writer):
    """Appends and overwrites of small tables, by delta-rs or Spark: Spark reads the rows back exactly, the
    ledger finds its marker, the row count comes from the files' statistics."""
    cfg = JobConfig(data_dir=str(tmp_path))
    tables.ensure(spark, cfg, "rule_history", "rules")
    ledger = tables.Ledger(spark, cfg, "rule_history", "app-1")
    assert ledger.append([RULE, {**RULE, "version": 3}], 5)
    assert not ledger.append([RULE], 5)  # already in
    tables.write(spark, cfg, "rules", [RULE], mode="overwrite")
    tables.write(spark, cfg, "rules", [{**RULE, "version": 3}], mode="overwrite")

    back = tables.read(spark, cfg, "rule_history").orderBy("version").collect()
    assert [r.version for r in back] == [2, 3]
    assert back[0].filter[0].asDict(recursive=True) == RULE["filter"][0]
    assert back[0].groupingKeyNames == RULE["groupingKeyNames"] and back[0].sig == RULE["sig"]
    assert back[0].updatedAt == RULE["updatedAt"].replace(tzinfo=None)  # the session's time zone is UTC
    assert tables.arrow(spark, cfg, "rule_history", ["version", "updatedAt"]).to_pylist()[0] == {
        "version": 2,
        "updatedAt": RULE["updatedAt"],
    }
    assert [r.version for r in tables.read(spark, cfg, "rules").collect()] == [3]
    assert tables.count(spark, cfg, "rule_history") == 2
    assert tables.Ledger(spark, cfg, "rule_history", "app-1").last() == 5  # read back from the table's history
    assert tables.Ledger(spark, cfg, "rule_history", "app-2").last() == -1


def test_a_value_delta_rs_would_not_cast_exactly_goes_through_spark(spark, tmp_path):
    """Spark rounds a decimal with more digits than its column's scale; the Arrow cast refuses it, and the
    row takes Spark's writer instead of failing or being rounded differently."""
    cfg = JobConfig(data_dir=str(tmp_path))
    tables.ensure(spark, cfg, "alerts")
    row = dict.fromkeys(OUTBOX["alerts"].names) | {"alertId": "1:1", "ruleId": 1, "eventTimeMs": 0, "producedAtMs": 0}
    row |= {"aggregate": "0.1234567890123456789", "limit": "0.5"}
    rows = with_times(pa.Table.from_pylist([row], schema=OUTBOX["alerts"]), TIMES["alerts"])  # as committed
    tables.write(spark, cfg, "alerts", rows)
    [back] = tables.read(spark, cfg, "alerts").collect()
    assert back.aggregate == Decimal("0.123456789012345679") and back.limit == Decimal("0.5")


def test_a_new_stream_reads_every_row_with_or_without_the_first_commit_in_the_log(spark, tmp_path):
    """A table stream starts from the first commit while the log has it, else from the snapshot (after log
    cleanup): the same rows either way."""
    cfg = JobConfig(data_dir=str(tmp_path))
    tables.ensure(spark, cfg, "rule_history")
    for version in (1, 2, 3):
        tables.write(spark, cfg, "rule_history", [{**RULE, "version": version}])

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
