"""An available-now run of the job ends whole: results committed once, committers gone."""

from __future__ import annotations

import pytest

from fraudrules import tables
from fraudrules.config import EVALUATE_QUERY, JobConfig
from fraudrules.engine import job, lines
from fraudrules.generator import Workload, write_jsonl
from fraudrules.rules import store
from fraudrules.rules.model import load_rules_file
from tools.support.real_tables import RULES

pytestmark = pytest.mark.spark


def test_wait_commits_every_batch_once_and_ends_the_committers(spark, tmp_path):
    cfg = JobConfig(data_dir=str(tmp_path), available_now=True, max_records_per_trigger=300)
    tables.ensure(spark, cfg)
    store.upsert(spark, cfg, load_rules_file(str(RULES)), "test")
    write_jsonl(cfg.landing, Workload(count=900).transactions(), per_file=300)
    running = job.start(spark, cfg, printer=None, names=(EVALUATE_QUERY,))
    running.wait()
    assert not [c.name for c in running.committers if c.is_alive()]
    beats = tables.read(spark, cfg, "batches").where(f"query = '{EVALUATE_QUERY}'").select("batchId").collect()
    ran = sorted({p.batchId for p in running.evaluate.recentProgress})
    assert ran == [0, 1, 2]  # one per 300 records (one file each); no watermark, so no no-data batch
    assert sorted(r.batchId for r in beats) == ran
    alerts = tables.read(spark, cfg, "alerts")
    assert alerts.count() == alerts.select("alertId").distinct().count() > 0


def _stateful_plans(running: job.Job, names: tuple[str, ...]) -> dict[str, str]:
    return {n: running.by_name[n]._jsq.explainInternal(False) for n in names}


@pytest.mark.parametrize("available_now", [False, True], ids=["continuous", "available-now"])
def test_with_one_state_partition_only_available_now_runs_shuffle_before_the_stateful_operators(
    spark, tmp_path, available_now
):
    """The continuous job reads, parses and evaluates a micro-batch in one stage (a shuffle would add a second
    stage to every micro-batch); an available-now run's large micro-batches are parsed on every core first."""
    cfg = JobConfig(data_dir=str(tmp_path), available_now=available_now, logins=True)
    tables.ensure(spark, cfg)
    store.upsert(spark, cfg, load_rules_file(str(RULES)), "test")
    write_jsonl(cfg.landing, Workload(count=300).transactions(), per_file=100)
    names = (EVALUATE_QUERY,)
    running = job.start(spark, cfg, printer=None, names=names)
    try:
        running.wait() if available_now else running.process_all_available()
        plans = _stateful_plans(running, names)
    finally:
        running.stop()
    for name, plan in plans.items():
        assert "TransformWithStateInPySpark" in plan, name
        assert ("Exchange" in plan) == available_now, name
        assert ("Coalesce 1" in plan) != available_now, name


@pytest.mark.parametrize("source", ["files", "kafka"])
def test_warm_up_registers_the_file_source_only_for_a_job_that_reads_files(spark, tmp_path, source):
    """The warm-up's registration is what the file source's queries find done; a Kafka job reads no files."""
    kafka = {"kafka_bootstrap": "localhost:9092"} if source == "kafka" else {}  # never connected to here
    cfg = JobConfig(data_dir=str(tmp_path), source=source, **kafka)
    session = spark.newSession()  # Python data sources are registered per session
    tables.ensure(session, cfg)
    for future in job.warm_up(session, cfg):
        future.result()
    registered = session._jsparkSession.sessionState().dataSourceManager().dataSourceExists(lines.NAME)
    assert registered == (source == "files")
