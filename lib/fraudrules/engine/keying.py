"""Dynamic keying (Vol.1): each transaction fans out once per ACTIVE rule, keyed by that rule's fields.

The rules come from a static read of the rules Delta table joined to the stream; Spark re-reads a
Delta table on the static side of a stream-static join at every micro-batch, so a running query
keys by the rules in force at that batch, without a restart.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from fraudrules import tables
from fraudrules.config import JobConfig
from fraudrules.engine.evaluation import KEYED_COLUMNS
from fraudrules.engine.ingest import FIELD_NAMES
from fraudrules.engine.logins import LOGIN_COLUMNS
from fraudrules.rules.codec import active_logins_column, active_windows_column, spec_column
from fraudrules.rules.model import COUNT_FIELDS, LOGIN_RULE

WINDOW_RULE = "WINDOW"

_FILTER_TERM = """
CASE c.op
  WHEN 'EQ' THEN IF(c.numeric, try_cast(fields[c.field] AS DECIMAL(38,10)) = try_cast(c.`values`[0] AS DECIMAL(38,10)),
                    fields[c.field] = c.`values`[0])
  WHEN 'NE' THEN IF(c.numeric, try_cast(fields[c.field] AS DECIMAL(38,10)) != try_cast(c.`values`[0] AS DECIMAL(38,10)),
                    fields[c.field] != c.`values`[0])
  WHEN 'GT' THEN try_cast(fields[c.field] AS DECIMAL(38,10)) > try_cast(c.`values`[0] AS DECIMAL(38,10))
  WHEN 'GE' THEN try_cast(fields[c.field] AS DECIMAL(38,10)) >= try_cast(c.`values`[0] AS DECIMAL(38,10))
  WHEN 'LT' THEN try_cast(fields[c.field] AS DECIMAL(38,10)) < try_cast(c.`values`[0] AS DECIMAL(38,10))
  WHEN 'LE' THEN try_cast(fields[c.field] AS DECIMAL(38,10)) <= try_cast(c.`values`[0] AS DECIMAL(38,10))
  WHEN 'IN' THEN exists(c.`values`, v -> IF(c.numeric,
                    try_cast(fields[c.field] AS DECIMAL(38,10)) = try_cast(v AS DECIMAL(38,10)), fields[c.field] = v))
  WHEN 'NOT_IN' THEN NOT exists(c.`values`, v -> IF(c.numeric,
                    try_cast(fields[c.field] AS DECIMAL(38,10)) = try_cast(v AS DECIMAL(38,10)), fields[c.field] = v))
END
"""


def active_rules(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    """ACTIVE rules, each carrying the whole active set ("ruleId:sig:windowMs,...") and the state epoch."""
    everything = tables.read(spark, cfg, "rules")
    rules = everything.where(f"ruleState = 'ACTIVE' AND coalesce(ruleType, 'WINDOW') = '{WINDOW_RULE}'")
    active_set = rules.agg(active_windows_column().alias("active"))
    epoch = everything.agg(F.coalesce(F.max("epoch"), F.lit(0)).cast("long").alias("current_epoch"))
    return rules.crossJoin(active_set).crossJoin(epoch).drop("epoch").withColumnRenamed("current_epoch", "epoch")


def _passes_filter() -> Column:
    # The common unfiltered rule is decided before the lambda (higher-order functions run uncompiled).
    return F.expr(f"filter IS NULL OR size(filter) = 0 OR forall(filter, c -> coalesce({_FILTER_TERM}, false))")


# The key as a JSON object text; names and values need no escaping (validated field names, numbers, CSH/CRD).
# Spelled out per position rather than with transform(): a lambda would run uncompiled on every keyed row.
_KEY_PART = """concat('"', get(groupingKeyNames, {i}), '":',
                     coalesce(concat('"', fields[get(groupingKeyNames, {i})], '"'), 'null'))"""
_KEY_PARTS = ", ".join(_KEY_PART.format(i=i) for i in range(len(FIELD_NAMES)))
_KEY = f"concat('{{', concat_ws(',', {_KEY_PARTS}), '}}')"


def key_transactions(transactions: DataFrame, rules: DataFrame, shards: int) -> DataFrame:
    """One row per (transaction, ACTIVE rule it passes), with the rule's key, value and shard."""
    joined = transactions.crossJoin(F.broadcast(rules)).where(_passes_filter())
    is_count = F.col("aggregateFieldName").isin(*COUNT_FIELDS)
    raw_value = F.expr("try_cast(fields[aggregateFieldName] AS DECIMAL(38,6))")
    scaled = (raw_value * F.pow(F.lit(10), F.col("scale")).cast("decimal(7,0)")).cast("long")
    uniq = F.when(F.size("unique") > 0, F.xxhash64(F.transform("unique", lambda n: F.col("fields")[n])))
    keyed = joined.select(
        "*",
        F.expr(_KEY).alias("key"),
        F.when(is_count, F.lit(0).cast("long")).otherwise(scaled).alias("val"),
        F.coalesce(uniq, F.lit(0).cast("long")).alias("uniq"),
        spec_column().alias("spec"),
        F.xxhash64("srcName").alias("srcId"),
        F.col("ruleId").cast("long").alias("ruleIdL"),
    ).where(is_count | F.col("val").isNotNull())
    keyed = keyed.drop("ruleId").withColumnRenamed("ruleIdL", "ruleId")
    keyed = keyed.withColumn("shard", F.pmod(F.xxhash64("ruleId", "key"), F.lit(shards)).cast("int"))
    return keyed.select(*KEYED_COLUMNS)


def active_login_rules(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    """ACTIVE login-anomaly rules, each carrying all of them as "ruleId:windowMs,..."."""
    rules = tables.read(spark, cfg, "rules").where(f"ruleState = 'ACTIVE' AND ruleType = '{LOGIN_RULE}'")
    active_set = rules.agg(active_logins_column().alias("active"))
    return rules.crossJoin(active_set)


def key_logins(logins: DataFrame, rules: DataFrame, shards: int) -> DataFrame:
    """Login events fanned out to the ACTIVE detector rules, sharded by (rule, user)."""
    keyed = (
        logins.crossJoin(F.broadcast(rules))
        .select(
            "*",
            F.col("version").alias("ruleVersion"),
            F.xxhash64("srcName").alias("srcId"),
            F.col("ruleId").cast("long").alias("ruleIdL"),
        )
        .drop("ruleId")
        .withColumnRenamed("ruleIdL", "ruleId")
    )
    keyed = keyed.withColumn("shard", F.pmod(F.xxhash64("ruleId", "userId"), F.lit(shards)).cast("int"))
    return keyed.select(*LOGIN_COLUMNS)
