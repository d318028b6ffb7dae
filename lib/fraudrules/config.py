"""One config object for every entry point, and the names of the project's tables and queries.

Standard library only: the health checks, the tools and the DAG side read these names without Spark.
"""

from __future__ import annotations

import hashlib
import json
import os
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace

# Tables the job writes (created by `tables.ensure`). Data-quality results live in GX's own results store.
JOB_TABLES = (
    "transactions",
    "logins",
    "quarantine",
    "rules",
    "rule_history",
    "rule_errors",
    "rules_export",
    "rule_applied",
    "alerts",
    "shadow_alerts",
    "late_events",
    "batches",
)
TABLES = JOB_TABLES

# Streaming queries of the job, each with its own checkpoint folder of that name. One stateful query, `evaluate`,
# runs the window rules and (with login detection) the login detector.
RULES_QUERY = "rules"
INGEST_QUERY = "ingest"
EVALUATE_QUERY = "evaluate"
LOGINS_INGEST_QUERY = "ingest_logins"
TRANSACTION_QUERIES = (RULES_QUERY, INGEST_QUERY, EVALUATE_QUERY)
QUERIES = (*TRANSACTION_QUERIES, LOGINS_INGEST_QUERY)
RULES_FORMATS = ("fraudrules", "debezium")  # what a rules message holds (JobConfig.rules_format)
MAX_RESTARTS = 30  # `fraudrules run`: restarts after failures in any hour, by default (engine/run.py `Restarts`)


@dataclass(frozen=True)
class JobConfig:
    data_dir: str = "data"
    catalog: str | None = None  # set both catalog and schema to use Unity Catalog tables
    schema: str | None = None
    checkpoint_root: str | None = None
    # State groups and partitions of the stateful stages, fixed per checkpoint. One task per micro-batch is the
    # lowest latency on a small machine (each task costs a Python worker round and a state store commit);
    # clusters raise both (the bundle: 16) for throughput.
    shards: int = 1
    shuffle_partitions: int = 1
    lateness_ms: int = 60_000
    trigger_seconds: float = 0.1  # stateful queries: a micro-batch at most this often (back to back when busy)
    background_trigger_seconds: float = 5.0  # bronze ingest, results to Delta: fewer, larger commits
    # Rule changes: a change waits at most this long for the rules query (an idle trigger lists the rules
    # folder or asks the rules topic for its offsets; nothing is written unless a change came).
    rules_trigger_seconds: float = 0.5
    available_now: bool = False
    # At most this many records (lines of files, Kafka records) per micro-batch of each source, whatever the sizes
    # of the files: a backlog or a big file is absorbed in bounded micro-batches, in bounded memory.
    max_records_per_trigger: int = 75_000
    # Retained state a Python worker keeps in memory (MiB, all its shards): chunks' per-key summaries and decoded
    # events. Beyond it, a chunk is read again from the worker's local disk cache when a micro-batch needs it.
    state_memory_mb: int = 128
    transactions_source: str | None = None  # folder of JSON-lines files; default <data>/landing/transactions
    logins: bool = False  # the evaluate query also runs the login anomaly detector (seed 000) over login events
    logins_source: str | None = None  # folder of login-event JSON-lines files; default <data>/landing/logins
    # Kafka (`source="kafka"`): transactions and logins from topics; rule changes / alerts via topics when named.
    source: str = "files"  # "files" | "kafka"
    kafka_bootstrap: str | None = None  # bootstrap servers, e.g. "host1:9092,host2:9092"
    kafka_options: dict[str, str] = field(default_factory=dict)  # `kafka.*` (SASL/SSL, ...) to every reader/writer
    kafka_transactions_topic: str = "transactions"
    kafka_logins_topic: str = "logins"
    kafka_rules_topic: str | None = None  # rule changes from this topic instead of the rules folder
    kafka_alerts_topic: str | None = None  # alerts also published here (at-least-once; key = alertId)
    kafka_starting_offsets: str = "earliest"  # for a fresh checkpoint only: "earliest", "latest" or JSON
    # What a rules message holds (topic or folder): "fraudrules", our rule JSON (a rule or a list); "debezium", a
    # Debezium change event of a database's rules table (rules/cdc.py), its columns named per rule field in
    # `rules_columns` (FIELD -> COLUMN; a field not named is read from the column of its own name).
    rules_format: str = "fraudrules"
    rules_columns: dict[str, str] = field(default_factory=dict)
    # Rule changes from this Delta table's Change Data Feed instead of the rules folder or topic (a Unity Catalog
    # name, or a path): one row per rule that admins edit with SQL, columns named as above (rules/cdc.py).
    rules_table: str | None = None
    # The transaction event schema: a file of Spark SQL DDL (`event_schema`); None: the default schema. Rules may
    # name any field it declares. A restart may add fields (bronze gains their columns), not remove one that an
    # ACTIVE rule uses nor change a field's type.
    event_schema: str | None = None
    # Table maintenance (`maintenance`, docs/operations.md): a table the job appends to is compacted once it holds
    # this many small files (0: never by the job's writers); VACUUM keeps removed files this long (time travel of
    # the notebooks and the data-quality history); the Delta log keeps its entries this long; bronze rows
    # (`transactions`, `logins`) older than this are deleted (0: kept).
    compact_min_files: int = 20
    retention_hours: float = 168.0
    log_retention_days: float = 30.0
    bronze_retention_days: float = 30.0
    # The event schema resolved once for this configuration at an entry point (`event_schema.resolved`): every layer
    # below gets it from `event_schema.for_job` without reading a DDL file again. Not a parameter; dropped by `with_`
    # when a setting it was resolved from changes.
    events: object = field(default=None, compare=False, repr=False, metadata={"parameter": False})

    def __post_init__(self) -> None:
        if self.source not in ("files", "kafka"):
            raise ValueError(f"source must be 'files' or 'kafka', not {self.source!r}")
        if self.rules_format not in RULES_FORMATS:
            raise ValueError(f"rules_format must be one of {', '.join(RULES_FORMATS)}, not {self.rules_format!r}")
        if self.rules_table is not None and not self.rules_table.strip():
            raise ValueError("rules_table must name a Delta table (catalog.schema.table) or a table's path")
        if self.rules_table and self.rules_format != "fraudrules":
            raise ValueError(
                "rules_format is what messages of the rules topic or folder hold; a rules_table's rows come from its"
                " change feed (its columns are named by rules_columns)"
            )
        if self.max_records_per_trigger < 1:
            raise ValueError(f"max_records_per_trigger must be positive, not {self.max_records_per_trigger}")
        for name in ("compact_min_files", "retention_hours", "log_retention_days", "bronze_retention_days"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, not {getattr(self, name)}")
        if self.compact_min_files == 1:
            raise ValueError("compact_min_files must be 0 (off) or at least 2: one file is nothing to compact")
        if self.state_memory_mb < 0:
            raise ValueError(f"state_memory_mb must be >= 0, not {self.state_memory_mb}")
        if bool(self.catalog) != bool(self.schema):  # one of them alone would silently mean path tables
            raise ValueError(
                "catalog and schema go together: both for Unity Catalog tables (catalog.schema.table), neither for "
                f"path tables under the data dir; got catalog={self.catalog!r}, schema={self.schema!r}"
            )
        uses_kafka = self.source == "kafka" or self.kafka_rules_topic or self.kafka_alerts_topic
        if uses_kafka and not self.kafka_bootstrap:
            raise ValueError("Kafka topics are configured but kafka_bootstrap is not")

    @property
    def uses_catalog(self) -> bool:
        return bool(self.catalog and self.schema)

    def table(self, name: str) -> str:
        """Unity Catalog name or local Delta path of a project table."""
        if name not in TABLES:
            raise ValueError(f"unknown table {name!r}; tables: {', '.join(TABLES)}")
        if self.uses_catalog:
            return f"{self.catalog}.{self.schema}.{name}"
        return os.path.abspath(os.path.join(self.data_dir, "tables", name))

    @property
    def local_catalog(self) -> str | None:
        """Catalog tables outside Databricks: the folder of the local session's catalog (a Hive metastore and its
        warehouse), so that they outlive the JVM as Unity Catalog's do."""
        return os.path.abspath(os.path.join(self.data_dir, "catalog")) if self.uses_catalog else None

    def checkpoint(self, query: str) -> str:
        root = self.checkpoint_root or os.path.join(self.data_dir, "checkpoints")
        if query == RULES_QUERY and self.rules_table:  # a table's positions are its versions: a checkpoint of its own
            query = f"{query}-table-{hashlib.sha256(self.rules_table.encode()).hexdigest()[:12]}"
        return os.path.abspath(os.path.join(root, query))

    def query_id(self, query: str) -> str:
        """The streaming query's id, kept in its checkpoint: the same across restarts, new for a new checkpoint."""
        with open(os.path.join(self.checkpoint(query), "metadata"), encoding="utf-8") as fh:
            return json.loads(fh.readline())["id"]

    @property
    def schema_record(self) -> str:
        """The event schema the job last started with, kept beside its checkpoints: commands that change rules
        without being told the schema validate them against it."""
        return self.checkpoint("event_schema.ddl")

    @property
    def rules_landing(self) -> str:
        """Folder of rule change files (JSON list or object per file), the local stand-in for the rules topic."""
        return os.path.abspath(os.path.join(self.data_dir, "landing", "rules"))

    @property
    def logins_landing(self) -> str:
        return os.path.abspath(self.logins_source or os.path.join(self.data_dir, "landing", "logins"))

    @property
    def landing(self) -> str:
        return os.path.abspath(self.transactions_source or os.path.join(self.data_dir, "landing", "transactions"))

    def with_(self, **changes: object) -> JobConfig:
        if "events" not in changes and not _EVENTS_FROM.isdisjoint(changes):
            changes["events"] = None  # resolved for other settings
        return replace(self, **changes)


_EVENTS_FROM = frozenset({"event_schema", "data_dir", "checkpoint_root"})  # what `JobConfig.events` depends on


# Settings that only mean something when the source is Kafka (as the CLI and the notebooks have always used them).
_KAFKA_ONLY = ("kafka_",)
_TRUE = ("1", "true", "yes", "y", "on")


def on_databricks() -> bool:
    """Whether this process runs on a Databricks runtime (its cluster's session, its PySpark build)."""
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


def config_from(params: Mapping[str, object], **overrides: object) -> JobConfig:
    """A JobConfig from CLI arguments (`vars(args)`) or notebook/job parameters, keyed by field name.

    Absent, None and empty values keep the defaults; text is converted to the field's type (booleans from
    "true"/"1"/"yes"/"on", `kafka_options` from KEY=VALUE strings). The source is Kafka when a bootstrap is
    given and `source` does not say otherwise; Kafka settings are ignored for a file source. Keys that are
    not JobConfig fields are ignored; `overrides` win over `params`.
    """
    given = {k: v for k, v in {**params, **overrides}.items() if v is not None and v != ""}
    source = str(given.get("source") or ("kafka" if given.get("kafka_bootstrap") else "files"))
    types = typing.get_type_hints(JobConfig)
    values: dict[str, object] = {}
    for f in fields(JobConfig):
        if f.name not in given or not f.metadata.get("parameter", True):
            continue
        if source != "kafka" and f.name.startswith(_KAFKA_ONLY):
            continue
        values[f.name] = _convert(given[f.name], types[f.name])
    return JobConfig(**{**values, "source": source})


def _convert(value: object, kind: object) -> object:
    """A parameter value as a JobConfig field type (`int | None` fields as int, and so on)."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    target = typing.get_origin(kind) or kind
    if args and target is not dict:  # `X | None`
        target = args[0]
    if target is bool:
        return flag(value)
    if target is dict:
        return dict(value) if isinstance(value, Mapping) else parse_options(value)  # type: ignore[arg-type]
    return target(value)  # type: ignore[operator]


def flag(value: object) -> bool:
    """A parameter's text as a boolean ("true", "1", "yes", "y", "on" are true)."""
    return value if isinstance(value, bool) else str(value or "").strip().lower() in _TRUE


def parse_options(pairs: Iterable[str] | str | None) -> dict[str, str]:
    """`KEY=VALUE` strings (e.g. from `--kafka-option`, `--rules-column`) as a dict; raises ValueError on a pair
    without `=`."""
    options = {}
    for pair in [pairs] if isinstance(pairs, str) else pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{pair!r} is not KEY=VALUE")
        options[key.strip()] = value
    return options
