"""Outages survived: the continuous job (`fraudrules run --no-generator`, a child process) through a Kafka broker
stopped and started again, the `alerts` table's storage unwritable, and another process appending to and compacting
`alerts` (`tools/support/faults.py`). It restarts itself where it fails, and its alerts equal a backtest of the
same input: none lost, none twice."""

from __future__ import annotations

import os
import shutil

import pytest

from tools.support.crash_demo import Demo, Report
from tools.support.faults import CLIENT_TIMEOUTS, Faults
from tools.support.kafka_broker import start_local_broker

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(shutil.which("java") is None, reason="needs a JVM")]
OUTAGE_S = 15.0


def _demo(tmp_path, source: str = "files") -> Demo:
    return Demo(root=str(tmp_path / "demo"), count=300, logins_count=120, per_file=100, seed=5, source=source)


def _compare(demo: Demo, faults: list[str], request) -> Report:
    """The job's tables against a backtest of the same input: every alert once, the input reconciled."""
    spark = request.getfixturevalue("spark")  # only now: no second Spark while the child runs
    report = demo.compare(spark, Report(faults=faults))
    print(report.summary())
    for o in report.outcomes:
        assert o.expected > 0 and o.found == o.expected, o.line()
        assert (o.lost, o.duplicated, o.unexpected, o.different) == (0, 0, 0, 0), o.line()
    assert report.reconciled, "\n".join(report.reconciliation)
    assert report.ok
    return report


@pytest.mark.kafka
def test_a_broker_outage_fails_the_queries_and_the_job_restarts_them(tmp_path, request):
    demo = _demo(tmp_path, source="kafka").prepare()
    broker = start_local_broker(str(tmp_path / "kafka"))
    try:
        demo.use_broker(broker.bootstrap)
        demo.kafka_options = CLIENT_TIMEOUTS  # the outage fails a query within seconds
        faults = Faults(demo, broker, outage_s=OUTAGE_S)
        lines = faults.run(("broker",))
        assert "the job failed" in lines[0] and "TimeoutException" in lines[0], lines
        assert faults.restarts() >= 1, demo.log_tail(0, 80)
        report = _compare(demo, lines, request)
    finally:
        broker.stop()
    assert report.kafka_lines and report.kafka_lines[0].endswith(" 0 missing"), report.kafka_lines


def test_unwritable_alerts_storage_then_a_concurrent_writer_cost_no_alert(tmp_path, request):
    """One job through both (a job's start and a backtest less than a test each): the alerts table's storage made
    unwritable fails the committer and a restart commits its outbox; then another process appends to and compacts
    `alerts` while the job writes to it."""
    demo = _demo(tmp_path).prepare()
    faults = Faults(demo, outage_s=OUTAGE_S)
    storage, writer = faults.run(("storage", "writer"))
    assert "the job failed" in storage and "Operation not permitted" in storage, storage
    assert faults.restarts() >= 1, demo.log_tail(0, 80)
    outbox = os.path.join(demo.job_cfg.checkpoint("evaluate"), "outbox")
    assert not [n for n in os.listdir(outbox) if n.endswith(".done")]  # all committed once storage came back
    assert demo.foreign_rows >= 300, writer  # at least 6 appends of 50 rows, 3 compactions
    report = _compare(demo, [storage, writer], request)
    n = demo.foreign_rows
    assert f"the other writer's rows in alerts: {n} appended, {n} found ({n} distinct)" in report.reconciliation
