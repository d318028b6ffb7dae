"""Spark's checkpoint as `compat/spark_checkpoint.py` reads it, on the logs of a stateful query this Spark ran: an
upgrade that changes the offset log's layout, or the state data source's error for an unknown variable, fails here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from pyspark.errors import PySparkException
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import LongType, StructField, StructType

from fraudrules.compat import spark_checkpoint
from fraudrules.engine import sources
from fraudrules.engine.lines import open_fs
from fraudrules.engine.shard_values import read_state

pytestmark = pytest.mark.spark

SEEN = StructType([StructField("n", LongType())])


class _Count(StatefulProcessor):
    """Rows seen per key, in a value state `seen`."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.seen = handle.getValueState("seen", SEEN)

    def handleInputRows(self, key, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:
        n = (self.seen.get() or (0,))[0] + sum(len(frame) for frame in rows)
        self.seen.update((n,))
        yield pd.DataFrame({"srcPos": [n]})

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def checkpoint(spark, tmp_path_factory) -> str:
    """The checkpoint of one micro-batch of a transformWithStateInPandas query over two lines."""
    root = tmp_path_factory.mktemp("checkpoint_logs")
    (root / "in").mkdir()
    (root / "in" / "a.json").write_text('{"a": 1}\n{"a": 2}\n')
    cp = str(root / "cp")
    rows = sources.file_source(spark, str(root / "in"), cp).groupBy("srcName")
    counted = rows.transformWithStateInPandas(_Count(), "srcPos long", "Append", "None")
    query = counted.writeStream.format("memory").queryName("checkpoint_logs").trigger(availableNow=True)
    query.option("checkpointLocation", cp).start().awaitTermination()
    assert spark.table("checkpoint_logs").count() == 1
    return cp


def test_the_logs_of_a_query_read_as_its_batches_sources_and_time(checkpoint):
    fs, root = open_fs(checkpoint)
    assert spark_checkpoint.logged_batches(fs, root, "offsets") == [0]
    assert spark_checkpoint.newest_committed(fs, root) == 0
    metadata, offsets = spark_checkpoint.planned(fs, root, 0)
    assert metadata["batchTimestampMs"] > 0
    assert offsets == ['{"file": 1, "byte": 0, "line": 0}']  # one source, past its one file


def test_an_offset_log_of_another_version_is_refused_not_misread(checkpoint, tmp_path):
    logged = (Path(checkpoint) / "offsets" / "0").read_text()
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text(logged.replace("v1", "v2", 1))
    with pytest.raises(spark_checkpoint.CheckpointFormatError, match="offset log 'v2', this release reads 'v1'"):
        spark_checkpoint.planned(*open_fs(str(tmp_path)), 0)


def test_the_state_data_source_says_which_variables_a_checkpoint_lacks(spark, checkpoint):
    assert read_state(spark, checkpoint, "seen").count() == 1
    with pytest.raises(PySparkException) as refused:
        read_state(spark, checkpoint, "shard").count()
    assert spark_checkpoint.missing_state_variable(refused.value)


def test_a_delta_sources_end_offset_reads_as_the_versions_it_has_read_whole(spark, tmp_path):
    table, cp = str(tmp_path / "table"), str(tmp_path / "cp")
    spark.range(2).repartition(2).write.format("delta").save(table)  # version 0: two files (the starting snapshot)

    def through() -> list[int]:
        query = spark.readStream.format("delta").load(table).writeStream.format("noop").trigger(availableNow=True)
        query.option("checkpointLocation", cp).start().awaitTermination()
        fs, root = open_fs(cp)
        batches = sorted(spark_checkpoint.logged_batches(fs, root, "offsets"))
        return [spark_checkpoint.delta_read_through(spark_checkpoint.planned(fs, root, b)[1][0]) for b in batches]

    assert through() == [0]
    for _ in range(2):  # versions 1 and 2, of two files each, read by the next run
        spark.range(2).repartition(2).write.format("delta").mode("append").save(table)
    assert through() == [0, 2]
    with pytest.raises(spark_checkpoint.CheckpointFormatError, match="not a Delta source offset"):
        spark_checkpoint.delta_read_through('{"file": 1, "byte": 0, "line": 0}')
