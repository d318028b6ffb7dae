"""Raw records in (`sources.py`), typed transactions and login events or quarantine reasons out.

Every record keeps its source position (file and line, or topic-partition and offset), which also
defines "source order" for events with equal eventTime.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from fraudrules.rules.model import PAYMENT_TYPES

MAX_EVENT_TIME_MS = 4_102_444_800_000  # 2100-01-01: anything later (or negative) is not a real payment time
MAX_AMOUNT = 10**16  # exclusive; amounts are evaluated as whole cents in 64-bit integers
RAW_COLUMNS = ("value", "srcTime", "srcName", "srcPos")


TEXT_SCHEMA = (
    "transactionId string, eventTime string, payeeId string, beneficiaryId string, paymentAmount string, "
    "paymentType string, ingestionTimestamp string"
)
FIELD_NAMES = tuple(part.split()[0] for part in TEXT_SCHEMA.split(", "))


def _with_json(raw: DataFrame, schema: str) -> DataFrame:
    """The raw columns plus `j`, the record parsed once.

    Parsed inside a generator on purpose: as a plain column, the optimizer inlines `from_json` into
    every expression and filter that reads `j` (a dozen parses per record, uncompiled); a filter
    cannot be pushed below a generator's output.
    """
    return raw.select(*RAW_COLUMNS, F.inline(F.array(F.struct(F.from_json("value", schema).alias("j")))))


def _long(name: str) -> Column:
    return F.expr(f"try_cast(trim(j.{name}) AS BIGINT)")


def parse(raw: DataFrame) -> DataFrame:
    """Typed transactions plus `error` (null when the record is valid).

    Every field is read as text first (JSON numbers and numeric strings are both accepted), then
    cast; `fields` keeps the text of every transaction field for rules that name fields dynamically.
    The raw record keeps any extra fields.
    """
    df = _with_json(raw, TEXT_SCHEMA)
    amount = F.expr("try_cast(trim(j.paymentAmount) AS DECIMAL(38,10))")
    typed = df.select(
        *RAW_COLUMNS,
        "j",
        F.create_map(*[x for n in FIELD_NAMES for x in (F.lit(n), F.col(f"j.{n}"))]).alias("fields"),
        _long("transactionId").alias("transactionId"),
        _long("eventTime").alias("eventTime"),
        _long("payeeId").alias("payeeId"),
        _long("beneficiaryId").alias("beneficiaryId"),
        amount.alias("amount10"),
        F.col("j.paymentType").alias("paymentType"),
        _long("ingestionTimestamp").alias("ingestionTimestamp"),
    )
    j = F.col("j")
    checks: list[tuple[Column, str]] = [(_not_object(j), "malformed JSON: not a JSON object")]
    for name in ("transactionId", "eventTime", "payeeId", "beneficiaryId", "paymentAmount", "paymentType"):
        checks.append((j[name].isNull(), f"missing {name}"))
    for name in ("transactionId", "eventTime", "payeeId", "beneficiaryId"):
        checks.append((F.col(name).isNull(), f"{name} is not an integer"))
    checks += [
        (F.col("amount10").isNull(), "paymentAmount is not a number"),
        (F.col("amount10") != F.round("amount10", 2), "paymentAmount has more than 2 decimal places"),
        (F.abs("amount10") >= F.lit(MAX_AMOUNT), "paymentAmount out of range"),
        (~F.col("paymentType").isin(*PAYMENT_TYPES), "unknown paymentType (expected CSH or CRD)"),
        ((F.col("eventTime") < 0) | (F.col("eventTime") > MAX_EVENT_TIME_MS), "eventTime out of range"),
        (
            j["ingestionTimestamp"].isNotNull() & F.col("ingestionTimestamp").isNull(),
            "ingestionTimestamp is not an integer",
        ),
    ]
    return typed.select(
        "*",
        F.expr("try_cast(amount10 AS DECIMAL(20,2))").alias("paymentAmount"),
        _reason(checks).alias("error"),
    ).drop("amount10", "j")


LOGIN_SCHEMA = "userId string, eventType string, ipAddress string, eventTimestamp string, ingestionTimestamp string"
EVENT_TYPES = ("FAIL", "SUCCESS")


def _reason(checks: list[tuple[Column, str]]) -> Column:
    """The first failing check's reason, or null."""
    error = F.lit(None).cast("string")
    for cond, reason in reversed(checks):
        error = F.when(cond, F.lit(reason)).otherwise(error)
    return error


def parse_logins(raw: DataFrame) -> DataFrame:
    """Typed login events plus `error` (null when valid)."""
    df = _with_json(raw, LOGIN_SCHEMA)
    typed = df.select(
        *RAW_COLUMNS,
        "j",
        _long("userId").alias("userId"),
        F.col("j.eventType").alias("eventType"),
        F.trim("j.ipAddress").alias("ipAddress"),
        _long("eventTimestamp").alias("eventTimestamp"),
        _long("ingestionTimestamp").alias("ingestionTimestamp"),
    )
    j = F.col("j")
    checks = [(_not_object(j), "malformed JSON: not a JSON object")]
    checks += [(j[n].isNull(), f"missing {n}") for n in ("userId", "eventType", "ipAddress", "eventTimestamp")]
    checks += [
        (F.col("userId").isNull(), "userId is not an integer"),
        (F.col("eventTimestamp").isNull(), "eventTimestamp is not an integer"),
        (~F.col("eventType").isin(*EVENT_TYPES), "unknown eventType (expected FAIL or SUCCESS)"),
        (F.col("ipAddress") == "", "empty ipAddress"),
        ((F.col("eventTimestamp") < 0) | (F.col("eventTimestamp") > MAX_EVENT_TIME_MS), "eventTimestamp out of range"),
        (
            j["ingestionTimestamp"].isNotNull() & F.col("ingestionTimestamp").isNull(),
            "ingestionTimestamp is not an integer",
        ),
    ]
    return typed.withColumn("error", _reason(checks)).drop("j")


def _not_object(j: Column) -> Column:
    return j.isNull() | ~F.ltrim("value").startswith("{") | ~F.rtrim("value").endswith("}")


def with_defaults(parsed: DataFrame) -> DataFrame:
    """Every row, with a missing ingestionTimestamp as -1."""
    return parsed.withColumn("ingestionTimestamp", F.coalesce("ingestionTimestamp", F.lit(-1).cast("long")))


def valid(parsed: DataFrame) -> DataFrame:
    """Rows that passed every check, with a missing ingestionTimestamp as -1."""
    return with_defaults(parsed.where(F.col("error").isNull()))
