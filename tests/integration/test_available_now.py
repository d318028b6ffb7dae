"""An available-now run of the job ends whole: results committed once, committers gone."""

from __future__ import annotations

import pytest

from fraudrules import tables
from fraudrules.config import EVALUATE_QUERY, JobConfig
from fraudrules.engine import job
from fraudrules.generator import Workload, write_jsonl
from fraudrules.rules import store
from fraudrules.rules.model import load_rules_file
from tests.support.real_tables import RULES

pytestmark = pytest.mark.spark


def test_wait_commits_every_batch_once_and_ends_the_committers(spark, tmp_path):
    cfg = JobConfig(data_dir=str(tmp_path), available_now=True, max_files_per_trigger=1)
    tables.ensure(spark, cfg)
    store.upsert(spark, cfg, load_rules_file(str(RULES)), "test")
    write_jsonl(cfg.landing, Workload(count=900).transactions(), per_file=300)
    running = job.start(spark, cfg, printer=None, names=(EVALUATE_QUERY,))
    running.wait()
    assert not [c.name for c in running.committers if c.is_alive()]
    beats = tables.read(spark, cfg, "batches").where(f"query = '{EVALUATE_QUERY}'").select("batchId").collect()
    ran = sorted({p.batchId for p in running.evaluate.recentProgress})
    assert ran[:3] == [0, 1, 2]  # one per file, then the watermark's no-data batch
    assert sorted(r.batchId for r in beats) == ran
    alerts = tables.read(spark, cfg, "alerts")
    assert alerts.count() == alerts.select("alertId").distinct().count() > 0
