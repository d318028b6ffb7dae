"""Raw records in (`sources.py`), typed transactions and login events or quarantine reasons out.

Every record keeps its source position (file and line, or topic-partition and offset), which also
defines "source order" for events with equal eventTime.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from fraudrules.event_schema import DEFAULT, ID, INGESTED, TIME, EventSchema, Field, Node, quote

MAX_EVENT_TIME_MS = 4_102_444_800_000  # 2100-01-01: anything later (or negative) is not a real payment time
RAW_COLUMNS = ("value", "srcTime", "srcName", "srcPos")


def _with_json(raw: DataFrame, schema: str, options: dict[str, str] | None = None) -> DataFrame:
    """The raw columns plus `j`, the record parsed once.

    Parsed inside a generator on purpose: as a plain column, the optimizer inlines `from_json` into
    every expression and filter that reads `j` (a dozen parses per record, uncompiled); a filter
    cannot be pushed below a generator's output.
    """
    j = F.from_json("value", schema, options) if options else F.from_json("value", schema)
    return raw.select(*RAW_COLUMNS, F.inline(F.array(F.struct(j.alias("j")))))


def _long(name: str) -> Column:
    return F.expr(f"try_cast(trim(j.{name}) AS BIGINT)")


def text_schema(nodes: tuple[Node, ...], nested: bool = False) -> str:
    """Every field of one level as text (JSON numbers and numeric strings alike); a struct as its JSON text or,
    `nested`, as a struct of its fields' texts."""
    return ", ".join(f"{quote(n.name)} {_text_type(n) if nested else 'string'}" for n in nodes)


def _text_type(node: Node) -> str:
    if node.leaf is not None:
        return "string"
    return "struct<" + ",".join(f"{quote(c.name)}:{_text_type(c)}" for c in node.children) + ">"


def _cast_column(leaf: Field) -> str:
    return "_c_" + leaf.column


CORRUPT = "_corrupt_record"  # set by Spark's JSON parser where a struct is given something other than an object


def _parse_object(text: Column, node: Node) -> Column:
    """A struct's JSON text parsed as its fields' texts; `CORRUPT` set where the text is not a JSON object."""
    return F.from_json(text, f"{text_schema(node.children)}, {CORRUPT} string", {"columnNameOfCorruptRecord": CORRUPT})


class _Record:
    """Where each declared field's text is, and whether a struct is there as an object.

    The record is parsed once, in `j` (see `_with_json`), every leaf as text: a flat schema's fields, a schema with
    structs as structs of texts. A struct given anything but an object (or malformed JSON) makes the parser mark
    the record (`CORRUPT`, the other fields kept). Such a record is diagnosed again from its text (`diagnosis`,
    only for those records): top-level fields as text, each struct's text parsed in turn, so that the field that
    is not an object is named."""

    def __init__(self, schema: EventSchema, j: Column, nested: bool):
        self.schema, self.j, self.nested = schema, j, nested
        self.text: dict[str, Column] = {r.path: j[r.name] for r in schema.roots}
        self.parent: dict[str, Node | None] = {r.path: None for r in schema.roots}
        self.struct: dict[str, Column] = {}  # each struct's fields (null: absent, or not an object)
        for node in schema.nodes():
            if node.leaf is None:
                text = self.text[node.path]
                self.struct[node.path] = text if nested else _parse_object(text, node)
            for c in node.children:
                self.text[c.path] = self.struct[node.path][c.name]
                self.parent[c.path] = node

    @staticmethod
    def parsed(raw: DataFrame, schema: EventSchema) -> tuple[DataFrame, _Record]:
        """The raw columns plus `j`, and where the fields are in it."""
        structs = any(r.leaf is None for r in schema.roots)
        if not structs:
            return _with_json(raw, text_schema(schema.roots)), _Record(schema, F.col("j"), nested=False)
        ddl = f"{text_schema(schema.roots, nested=True)}, {CORRUPT} string"
        df = _with_json(raw, ddl, {"columnNameOfCorruptRecord": CORRUPT})
        return df, _Record(schema, F.col("j"), nested=True)

    def diagnosis(self) -> _Record:
        """The record's fields from its text, each struct's text parsed on its own (for marked records only)."""
        return _Record(self.schema, F.from_json("value", text_schema(self.schema.roots)), nested=False)

    def is_object(self, node: Node) -> Column:
        struct = self.struct[node.path]
        return struct.isNotNull() if self.nested else struct.isNotNull() & struct[CORRUPT].isNull()

    def within(self, node: Node) -> Column:
        """The node's struct (if any) is there as an object: its fields can be looked for."""
        parent = self.parent[node.path]
        return F.lit(True) if parent is None else self.is_object(parent) & self.within(parent)


def _read(leaf: Field, text: Column) -> Column:
    """A leaf's text read as its kind (null where it does not read): integers as BIGINT, decimals at 10 places or
    their scale, booleans, strings as they are."""
    if leaf.kind == "integer":
        return F.trim(text).try_cast("bigint")
    if leaf.kind == "decimal":
        return F.trim(text).try_cast(f"decimal(38,{max(10, leaf.scale)})")
    if leaf.kind == "boolean":
        return F.trim(text).try_cast("boolean")
    return text


def _typed(node: Node, record: _Record) -> Column:
    """The bronze column of a node, of its declared type (a struct: null when absent)."""
    if node.leaf is not None:
        read = F.col(_cast_column(node.leaf))
        return read if node.leaf.sql in ("BIGINT", "STRING", "BOOLEAN") else read.try_cast(node.leaf.spark_type)
    fields = [_typed(c, record).alias(c.name) for c in node.children]
    return F.when(record.is_object(node), F.struct(*fields))


def _type_conditions(node: Node, record: _Record, reads: dict[str, Column]) -> list[Column]:
    """What makes a present value of this field not fit its declared type (reasons: `_type_reasons`)."""
    text, leaf = record.text[node.path], node.leaf
    if leaf is None:
        return [text.isNotNull() & ~record.is_object(node)]
    read = reads[leaf.path]
    # a required top-level field is there by now (its `missing` check comes first): no need to ask again
    unread = read.isNull() if _required(node) and record.parent[node.path] is None else text.isNotNull() & read.isNull()
    if leaf.kind == "integer":
        bound = 2 ** (leaf.bits - 1)
        return [unread, *([(read < -bound) | (read >= bound)] if leaf.bits < 64 else [])]
    if leaf.kind == "decimal":
        return [unread, read != F.round(read, leaf.scale), F.abs(read) >= F.lit(leaf.limit)]
    if leaf.kind == "boolean":
        return [unread]
    return [~text.isin(*leaf.values)] if leaf.values else []


def _type_reasons(node: Node) -> list[str]:
    leaf, path = node.leaf, node.path
    if leaf is None:
        return [f"{path} is not an object"]
    if leaf.kind == "integer":
        return [f"{path} is not an integer", *([f"{path} out of range ({leaf.sql})"] if leaf.bits < 64 else [])]
    if leaf.kind == "decimal":
        return [f"{path} is not a number", f"{path} has more than {leaf.scale} decimal places", f"{path} out of range"]
    if leaf.kind == "boolean":
        return [f"{path} is not a boolean"]
    if leaf.values:
        expected = " or ".join([", ".join(leaf.values[:-1]), leaf.values[-1]] if len(leaf.values) > 1 else leaf.values)
        return [f"unknown {path} (expected {expected})"]
    return []


def _required(node: Node) -> bool:
    return node.not_null or node.path in (ID, TIME)


NOT_UTF8 = "not valid UTF-8"
TRUNCATED = "malformed JSON: truncated (the record does not end with })"
NOT_OBJECT = "malformed JSON: not a JSON object"
MALFORMED = (NOT_UTF8, TRUNCATED, NOT_OBJECT)  # what `_malformed` checks, in order
EVENT_TIME_RANGE = "eventTime out of range"


def reasons(schema: EventSchema = DEFAULT) -> list[str]:
    """Every reason `parse` can give a record of this schema, in the order it checks them: not UTF-8, truncated, not
    an object (`MALFORMED`); a required field missing (NOT NULL, transactionId, eventTime); a required field's type;
    eventTime's range; an optional field's type (in declaration order within each)."""
    nodes = list(schema.nodes())
    missing = [f"missing {n.path}" for n in nodes if _required(n)]
    required = [r for n in nodes if _required(n) for r in _type_reasons(n)]
    optional = [r for n in nodes if not _required(n) for r in _type_reasons(n)]
    return [*MALFORMED, *missing, *required, EVENT_TIME_RANGE, *optional]


def parse(raw: DataFrame, schema: EventSchema = DEFAULT) -> DataFrame:
    """Typed transactions of the declared schema plus `error` (null when the record is valid): the first of
    `reasons` that applies.

    Every field is read as text first (JSON numbers and numeric strings are both accepted), then cast. The raw
    record keeps any extra fields.
    """
    df, record = _Record.parsed(raw, schema)
    leaves = schema.fields.values()
    read = [_read(leaf, record.text[leaf.path]).alias(_cast_column(leaf)) for leaf in leaves]
    df = df.select(*RAW_COLUMNS, "j", *read)
    error = _error(record, {f.path: F.col(_cast_column(f)) for f in leaves})
    if record.nested:  # a marked record: every check again, from its text
        slow = record.diagnosis()
        error = F.when(F.col("j")[CORRUPT].isNull(), error).otherwise(
            _error(slow, {f.path: _read(f, slow.text[f.path]) for f in leaves})
        )
    typed = [_typed(r, record).alias(r.name) for r in schema.roots]
    return df.select(*RAW_COLUMNS, *typed, error.alias("error"))


def _error(record: _Record, reads: dict[str, Column]) -> Column:
    """The first of `reasons` that applies to a parsed record (`reads`: each leaf read as its kind)."""
    nodes = list(record.schema.nodes())
    event_time = reads[TIME]
    conditions = [
        *_malformed(record.j),
        *(record.within(n) & record.text[n.path].isNull() for n in nodes if _required(n)),
        *(c for n in nodes if _required(n) for c in _type_conditions(n, record, reads)),
        (event_time < 0) | (event_time > MAX_EVENT_TIME_MS),
        *(c for n in nodes if not _required(n) for c in _type_conditions(n, record, reads)),
    ]
    return _reason(list(zip(conditions, reasons(record.schema), strict=True)))


LOGIN_SCHEMA = "userId string, eventType string, ipAddress string, eventTimestamp string, ingestionTimestamp string"
EVENT_TYPES = ("FAIL", "SUCCESS")
LOGIN_REASONS = (  # what `parse_logins` checks, in order
    *MALFORMED,
    "missing userId",
    "missing eventType",
    "missing ipAddress",
    "missing eventTimestamp",
    "userId is not an integer",
    "eventTimestamp is not an integer",
    "unknown eventType (expected FAIL or SUCCESS)",
    "empty ipAddress",
    "eventTimestamp out of range",
    "ingestionTimestamp is not an integer",
)


def _reason(checks: list[tuple[Column, str]]) -> Column:
    """The first failing check's reason, or null: one CASE with a branch per check. Nested CASEs (one per check)
    mean the same, but the optimizer pushes a filter's `error IS NULL` into them one level per pass: about 21
    passes over the whole plan at every micro-batch's planning, instead of 5."""
    (cond, reason), *rest = checks
    error = F.when(cond, F.lit(reason))
    for cond, reason in rest:
        error = error.when(cond, F.lit(reason))
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
    conditions = [
        *_malformed(j),
        *(j[n].isNull() for n in ("userId", "eventType", "ipAddress", "eventTimestamp")),
        F.col("userId").isNull(),
        F.col("eventTimestamp").isNull(),
        ~F.col("eventType").isin(*EVENT_TYPES),
        F.col("ipAddress") == "",
        (F.col("eventTimestamp") < 0) | (F.col("eventTimestamp") > MAX_EVENT_TIME_MS),
        j["ingestionTimestamp"].isNotNull() & F.col("ingestionTimestamp").isNull(),
    ]
    return typed.withColumn("error", _reason(list(zip(conditions, LOGIN_REASONS, strict=True)))).drop("j")


def _malformed(j: Column) -> list[Column]:
    """The conditions of `MALFORMED`. Bytes that are not UTF-8 come first: the parser reads them as another
    character, and the record would be quarantined for the value that holds them, or pass."""
    opens, closes = F.ltrim("value").startswith("{"), F.rtrim("value").endswith("}")
    return [~F.is_valid_utf8("value"), opens & ~closes, j.isNull() | ~opens | ~closes]


def with_defaults(parsed: DataFrame) -> DataFrame:
    """Every row, with a missing ingestionTimestamp as -1."""
    return parsed.withColumn(INGESTED, F.coalesce(INGESTED, F.lit(-1).cast("long")))


def valid(parsed: DataFrame) -> DataFrame:
    """Rows that passed every check, with a missing ingestionTimestamp as -1."""
    return with_defaults(parsed.where(F.col("error").isNull()))
