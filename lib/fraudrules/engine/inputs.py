"""The stateful stages' input: events and rule changes in one stream, rule changes broadcast to every shard.

One stateful query evaluates both detectors. Every transaction and every login event goes to every shard (as
narrow rows); each shard keys the transactions by the window rules it holds and keeps the groups it owns
(`keying`), and takes the login events of the users it owns. Rule changes come from streaming the append-only
`rule_history` table.

Shards are labelled so that Spark's hash partitioning puts shard i in partition i mod partitions: no
two shards share a task while a core is idle.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from fraudrules import tables
from fraudrules.config import JobConfig
from fraudrules.engine import ingest
from fraudrules.event_schema import DEFAULT, MASK_BITS, EventSchema, Field, mask_bit
from fraudrules.rules.codec import RULE_CHANGE, change_column

LOGIN_FIELDS = {  # login event field → Spark type, as the login detector reads it
    "userId": "long",
    "eventType": "string",
    "ipAddress": "string",
    "eventTimestamp": "long",
    "ingestionTimestamp": "long",
}


def _murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's Murmur3 hash of an int column (what HashPartitioning partitions by)."""

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k = rotl((value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF, 15) * 0x1B873593 & 0xFFFFFFFF
    h = (rotl(seed ^ k, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h ^= 4
    for shift, mul in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
        h = (h ^ (h >> shift)) * mul & 0xFFFFFFFF
    h ^= h >> 16
    return h - (1 << 32) if h >= 1 << 31 else h


def shard_labels(shards: int, partitions: int) -> list[int]:
    """Grouping values for shards 0..shards-1 such that shard i lands in partition i mod partitions."""
    labels: list[int] = []
    candidate = 0
    for i in range(shards):
        while _murmur3_int(candidate) % partitions != i % partitions or candidate in labels:
            candidate += 1
        labels.append(candidate)
        candidate = 0
    return labels


def _no_rule() -> Column:
    return F.lit(None).cast("string").alias(RULE_CHANGE)


def _absent(name: str, kind: str) -> Column:
    """An event column a row has no value for: 0 (numbers) or null (text), so that every numeric column of the
    stateful input stays non-null and reaches pandas as exact integers."""
    return F.lit(None if kind == "string" else 0).cast(kind).alias(name)


def _to_all(df: DataFrame, labels: list[int]) -> DataFrame:
    return df.withColumn("shard", F.explode(F.array(*[F.lit(label) for label in labels])))


def rule_changes(spark: SparkSession, cfg: JobConfig, event_columns: dict[str, str]) -> DataFrame:
    """The rule-change stream as input rows: the rule columns, event columns zero/null."""
    history = tables.read_stream(spark, cfg, "rule_history")
    return history.select(*[_absent(name, kind) for name, kind in event_columns.items()], change_column())


def _coded(f: Field) -> Column:
    """A typed field as the exact 64-bit integer keying reads: decimals scaled by their declared scale, booleans as
    0/1, declared string values as their position; 0 where null (the null masks say so)."""
    col = F.col(f.path)
    if f.values:
        col = F.array_position(F.array(*[F.lit(v) for v in f.values]), col) - 1
    elif f.kind == "decimal":
        col = col * 10**f.scale
    return F.coalesce(col.cast("long"), F.lit(0).cast("long")) if f.nullable else col.cast("long")


def _null_masks(schema: EventSchema) -> list[Column]:
    """A nullable coded field's `mask_bit` set in its `mask_column` where it is null."""
    nullable = [f for f in schema.fields.values() if f.null_bit >= 0]
    bits = [F.when(F.col(f.path).isNull(), F.lit(mask_bit(f.null_bit))).otherwise(F.lit(0)) for f in nullable]
    masks: list[Column] = []
    for k, name in enumerate(schema.mask_columns):
        column = bits[k * MASK_BITS : (k + 1) * MASK_BITS]
        masks.append(sum(column[1:], column[0]).cast("long").alias(name))
    return masks


def _source() -> list[Column]:
    """A record's place in its source as the engine reads it (`SOURCE_COLUMNS`): time, source id, position."""
    return [F.col("srcTime").cast("long"), F.xxhash64("srcName").alias("srcId"), F.col("srcPos").cast("long")]


def numeric(tx: DataFrame, schema: EventSchema = DEFAULT) -> DataFrame:
    """Typed transactions as the flat columns keying reads (`EventSchema.engine_columns`): every declared field,
    nested ones included, as an exact integer (`_coded`) or as text, the null masks, the source position."""
    fields = [(_coded(f) if f.coded else F.col(f.path).cast("string")).alias(f.column) for f in schema.fields.values()]
    return tx.select(*fields, *_null_masks(schema), *_source())


def login_column(name: str) -> str:
    """A login field's column in the detectors' input: apart from the transaction fields, whatever they are named."""
    return f"login_{name}"


LOGIN_COLUMNS = {login_column(n): kind for n, kind in LOGIN_FIELDS.items()}


def _aligned(df: DataFrame, columns: dict[str, str]) -> DataFrame:
    """`df` with exactly `columns` (name → Spark type), in order, those it lacks `_absent`."""
    return df.select(*[F.col(name) if name in df.columns else _absent(name, kind) for name, kind in columns.items()])


def transactions(raw: DataFrame, schema: EventSchema = DEFAULT) -> DataFrame:
    """Valid transactions as keying reads them."""
    return numeric(ingest.valid(ingest.parse(raw, schema)), schema)


def logins(raw: DataFrame) -> DataFrame:
    """Valid login events: the login fields (`login_column`) and the source position, as transactions have it."""
    events = ingest.valid(ingest.parse_logins(raw))
    return events.select(*[F.col(n).cast(k).alias(login_column(n)) for n, k in LOGIN_FIELDS.items()], *_source())


def detector_input(
    spark: SparkSession,
    cfg: JobConfig,
    raw_transactions: DataFrame,
    raw_logins: DataFrame | None,
    labels: list[int],
    schema: EventSchema = DEFAULT,
) -> DataFrame:
    """Transactions, login events (when `raw_logins` is given) and rule changes, all to every shard: each shard
    keys the transactions by the rules it holds and keeps the groups it owns, takes the login events of the users it
    owns, and sees every event's time, from which each detector keeps its own watermark (`processors`). No Spark
    watermark: Spark would keep one for both streams, and would drop late rows before they are reported."""
    columns = schema.engine_columns()
    events = transactions(raw_transactions, schema)
    if raw_logins is not None:
        columns = {**columns, **LOGIN_COLUMNS}
        events = _aligned(events, columns).unionByName(_aligned(logins(raw_logins), columns))
    rows = _to_all(events.select("*", _no_rule()), labels)
    return _one_stage(rows.unionByName(_to_all(rule_changes(spark, cfg, columns), labels)), cfg)


def _one_stage(df: DataFrame, cfg: JobConfig) -> DataFrame:
    """The continuous job with one state partition: the input coalesced into one partition, which already has
    the distribution the stateful operator requires, so that reading, parsing and evaluating a micro-batch are
    one stage and one task (no shuffle, no second stage to schedule: the median micro-batch at 1,000 tx/s took
    248-262 ms instead of 276-282 ms). Available-now runs keep the shuffle: their micro-batches are large and are
    parsed on every core (a 200,000-transaction backtest: 16.1-17.3 s, against 16.5-17.9 s in one task)."""
    return df.coalesce(1) if cfg.shuffle_partitions == 1 and not cfg.available_now else df
