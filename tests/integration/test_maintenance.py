"""Table maintenance on both writers (delta-rs on path tables, Spark's Delta writer on path and catalog tables): the
writers compact as they append, and `maintenance.maintain` (compaction, bronze retention, VACUUM, the log) runs while
a committer appends with Delta's transactions, losing, duplicating and blocking nothing."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from fraudrules import maintenance, tables
from fraudrules.engine.outbox import OUTBOX, TIMES, with_times
from tests.integration.test_tables import WRITERS, made  # noqa: F401  (the writer fixture, each kind)

pytestmark = pytest.mark.spark
NOW = datetime.now(timezone.utc)
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "transactions.jsonl"


def alert_rows(batch: int, per_batch: int = 3) -> pa.Table:
    base = dict.fromkeys(OUTBOX["alerts"].names) | {"ruleId": 1, "eventTimeMs": 0, "producedAtMs": 0}
    rows = [base | {"alertId": f"{batch}:{i}", "batchId": batch, "aggregate": "1"} for i in range(per_batch)]
    return with_times(pa.Table.from_pylist(rows, schema=OUTBOX["alerts"]), TIMES["alerts"])


def bronze_rows(first: int, count: int, ingested: datetime) -> list[dict]:
    return [{"transactionId": first + i, "ingestedAt": ingested} for i in range(count)]


def alert_ids(writer: tables.TableWriter) -> list[str]:
    return writer.arrow("alerts", ["alertId"]).column("alertId").to_pylist()


def live_files(spark, cfg) -> int:
    return int(tables.delta(spark, cfg, "alerts").detail().first()["numFiles"])


def test_writers_compact_the_tables_they_append_to(spark, made):  # noqa: F811
    """With `compact_min_files` = 3 a table never holds more than 3 small files however many appends it gets; every
    row is there once, and a replayed transaction is still skipped after its commit was compacted away."""
    writer, cfg = made
    cfg = cfg.with_(compact_min_files=3)
    writer = type(writer)(spark, cfg)
    tables.ensure(spark, cfg, "alerts")
    for batch in range(7):
        writer.append("alerts", alert_rows(batch), tables.Txn("evaluate:q", batch))
    assert live_files(spark, cfg) <= 3
    writer.append("alerts", alert_rows(3), tables.Txn("evaluate:q", 3))  # a replay after a crash
    ids = alert_ids(writer)
    assert sorted(ids) == sorted(f"{b}:{i}" for b in range(7) for i in range(3))
    operations = [r.operation for r in tables.delta(spark, cfg, "alerts").history().collect()]
    assert "OPTIMIZE" in operations


def test_writers_leave_files_of_their_target_size_alone(spark, made, monkeypatch):  # noqa: F811
    """A file of the writers' target size is not rewritten by their compactions, which merge only the small files
    (before, each compaction rewrote the growing file with the new small ones: 20 times a bronze table's bytes)."""
    writer, cfg = made
    cfg = cfg.with_(compact_min_files=3)
    tables.ensure(spark, cfg, "alerts")
    type(writer)(spark, cfg.with_(compact_min_files=0)).append("alerts", alert_rows(-1, per_batch=3000))
    big = set(tables.delta(spark, cfg, "alerts").toDF().inputFiles())
    size = os.path.getsize(next(iter(big)).removeprefix("file:"))
    monkeypatch.setattr(tables.writers, "WRITER_TARGET_BYTES", size)
    monkeypatch.setattr(tables.writers, "SMALL_FILE_BYTES", size)  # the 3-row files are well under it
    writer = type(writer)(spark, cfg)  # Spark's writer sets its session's auto compaction from the two
    for batch in range(7):
        writer.append("alerts", alert_rows(batch), tables.Txn("evaluate:q", batch))
    assert big <= set(tables.delta(spark, cfg, "alerts").toDF().inputFiles())
    assert live_files(spark, cfg) <= 1 + 3
    operations = [r.operation for r in tables.delta(spark, cfg, "alerts").history().collect()]
    assert "OPTIMIZE" in operations
    assert len(alert_ids(writer)) == 3000 + 7 * 3


def test_a_writer_without_compaction_keeps_every_file(spark, made):  # noqa: F811
    """`compact_min_files` = 0 turns the writers' compaction off (the test above can fail)."""
    writer, cfg = made
    cfg = cfg.with_(compact_min_files=0)
    writer = type(writer)(spark, cfg)
    tables.ensure(spark, cfg, "alerts")
    for batch in range(4):
        writer.append("alerts", alert_rows(batch), tables.Txn("evaluate:q", batch))
    assert live_files(spark, cfg) == 4


def test_maintenance_while_the_job_writes(spark, made):  # noqa: F811
    """Maintenance passes while a committer appends 8 micro-batches to `alerts` and an ingest query appends to bronze
    and expires its old rows as the job does: the 50 old rows are deleted, every new row is in its table exactly
    once, neither writer failed, and the small files are merged."""
    writer, cfg = made
    cfg = cfg.with_(compact_min_files=0, bronze_retention_days=30)
    batches = 8  # each maintenance pass overlaps several appends to both tables
    writer = type(writer)(spark, cfg)
    tables.ensure(spark, cfg, "alerts", "transactions")
    writer.append("transactions", bronze_rows(0, 50, NOW - timedelta(days=40)), tables.Txn("ingest:old", 0))
    errors: list[BaseException] = []
    expired = [0]

    def write() -> None:
        try:
            for batch in range(batches):
                txn = tables.Txn("evaluate:q", batch)
                writer.append("alerts", alert_rows(batch), txn)
                writer.append("transactions", bronze_rows(1_000 + batch * 10, 10, datetime.now(timezone.utc)), txn)
                if not expired[0]:  # as the ingest sink: tried again at the next batch after a conflict
                    with contextlib.suppress(*maintenance.conflicts(cfg)):
                        expired[0] = maintenance.expire_bronze(spark, cfg, "transactions")
                time.sleep(0.1)  # the job's queries commit every few seconds, not back to back
        except BaseException as err:  # asserted below
            errors.append(err)

    job = threading.Thread(target=write)
    job.start()
    reports = []
    while job.is_alive() or not reports:
        reports += maintenance.maintain(spark, cfg, ("alerts", "transactions"))
    job.join()
    reports += maintenance.maintain(spark, cfg, ("alerts", "transactions"))
    assert errors == []
    assert expired == [50]
    assert sorted(alert_ids(writer)) == sorted(f"{b}:{i}" for b in range(batches) for i in range(3))
    bronze = writer.arrow("transactions", ["transactionId"]).column("transactionId").to_pylist()
    assert sorted(bronze) == list(range(1_000, 1_000 + batches * 10))
    assert [r.after.files for r in reports[-2:]] == [1, 1]  # each table's small files merged into one


def test_vacuum_and_log_cleanup_leave_the_same_rows(spark, tmp_path):
    """Past the retentions (0 here), VACUUM removes the files compaction replaced and the log keeps a checkpoint and
    the newest entries: Spark and delta-rs read the same rows as before."""
    from fraudrules.config import JobConfig

    cfg = JobConfig(data_dir=str(tmp_path), compact_min_files=0, retention_hours=0, log_retention_days=0)
    writer = tables.writer(spark, cfg)
    tables.ensure(spark, cfg, "alerts")
    for batch in range(8):
        writer.append("alerts", alert_rows(batch), tables.Txn("evaluate:q", batch))
    table_dir = tmp_path / "tables" / "alerts"
    (report,) = maintenance.maintain(None, cfg, ("alerts",))
    assert (report.before.files, report.after.files) == (8, 1)
    assert report.files_vacuumed == 8 and len(list(table_dir.glob("*.parquet"))) == 1
    time.sleep(1.5)  # Delta removes entries older than the retention and than a checkpoint older than it: this one
    (again,) = maintenance.maintain(None, cfg, ("alerts",))
    assert again.after.log_entries < report.before.log_entries
    expected = sorted(f"{b}:{i}" for b in range(8) for i in range(3))
    assert sorted(alert_ids(writer)) == expected
    assert sorted(r.alertId for r in tables.read(spark, cfg, "alerts").collect()) == expected
    writer.append("alerts", alert_rows(7), tables.Txn("evaluate:q", 7))  # the transaction survived the cleanup
    assert len(alert_ids(writer)) == len(expected)


def test_the_ingest_sink_expires_bronze_at_its_first_micro_batch_then_hourly(spark, tmp_path):
    """Bronze retention is the ingest query's: its first micro-batch deletes the rows ingested before the retention,
    later ones within the hour do not look again; its own rows stay."""
    from fraudrules.config import INGEST_QUERY, JobConfig
    from fraudrules.engine.bronze import IngestSink
    from fraudrules.engine.ingest import parse
    from tests.integration.test_event_schema import raw_lines

    valid = json.loads(FIXTURE.read_text().splitlines()[0])  # a transaction of the default event schema

    cfg = JobConfig(data_dir=str(tmp_path), bronze_retention_days=30)
    tables.ensure(spark, cfg, "transactions", "quarantine")
    writer = tables.writer(spark, cfg)
    writer.append("transactions", bronze_rows(0, 5, NOW - timedelta(days=31)))
    os.makedirs(cfg.checkpoint(INGEST_QUERY))
    with open(os.path.join(cfg.checkpoint(INGEST_QUERY), "metadata"), "w") as fh:
        fh.write('{"id": "a-query"}\n')  # what Spark writes at a query's start: its transactions' app id
    sink = IngestSink(cfg, INGEST_QUERY)
    sink(parse(raw_lines(spark, [valid | {"transactionId": 100}])), 0)
    assert writer.arrow("transactions", ["transactionId"]).column("transactionId").to_pylist() == [100]
    writer.append("transactions", bronze_rows(0, 5, NOW - timedelta(days=31)))
    sink(parse(raw_lines(spark, [valid | {"transactionId": 101}])), 1)
    assert writer.count("transactions") == 7  # not again within the hour
