"""Every use of a third-party internal, one module per dependency, each guarded and each with a test that fails by
name on an upgrade that breaks it (docs/operations.md "Upgrading PySpark, Delta, Great Expectations"):

- `pyspark`: PySpark's private modules (transformWithStateInPandas input regrouping, map state writes, the query
  listener bridge), only on the release they reproduce, PySpark's own code elsewhere;
- `spark_jvm`: Spark's JVM through py4j (a Python data source's environment race, the checkpoint file manager
  class, the JVM process);
- `spark_checkpoint`: Spark's streaming checkpoint logs, the one reader of them;
- `delta_log`: Delta's transaction log read without a JVM, and a path table's first commit written by hand;
- `great_expectations`: the GX internals the data-quality sources are built on.

Nothing here imports the rest of the package but `config.on_databricks`: every layer may use it.
"""
