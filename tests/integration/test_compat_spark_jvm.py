"""Spark's JVM internals the job reaches through py4j (`fraudrules.compat.spark_jvm`): each still where it was,
and still doing what the workaround expects of it; a Spark upgrade that moves one fails here, by name."""

from __future__ import annotations

import pytest

from fraudrules.compat import spark_jvm as spark_compat
from fraudrules.engine import lines, sources

pytestmark = pytest.mark.spark


def _env(spark):
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    return manager.lookupDataSource(lines.NAME).dataSourceCls().envVars()


def test_a_query_on_the_lines_source_leaves_its_environment_as_registered(spark, tmp_path):
    """Registered, the source's environment holds what its streaming runner puts; a query's runner then replaces
    values only (the same ones): the map every read task carries keeps its shape while tasks are serialized."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('{"a": 1}\n{"a": 2}\n')
    df = sources.file_source(spark, str(tmp_path / "in"), str(tmp_path / "cp"))
    env = _env(spark)
    expected = spark_compat.runner_env(spark)
    assert {k: env.get(k) for k in spark_compat.RUNNER_ENV} == expected
    before = dict(env)
    query = df.writeStream.format("memory").queryName("lines_env").trigger(availableNow=True)
    query = query.option("checkpointLocation", str(tmp_path / "cp")).start()
    query.awaitTermination()
    assert spark.table("lines_env").count() == 2
    assert dict(_env(spark)) == before  # the runner put nothing new, and changed no value


def test_local_sessions_name_a_checkpoint_file_manager_this_spark_has(spark):
    assert spark.conf.get("spark.sql.streaming.checkpointFileManagerClass") == spark_compat.CHECKPOINT_FILES
    assert spark._jvm.java.lang.Class.forName(spark_compat.CHECKPOINT_FILES).getName() == spark_compat.CHECKPOINT_FILES


def test_the_driver_jvm_has_what_ignoring_sigterm_calls(spark):
    """`ignore_sigterm` (what `fraudrules run` calls) names the JDK's `sun.misc.Signal` and its SIG_IGN handler;
    checked without calling it, which would leave the tests' JVM deaf to SIGTERM. tests/e2e/test_cli.py sends a
    job's process group SIGTERM."""
    jvm = spark_compat.jvm_of(spark)
    assert jvm.sun.misc.Signal("TERM").getName() == "TERM"
    assert str(jvm.sun.misc.SignalHandler.SIG_IGN) == "SIG_IGN"
