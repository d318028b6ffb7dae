"""Tables as created by the job: what Delta reads back from a path table's first commit."""

from __future__ import annotations

import pytest

from fraudrules import tables
from fraudrules.config import JOB_TABLES, JobConfig

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
