"""The declared transaction event schema: a Spark SQL DDL text (in a file), parsed without Spark.

Every declared leaf field (a top-level column, or a field of a STRUCT, named by its dotted path such as
`merchant.country`) can be named by rules. Supported types:

- integers `BIGINT` (`LONG`), `INT` (`INTEGER`), `SMALLINT` (`SHORT`), `TINYINT` (`BYTE`);
- `DECIMAL(p,s)` (`DEC`, `NUMERIC`; `DECIMAL` alone is `DECIMAL(10,0)`), s <= 18: evaluated as integers scaled
  by 10^s, exactly, so a value needs at most 18 digits (larger ones are quarantined as out of range);
- `STRING` (`VARCHAR(n)`), `BOOLEAN`, and `STRUCT<name: type, ...>` (nested to any depth).

Floating-point types are refused: rules aggregate exactly, declare fractional numbers as DECIMAL(p,s).
`NOT NULL` makes a field required (a record without it is quarantined; inside a struct, when the struct is
present); any other field may be absent (null). `transactionId` and `eventTime` are required `BIGINT`s;
`ingestionTimestamp BIGINT` (the latency measurement) is declared implicitly when the DDL does not.
`COMMENT 'values: A, B'` on a STRING field declares its only values: others are quarantined, and the engine
carries the field as the value's position (the default schema's `paymentType`). `--` starts a comment line.

Standard library only: the command line validates rules against a schema before Spark starts.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from functools import cache
from importlib import resources

from fraudrules.config import JobConfig
from fraudrules.paths import is_remote

INTEGERS = {"BIGINT": 64, "LONG": 64, "INT": 32, "INTEGER": 32, "SMALLINT": 16, "SHORT": 16, "TINYINT": 8, "BYTE": 8}
SQL_INTEGER = {64: "BIGINT", 32: "INT", 16: "SMALLINT", 8: "TINYINT"}
DECIMALS = ("DECIMAL", "DEC", "NUMERIC")
MAX_DIGITS = 18  # a scaled value is a 64-bit integer: at most 18 decimal digits
ID, TIME, INGESTED = "transactionId", "eventTime", "ingestionTimestamp"
SOURCE_COLUMNS = ("srcTime", "srcId", "srcPos")  # the record's place in its source, after the fields
NULL_MASK_PREFIX = "_nulls"  # the null-mask columns (`mask_column`)
# Columns of the engine's input beside the declared fields: the source's, the rule change (`codec.RULE_CHANGE`) and
# the shard label (`inputs`), besides the null masks. No field may take one of them.
ENGINE_COLUMNS = (*SOURCE_COLUMNS, "ruleChange", "shard")
# Top-level names bronze and the parse keep for their own columns (Spark matches names whatever their case): the
# record as every source yields it (`ingest.RAW_COLUMNS`), the parsed record and its quarantine reason, bronze's
# tail (`tables.BRONZE_TAIL`); and the prefixes of the parse's typed reads and of the detectors' login columns.
BRONZE_COLUMNS = ("value", "srcTime", "srcName", "srcPos", "j", "error", "raw", "ingestedAt")
RESERVED_PREFIXES = ("_c_", "login_")
SYSTEM = (ID, TIME, INGESTED)  # always in the engine's input, never null (ingestionTimestamp: -1 when absent)
VALUES_COMMENT = re.compile(r"^\s*values\s*:(.*)$", re.IGNORECASE | re.DOTALL)
MASK_BITS = 63  # nullable numeric fields per null-mask column of the engine's input
_TOKEN = re.compile(
    r"\s*(?:(`(?:[^`]|``)*`)|('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")|(\d+)|([A-Za-z_][\w]*)|([<>(),:]))"
)


class SchemaError(ValueError):
    """A DDL text that is not a usable event schema."""


def mask_column(null_bit: int) -> str:
    """The null-mask column holding a field's null bit."""
    return f"{NULL_MASK_PREFIX}{null_bit // MASK_BITS}"


def mask_bit(null_bit: int) -> int:
    """A field's null bit as a value of its null-mask column (`mask_column`)."""
    return 1 << (null_bit % MASK_BITS)


@dataclass(frozen=True)
class Field:
    """A declared leaf field, by dotted path."""

    path: str
    kind: str  # "integer" | "decimal" | "string" | "boolean"
    sql: str  # its declared type, e.g. DECIMAL(18,2)
    bits: int = 64  # integers: width
    precision: int = 0
    scale: int = 0
    not_null: bool = False
    nullable: bool = True  # may be null in a valid record (not NOT NULL, or inside a struct that may be absent)
    values: tuple[str, ...] = ()  # a STRING field's declared values, when declared
    null_bit: int = -1  # position in the engine input's null masks (nullable numeric fields only)

    @property
    def numeric(self) -> bool:
        """Integer or decimal: aggregated, ordered, carried as an exact scaled 64-bit integer."""
        return self.kind in ("integer", "decimal")

    @property
    def coded(self) -> bool:
        """Carried to the engine as a 64-bit integer (numbers, booleans, declared string values)."""
        return self.kind != "string" or bool(self.values)

    @property
    def describe(self) -> str:
        return self.sql + (f" (values {', '.join(self.values)})" if self.values else "")

    @property
    def column(self) -> str:
        """Its column in the engine's input (flat: `merchant.country` -> `merchant__country`)."""
        return self.path.replace(".", "__")

    @property
    def spark_type(self) -> str:
        return self.sql.lower()

    @property
    def limit(self) -> int:
        """Exclusive bound of a decimal's absolute value (what a scaled 64-bit integer holds exactly)."""
        return 10 ** min(self.precision - self.scale, MAX_DIGITS - self.scale)


@dataclass(frozen=True)
class Node:
    """A declared column or struct field: a leaf, or a struct of nodes."""

    name: str
    path: str
    not_null: bool
    leaf: Field | None = None
    children: tuple[Node, ...] = ()

    @property
    def spark_type(self) -> str:
        if self.leaf is not None:
            return self.leaf.spark_type
        return "struct<" + ",".join(f"{quote(c.name)}:{c.spark_type}" for c in self.children) + ">"

    def walk(self) -> Iterator[Node]:
        """This node and every node below it, depth first."""
        yield self
        for c in self.children:
            yield from c.walk()


@dataclass(frozen=True)
class EventSchema:
    ddl: str
    roots: tuple[Node, ...]
    fields: dict[str, Field] = dataclass_field(compare=False, hash=False)  # leaves by path, in declaration order

    def field(self, path: str) -> Field | None:
        return self.fields.get(path)

    def input_column(self, name: str) -> str:
        """A name's column in the engine's input: a declared field's flat column, else the name itself (an input
        column such as srcTime)."""
        declared = self.fields.get(name)
        return declared.column if declared else name

    def closest(self, path: str, n: int = 3, also: Iterable[str] = ()) -> list[str]:
        """Declared names (and the names `also` allowed where `path` is) most like `path` (a misspelt or a missing
        struct prefix)."""
        names = list(self.fields)
        close = difflib.get_close_matches(path, [*names, *also], n=n, cutoff=0.6)
        tail = [p for p in names if p.rsplit(".", 1)[-1].lower() == path.rsplit(".", 1)[-1].lower()]
        return list(dict.fromkeys([*tail, *close]))[:n]

    def nodes(self) -> Iterator[Node]:
        """Every declared node (structs and leaves), depth first in declaration order."""
        for r in self.roots:
            yield from r.walk()

    @property
    def spark_ddl(self) -> str:
        """The typed columns (bronze's first columns), as Spark DDL."""
        return ", ".join(f"{quote(r.name)} {r.spark_type}" for r in self.roots)

    @property
    def mask_columns(self) -> tuple[str, ...]:
        """The null-mask columns of the engine's input (none when no numeric field may be null)."""
        n = sum(1 for f in self.fields.values() if f.null_bit >= 0)
        return tuple(mask_column(k * MASK_BITS) for k in range(-(-n // MASK_BITS)))

    def engine_columns(self) -> dict[str, str]:
        """The engine input's event columns and their Spark types: every leaf (coded ones as long, other
        strings as string), the null masks, then the source position."""
        out = {f.column: ("long" if f.coded else "string") for f in self.fields.values()}
        out.update(dict.fromkeys(self.mask_columns, "long"))
        out.update(dict.fromkeys(SOURCE_COLUMNS, "long"))
        return out

    def changed_from(self, older: EventSchema) -> list[str]:
        """Leaves declared in both with another type or other declared values: Delta cannot change a column's
        type, and the engine would key their values differently (windows would silently start afresh)."""
        before = {p.lower(): f for p, f in older.fields.items()}  # Spark and Delta match names whatever their case
        return [
            f"{p}: {was.describe} -> {f.describe}"
            for p, f in self.fields.items()
            if (was := before.get(p.lower())) is not None and (was.sql, was.values) != (f.sql, f.values)
        ]


def quote(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_]\w*", name) else "`" + name.replace("`", "``") + "`"


# ------------------------------------------------------------------------------------------ parsing


class _Tokens:
    def __init__(self, text: str):
        self.items: list[tuple[str, str]] = []
        pos = 0
        text = text.rstrip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m:
                raise SchemaError(
                    f"unexpected character {text[pos:].strip()[:1]!r} at: {text[pos : pos + 30].strip()!r}"
                )
            quoted, string, number, word, punct = m.groups()
            if quoted:
                self.items.append(("name", quoted[1:-1].replace("``", "`")))
            elif string:
                self.items.append(("string", string[1:-1].replace("\\'", "'").replace('\\"', '"')))
            elif number:
                self.items.append(("number", number))
            elif word:
                self.items.append(("word", word))
            else:
                self.items.append(("punct", punct))
            pos = m.end()
        self.at = 0

    def peek(self) -> tuple[str, str]:
        return self.items[self.at] if self.at < len(self.items) else ("end", "")

    def take(self) -> tuple[str, str]:
        token = self.peek()
        self.at += 1
        return token

    def word(self, *words: str) -> bool:
        kind, value = self.peek()
        if kind == "word" and value.upper() in words:
            self.at += 1
            return True
        return False

    def punct(self, char: str) -> bool:
        if self.peek() == ("punct", char):
            self.at += 1
            return True
        return False

    def expect(self, char: str, what: str) -> None:
        if not self.punct(char):
            raise SchemaError(f"expected {char!r} {what}, found {self.peek()[1] or 'the end'!r}")


def _strip_comments(text: str) -> str:
    """`--` comments to the end of the line, outside quotes."""
    out = []
    for line in text.splitlines():
        quote_char = None
        for i, ch in enumerate(line):
            if quote_char:
                quote_char = None if ch == quote_char else quote_char
            elif ch in "'\"`":
                quote_char = ch
            elif line.startswith("--", i):
                line = line[:i]
                break
        out.append(line)
    return "\n".join(out)


def _node(tokens: _Tokens, prefix: str, struct_field: bool) -> Node:
    kind, name = tokens.take()
    if kind not in ("word", "name"):
        raise SchemaError(f"expected a field name, found {name or 'the end'!r}")
    if "." in name:
        raise SchemaError(f"field name {name!r}: a dot separates a struct's fields, it cannot be part of a name")
    path = f"{prefix}{name}"
    if struct_field:
        tokens.punct(":")
    children: tuple[Node, ...] = ()
    leaf_type: tuple[str, str, int, int, int] | None = None
    kind, word = tokens.take()
    upper = word.upper() if kind == "word" else ""
    if upper == "STRUCT":
        tokens.expect("<", f"after STRUCT of {path}")
        items = [_node(tokens, path + ".", True)]
        while tokens.punct(","):
            items.append(_node(tokens, path + ".", True))
        tokens.expect(">", f"closing STRUCT of {path}")
        children = tuple(items)
    elif upper in INTEGERS:
        leaf_type = ("integer", SQL_INTEGER[INTEGERS[upper]], INTEGERS[upper], 0, 0)
    elif upper in DECIMALS:
        precision, scale = 10, 0
        if tokens.punct("("):
            precision = _number(tokens, path)
            scale = _number(tokens, path) if tokens.punct(",") else 0
            tokens.expect(")", f"closing DECIMAL of {path}")
        if not 0 < precision <= 38 or not 0 <= scale <= min(precision, MAX_DIGITS):
            raise SchemaError(f"{path}: DECIMAL({precision},{scale}) needs 1 <= p <= 38 and 0 <= s <= min(p, 18)")
        leaf_type = ("decimal", f"DECIMAL({precision},{scale})", 64, precision, scale)
    elif upper in ("STRING", "VARCHAR", "CHAR"):
        if tokens.punct("("):
            _number(tokens, path)
            tokens.expect(")", f"closing {upper} of {path}")
        leaf_type = ("string", "STRING", 0, 0, 0)
    elif upper in ("BOOLEAN", "BOOL"):
        leaf_type = ("boolean", "BOOLEAN", 0, 0, 0)
    else:
        raise SchemaError(
            f"{path}: type {word or 'missing'} is not supported (BIGINT, INT, SMALLINT, TINYINT, DECIMAL(p,s), STRING, "
            "BOOLEAN, STRUCT<...>; fractional numbers as DECIMAL(p,s): rules aggregate exactly)"
        )
    not_null = False
    if tokens.word("NOT"):
        if not tokens.word("NULL"):
            raise SchemaError(f"{path}: NOT must be followed by NULL")
        not_null = True
    values: tuple[str, ...] = ()
    if tokens.word("COMMENT"):
        kind, text = tokens.take()
        if kind != "string":
            raise SchemaError(f"{path}: COMMENT needs a quoted text")
        m = VALUES_COMMENT.match(text)
        if m and leaf_type and leaf_type[0] == "string":
            values = tuple(v.strip() for v in m.group(1).split(",") if v.strip())
    if leaf_type is None:
        return Node(name, path, not_null, children=children)
    kind_, sql, bits, precision, scale = leaf_type
    leaf = Field(path, kind_, sql, bits, precision, scale, not_null, values=values)
    return Node(name, path, not_null, leaf=leaf)


def _number(tokens: _Tokens, path: str) -> int:
    kind, value = tokens.take()
    if kind != "number":
        raise SchemaError(f"{path}: expected a number, found {value or 'the end'!r}")
    return int(value)


def parse(ddl: str) -> EventSchema:
    """An event schema from its DDL text; SchemaError naming what is wrong."""
    tokens = _Tokens(_strip_comments(ddl))
    roots = [_node(tokens, "", False)]
    while tokens.punct(","):
        if tokens.peek()[0] == "end":  # a trailing comma
            break
        roots.append(_node(tokens, "", False))
    if tokens.peek()[0] != "end":
        raise SchemaError(f"unexpected {tokens.peek()[1]!r} after field {roots[-1].path}")
    names = [r.name for r in roots]
    if INGESTED not in names:
        roots.append(Node(INGESTED, INGESTED, False, leaf=Field(INGESTED, "integer", "BIGINT")))
    return _resolved(ddl, tuple(roots))


def _resolved(ddl: str, roots: tuple[Node, ...]) -> EventSchema:
    """Nullability, null-mask bits and the checks every schema must pass."""
    leaves: dict[str, Field] = {}
    seen_columns: dict[str, str] = {}
    bit = 0

    def visit(node: Node, always: bool) -> Node:
        nonlocal bit
        always = always and node.not_null
        if node.leaf is None:
            _check_names(node.path, [c.name for c in node.children])
            return Node(node.name, node.path, node.not_null, children=tuple(visit(c, always) for c in node.children))
        leaf = node.leaf
        nullable = not always and leaf.path not in SYSTEM
        null_bit = -1
        if nullable and leaf.coded:
            null_bit, bit = bit, bit + 1
        leaf = replace(leaf, nullable=nullable, null_bit=null_bit)
        if leaf.column.lower() in seen_columns:  # Spark matches column names whatever their case
            raise SchemaError(
                f"{leaf.path} and {seen_columns[leaf.column.lower()]} would share the column {leaf.column}"
            )
        if _taken(leaf.column, ENGINE_COLUMNS, (NULL_MASK_PREFIX,)):
            raise SchemaError(f"{leaf.path}: the engine's input names its own column {leaf.column}; rename the field")
        seen_columns[leaf.column.lower()] = leaf.path
        leaves[leaf.path] = leaf
        return Node(node.name, node.path, node.not_null, leaf=leaf)

    names = [r.name for r in roots]
    _check_names("the schema", names)
    resolved = tuple(visit(r, True) for r in roots)
    for name in names:  # after `visit`: a leaf the engine's input also names (srcPos) is refused with that reason
        if _taken(name, BRONZE_COLUMNS, RESERVED_PREFIXES):
            kept = ", ".join([*BRONZE_COLUMNS, *(f"{p}…" for p in RESERVED_PREFIXES)])
            raise SchemaError(f"{name}: bronze and ingest keep that name for a column of their own ({kept}); rename it")
    for name in SYSTEM:
        f = leaves.get(name)
        if f is None or f.sql != "BIGINT":
            raise SchemaError(f"the schema must declare {name} BIGINT (top level)")
    return EventSchema(ddl, resolved, leaves)


def _taken(name: str, columns: tuple[str, ...], prefixes: tuple[str, ...]) -> bool:
    """`name` is one of `columns` or starts with one of `prefixes`, whatever the case of either."""
    low = name.lower()
    return low in (c.lower() for c in columns) or low.startswith(tuple(p.lower() for p in prefixes))


def _check_names(where: str, names: list[str]) -> None:
    """A struct's (or the schema's) fields: no name twice, case aside, as Spark and Delta match names."""
    seen: dict[str, str] = {}
    for name in names:
        first = seen.get(name.lower())
        if first is not None:
            twice = name if first == name else f"{first} and {name}, names that differ only in case"
            raise SchemaError(f"{where} declares a field twice: {twice}")
        seen[name.lower()] = name


# ------------------------------------------------------------------------------------------ built-in and files


BUILTINS = ("default", "rich")


def builtin(name: str) -> EventSchema:
    """A schema shipped with the package: `default` (the reference demo's transaction) or `rich`."""
    return _builtin(name)


def builtin_path(name: str) -> str:
    """The file of a schema shipped with the package (for `--event-schema`)."""
    return str(resources.files("fraudrules").joinpath("schemas", f"{name}.ddl"))


def builtins_declaring(path: str) -> list[str]:
    """The files of the schemas shipped with the package that declare `path`: where a rule naming a field its job's
    schema lacks was likely written for."""
    return [builtin_path(name) for name in BUILTINS if _builtin(name).field(path) is not None]


@cache
def _builtin(name: str) -> EventSchema:
    return load(builtin_path(name))


def load(path: str) -> EventSchema:
    """The schema of a DDL file; SchemaError naming the file."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as err:
        raise SchemaError(f"event schema {path}: {err.strerror or err}") from None
    try:
        return parse(text)
    except SchemaError as err:
        raise SchemaError(f"event schema {path}: {err}") from None


def of(path: str | None) -> EventSchema:
    """The schema of `--event-schema PATH`: the file's, or the default one."""
    return load(path) if path else DEFAULT


def recorded(cfg: JobConfig) -> EventSchema | None:
    """The schema the job last started with (recorded beside its checkpoints), if it ever started."""
    if is_remote(cfg.schema_record) or not os.path.isfile(cfg.schema_record):
        return None
    return load(cfg.schema_record)


def for_job(cfg: JobConfig) -> EventSchema:
    """The job's schema: the configured one, else the one it last started with (a restart without
    `--event-schema` keeps it), else the default one. Rules are validated against it. Resolved once where the
    configuration was (`resolved`), read from its files otherwise."""
    if isinstance(cfg.events, EventSchema):
        return cfg.events
    if cfg.event_schema:
        return load(cfg.event_schema)
    return recorded(cfg) or DEFAULT


def resolved(cfg: JobConfig) -> JobConfig:
    """`cfg` carrying its event schema (`for_job`), resolved now: what the entry points pass down."""
    return cfg if isinstance(cfg.events, EventSchema) else cfg.with_(events=for_job(cfg))


def record(cfg: JobConfig, schema: EventSchema) -> None:
    """Keep the schema the job starts with beside its checkpoints (see `for_job`)."""
    if is_remote(cfg.schema_record):
        return
    os.makedirs(os.path.dirname(cfg.schema_record), exist_ok=True)
    tmp = f"{cfg.schema_record}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(schema.ddl)
    os.replace(tmp, cfg.schema_record)


def file_problem(path: str | None) -> str | None:
    """Why `--event-schema PATH` cannot be used (None: it can)."""
    if not path:
        return None
    if not os.path.isfile(path):
        return f"--event-schema {path}: no such file"
    try:
        load(path)
    except SchemaError as err:
        return str(err)
    return None


DEFAULT = builtin("default")
