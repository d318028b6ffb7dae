"""The committer with a publisher (an alerts topic configured): a micro-batch stays in the outbox until both Delta
and the topic have it, so that a crash before the publish loses no alert from the topic."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid

import pyarrow as pa
import pytest

from fraudrules import tables
from fraudrules.config import EVALUATE_QUERY, JobConfig
from fraudrules.engine.committer import Committer
from fraudrules.engine.outbox import OUTBOX

pytestmark = pytest.mark.spark

ALERT = {
    "alertId": "1:42",
    "kind": "WINDOW",
    "ruleId": 1,
    "ruleVersion": 1,
    "transactionId": 42,
    "key": '{"payeeId":"3"}',
    "groupingKeyNames": ["payeeId"],
    "aggregate": "2",
    "windowMinutes": 10,
    "eventTimeMs": 1_000,
    "producedAtMs": 2_000,
    "publishedAtMs": 2_000,
    "batchId": 0,
}


def test_a_batch_leaves_the_outbox_once_delta_and_the_topic_have_it(spark, tmp_path):
    cfg = JobConfig(data_dir=str(tmp_path))
    tables.ensure(spark, cfg)
    os.makedirs(cfg.checkpoint(EVALUATE_QUERY))
    with open(os.path.join(cfg.checkpoint(EVALUATE_QUERY), "metadata"), "w") as fh:  # as the query's first start
        fh.write(json.dumps({"id": str(uuid.uuid4())}) + "\n")
    gate, published = threading.Event(), []

    def publish(rows: pa.Table) -> None:  # the Kafka write, held until the test lets it go
        assert gate.wait(60)
        published.append(rows.column("alertId").to_pylist())

    committer = Committer(spark, cfg, EVALUATE_QUERY, None, publish=publish)
    rows = pa.Table.from_pylist([ALERT], schema=OUTBOX["alerts"])
    committer.publisher.submit(0, rows)
    committer.outbox.put(0, {"alerts": rows})

    committer.commit_pending()  # Delta has the batch, the topic not yet
    assert [r.alertId for r in tables.read(spark, cfg, "alerts").collect()] == ["1:42"]
    assert committer.outbox.pending() == [0] and published == []

    gate.set()
    committer.stop()
    assert published == [["1:42"]] and committer.outbox.pending() == []
    assert tables.read(spark, cfg, "alerts").count() == 1  # committed once


def test_after_a_failure_a_committer_that_cannot_write_ends_at_once_and_its_outbox_is_committed_later(spark, tmp_path):
    """The stop after a failure waits neither for a broker that does not take the alerts nor for storage that
    refuses the commit (the alerts table's Delta log made immutable): it says so, and the next start commits the
    outbox."""
    cfg = JobConfig(data_dir=str(tmp_path))
    tables.ensure(spark, cfg)
    os.makedirs(cfg.checkpoint(EVALUATE_QUERY))
    with open(os.path.join(cfg.checkpoint(EVALUATE_QUERY), "metadata"), "w") as fh:
        fh.write(json.dumps({"id": str(uuid.uuid4())}) + "\n")
    cancelled, said = threading.Event(), []

    class Producer:  # a broker that is down: a publish waits until it is cancelled
        def __call__(self, rows: pa.Table) -> None:
            assert cancelled.wait(60)
            raise RuntimeError("1 of 1 alerts not delivered to alerts: Local: Purged in queue")

        def cancel(self) -> None:
            cancelled.set()

        def close(self) -> None:
            pass

    committer = Committer(spark, cfg, EVALUATE_QUERY, said.append, publish=Producer())
    rows = pa.Table.from_pylist([ALERT], schema=OUTBOX["alerts"])
    committer.publisher.submit(0, rows)
    committer.outbox.put(0, {"alerts": rows})
    log = os.path.join(cfg.table("alerts"), "_delta_log")
    subprocess.run(["chattr", "+i", log], check=True)
    try:
        started = time.monotonic()
        committer.stop(failed=True)
        assert time.monotonic() - started < 30
    finally:
        subprocess.run(["chattr", "-i", log], check=True)
    assert len(said) == 1 and "results stay in the outbox for the next start" in said[0], said
    assert "Operation not permitted" in said[0]
    assert committer.outbox.pending() == [0] and tables.read(spark, cfg, "alerts").count() == 0

    again = Committer(spark, cfg, EVALUATE_QUERY, None)  # the next start
    again.commit_pending()
    assert [r.alertId for r in tables.read(spark, cfg, "alerts").collect()] == ["1:42"]
