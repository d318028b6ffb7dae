"""The job's streaming query listener on a real query: every micro-batch's progress reaches it (as JSON, one call
into the JVM each), and so do the query's start and end."""

from __future__ import annotations

import pytest

from fraudrules.config import EVALUATE_QUERY
from fraudrules.engine.progress import ProgressPrinter

pytestmark = pytest.mark.spark


def test_the_listener_hears_each_micro_batch_of_a_query(spark, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    for i in range(3):
        (source / f"{i}.txt").write_text(f"line {i}\n")
    lines: list[str] = []
    listener = ProgressPrinter(lines.append)
    spark.streams.addListener(listener)
    try:
        query = (
            spark.readStream.option("maxFilesPerTrigger", 1)
            .text(str(source))
            .writeStream.queryName(EVALUATE_QUERY)
            .format("noop")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        assert listener.wait_ended([EVALUATE_QUERY], timeout_s=30) == []
    finally:
        spark.streams.removeListener(listener)
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert len(batches) == 3
    assert listener.take_durations()[EVALUATE_QUERY] == [float(p["batchDuration"]) for p in query.recentProgress]
    assert lines[0] == f"[{EVALUATE_QUERY}] started"
    assert lines[1].startswith(f"[{EVALUATE_QUERY}] first micro-batch done in ")
    assert lines[-1] == f"[{EVALUATE_QUERY}] stopped"
