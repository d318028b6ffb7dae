"""Rules that admins edit with SQL in a Delta table (`rules_table`): INSERT, UPDATE, MERGE and DELETE reach the
running job through the table's change feed, each change one rule_history version with the commit it came from,
an invalid row an error naming its column, a replayed micro-batch a no-op; `rules put`, pause and promote write to
the same table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fraudrules import tables
from fraudrules.config import RULES_QUERY, JobConfig
from fraudrules.engine.rule_changes import RuleChangeSink
from fraudrules.engine.sources import change_rows
from fraudrules.event_schema import DEFAULT
from fraudrules.rules import store
from fraudrules.rules import table as rules_table
from fraudrules.rules.model import parse_rule
from tests.integration.test_rules_cdc import _versions
from tests.integration.test_rules_lifecycle import alerted, count_rule, txn
from tests.support.streams import FileStream

pytestmark = pytest.mark.spark

COLUMNS = (
    "ruleId, groupingKeyNames, aggregateFieldName, aggregatorFunctionType, limitOperatorType, `limit`, windowMinutes"
)


def test_sql_edits_reach_the_running_job(spark, tmp_path):
    table = str(tmp_path / "rules_admin")
    name = f"delta.`{table}`"
    rules_table.create(spark, table, [])
    spark.sql(
        f"INSERT INTO {name} ({COLUMNS}) VALUES (1, array('payeeId'), 'COUNT_FLINK', 'SUM', 'GREATER_EQUAL', 2, 60)"
    )
    stream = FileStream(spark, str(tmp_path / "data"), [], rules_table=table).start()  # v1 applied before any event
    try:
        stream.feed([txn(1)])
        stream.feed([txn(2)])  # {1, 2} -> alert under v1

        def edit(sql: str) -> None:
            spark.sql(sql)
            stream.job.rules.processAllAvailable()

        edit(f"UPDATE {name} SET `limit` = 3 WHERE ruleId = 1")  # v2: same windows, a new limit
        stream.feed([txn(3)])  # {1, 2, 3} -> alert under v2
        edit(f"UPDATE {name} SET disabled = true WHERE ruleId = 1")  # v3 PAUSE
        stream.feed([txn(4)])  # paused: not keyed
        edit(  # one commit: rule 1 back (v4, fresh windows) and a rule 2 that is not valid
            f"MERGE INTO {name} t USING (SELECT 1 AS id, false AS off UNION ALL SELECT 2, false) s ON t.ruleId = s.id "
            "WHEN MATCHED THEN UPDATE SET disabled = s.off WHEN NOT MATCHED THEN INSERT "
            f"({COLUMNS}) VALUES (s.id, array('payeeId'), 'COUNT_FLINK', 'SUM', 'GREATER', 1, 0)"
        )
        stream.feed([txn(5)])
        stream.feed([txn(6)])
        stream.feed([txn(7)])  # {5, 6, 7} -> alert under v4
        edit(f"DELETE FROM {name} WHERE ruleId = 1")  # v5 DELETE
        stream.feed([txn(8)])
    finally:
        stream.stop()
    assert alerted(stream) == {(1, 2, 1), (1, 3, 2), (1, 7, 4)}
    assert _versions(spark, stream.cfg) == {
        1: [(1, "ACTIVE"), (2, "ACTIVE"), (3, "PAUSE"), (4, "ACTIVE"), (5, "DELETE")]
    }
    history = sorted(store.history_rows(spark, stream.cfg), key=lambda r: r["version"])
    assert [r["updatedBy"] for r in history] == [
        f"{op} ({table} v{v})" for op, v in (("WRITE", 1), ("UPDATE", 2), ("UPDATE", 3), ("MERGE", 4), ("DELETE", 5))
    ]
    errors = tables.writer(spark, stream.cfg).arrow("rule_errors").to_pylist()
    assert [(e["ruleId"], e["source"], e["reason"]) for e in errors] == [
        ("2", f"{table}@{4:020d}", "column windowMinutes: windowMinutes must be > 0")
    ]


def test_commit_notes_read_from_the_log_say_what_deltas_history_says(spark, tmp_path):
    """A path table's commit notes come from its log files; Delta's history API (what a catalog table's go
    through) must say the same of every commit, or Delta changed what a commit records."""
    from delta.tables import DeltaTable

    table = str(tmp_path / "rules_admin")
    rules_table.create(spark, table, [])
    spark.sql(
        f"INSERT INTO delta.`{table}` ({COLUMNS}) VALUES (1, array('payeeId'), 'COUNT_FLINK', 'SUM', 'GREATER', 1, 1)"
    )
    spark.sql(f"UPDATE delta.`{table}` SET `limit` = 2 WHERE ruleId = 1")
    spark.sql(f"DELETE FROM delta.`{table}` WHERE ruleId = 1")
    history = DeltaTable.forPath(spark, table).history().collect()
    expected = {r.version: r.operation + (f" by {r.userName}" if r.userName else "") for r in history}
    assert expected == {0: "CREATE TABLE", 1: "WRITE", 2: "UPDATE", 3: "DELETE"}
    assert rules_table.commit_notes(spark, table, {1, 2, 3}) == {v: expected[v] for v in (1, 2, 3)}
    assert rules_table.commit_notes(spark, table, {1, 7}) == {1: "WRITE"}  # not in the log: asks Delta, no note


def test_a_replayed_batch_and_duplicate_ids_change_nothing(spark, tmp_path):
    """The rules query's sink over the change feed read in batches: a micro-batch replayed after a crash applies
    nothing again; two rows of one commit with the same id are both refused; changes of one commit are one change
    set (one rule_history commit)."""
    table = str(tmp_path / "rules_admin")
    name = f"delta.`{table}`"
    cfg = JobConfig(data_dir=str(tmp_path / "data"), rules_table=table)
    tables.ensure(spark, cfg)
    checkpoint = Path(cfg.checkpoint(RULES_QUERY))  # rule_errors' transaction is the query's (its id) and batch
    checkpoint.mkdir(parents=True)
    (checkpoint / "metadata").write_text('{"id": "rules-table-test"}\n')
    rules_table.create(spark, table, [])
    row = "array('payeeId'), 'COUNT_FLINK', 'SUM', 'GREATER', 1, 10"
    spark.sql(f"INSERT INTO {name} ({COLUMNS}) VALUES (1, {row}), (2, {row})")  # v1
    spark.sql(f"INSERT INTO {name} ({COLUMNS}) VALUES (3, {row}), (3, {row})")  # v2: rule 3 twice

    def batch(first: int, last: int):
        feed = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", first)
        return change_rows(feed.option("endingVersion", last).load(table), table)

    said: list[str] = []
    sink = RuleChangeSink(cfg, said.append)
    sink(batch(1, 2), 0)
    sink(batch(1, 2), 0)  # replayed
    assert said == [
        "[rules] rules table changes: 2 applied, 2 rejected",
        "[rules] rules table changes: 2 already applied, 2 rejected",
    ]
    history = store.history_rows(spark, cfg)
    assert {r["changeId"] for r in history} == {"delta:1,2:version:1:0"}  # one change set, one commit
    errors = tables.writer(spark, cfg).arrow("rule_errors").to_pylist()
    assert [e["reason"] for e in errors] == ["rule id 3 is on more than one row of " + f"{table}@{2:020d}"] * 2


def test_the_cli_and_notebooks_write_to_the_table(spark, tmp_path):
    """With a rules table, `rules put`, pause, shadow and promote write rows (one commit each) that the job then
    applies: the table stays the one definition. A promotion's two rows (the live rule replaced, the shadow
    deleted) are one commit, applied as one change set."""
    table = str(tmp_path / "rules_admin")
    stream = FileStream(spark, str(tmp_path / "data"), [], rules_table=table)
    rules_table.create(spark, table, [])
    cfg = stream.cfg
    planned = store.upsert(spark, cfg, [parse_rule(count_rule(limit=2), DEFAULT)], author="alice")
    assert [(r["ruleId"], r["version"]) for r in planned] == [(1, 1)]  # what the job will make of it
    assert store.history_rows(spark, cfg) == []  # not applied by the CLI: by the job, from the table
    stream.start()
    try:
        candidate = parse_rule(count_rule(rid=5, limit=3, state="SHADOW", shadowOf=1), DEFAULT)
        store.shadow(spark, cfg, [candidate], author="alice")
        stream.job.rules.processAllAvailable()
        store.promote(spark, cfg, 5, author="alice")
        stream.job.rules.processAllAvailable()
    finally:
        stream.stop()
    rows = {r.ruleId: r for r in spark.read.format("delta").load(table).collect()}
    assert set(rows) == {1} and rows[1]["limit"] == 3  # the shadow's definition under the live rule's id
    assert _versions(spark, cfg) == {1: [(1, "ACTIVE"), (2, "ACTIVE")], 5: [(1, "SHADOW"), (2, "DELETE")]}
    promoted = [r for r in store.history_rows(spark, cfg) if r["version"] == 2]
    assert {r["changeId"] for r in promoted} == {promoted[0]["changeId"]} and len(promoted) == 2
    assert {r["change"] for r in promoted} == {"promote:5"}  # what `rules compare` finds the switch by
    assert json.loads(store.current(spark, cfg)[1]["ruleJson"])["limit"] == "3"


def test_run_makes_a_missing_rules_table_and_never_overwrites_one(spark, tmp_path):
    """`fraudrules run --rules-table T --rules FILE` (`run.prepare`): T made with the file's rules when missing; an
    existing table is the admins', and the file is not loaded into it."""
    from fraudrules.engine import run

    table = str(tmp_path / "rules_admin")
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps([count_rule(rid=1), count_rule(rid=2)]))
    cfg = JobConfig(data_dir=str(tmp_path / "data"), rules_table=table)
    said: list[str] = []
    run.prepare(spark, cfg, str(rules_file), said.append)
    rules_file.write_text(json.dumps([count_rule(rid=3)]))
    run.prepare(spark, cfg, str(rules_file), said.append)
    assert sorted(r.ruleId for r in spark.read.format("delta").load(table).collect()) == [1, 2]
    assert f"created the rules table {table} (change data feed on) with 2 rules from {rules_file}" in said
    assert said[-1] == f"rules from the rules table {table}; {rules_file} not loaded"
    assert store.history_rows(spark, cfg) == []  # the job applies them, from the table's change feed
