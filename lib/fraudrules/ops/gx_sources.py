"""Great Expectations data sources of the project: the job's Delta tables and its streaming state, read with Spark.

Two fluent data source types, registered with GX when this module is imported (GX registers every subclass of its
`Datasource`): `fraudrules_tables`, one `delta_table` asset per table, and `fraudrules_state`, one `stream_state`
asset per stateful query (read with Spark's state data source and decoded by the engine's own codecs,
`state_reader`). Both read the job named by their `job` field, a config variable (`${fraudrules_job}`: the
JobConfig fields as JSON, given by `quality.context`), so the one committed project (expectations/) reads local
paths or Unity Catalog tables, and the checkpoints of either.

A batch is pinned: a table at one Delta version, a state at one committed micro-batch. A run's pins are its one
batch parameter, `snapshot` ({"tables": {name: version}, "state": {query: batchId}}, `pin`); every table the run
can read is also a temp view of that name at its pinned version, which the suites' cross-table queries
(UnexpectedRowsExpectation) join. A batch's spec names its table (or checkpoint) and its version (or batch id):
both are in the validation results and on their Data Docs pages.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from fraudrules import event_schema, tables
from fraudrules.compat.great_expectations import (
    DATA_CONNECTOR_NAME,
    Batch,
    BatchRequest,
    ConfigStr,
    DataAsset,
    IDDict,
    LegacyBatchDefinition,
    RuntimeDataBatchSpec,
    SparkDatasource,
    TestConnectionError,
    make_batch_identifier,
    pydantic,
)
from fraudrules.config import EVALUATE_QUERY, JOB_TABLES, JobConfig, config_from
from fraudrules.engine import ingest, lines
from fraudrules.ops import state_reader

SNAPSHOT = "snapshot"  # the one batch parameter: what this run reads (see `pin`)
LOGIN_STATE_SCHEMA = (
    "shard long, ruleId long, userId long, start long, failedIps array<string>, batchId long, watermarkMs long, "
    "batchTimeMs long, latenessMs long"
)


class MissingInput(LookupError):
    """A table, or a query's state, that a suite was asked to check does not exist."""


# ------------------------------------------------------------------------------------------ pins


def table_version(spark: SparkSession, cfg: JobConfig, name: str) -> int:
    """The table's current Delta version."""
    return int(tables.delta(spark, cfg, name).history(1).select("version").first()[0])


def read_version(spark: SparkSession, cfg: JobConfig, name: str, version: int) -> DataFrame:
    """The table as of a Delta version (time travel), by path or by its Unity Catalog name."""
    reader = spark.read.option("versionAsOf", version)
    return reader.table(cfg.table(name)) if cfg.uses_catalog else reader.format("delta").load(cfg.table(name))


def pin(spark: SparkSession, cfg: JobConfig) -> dict:
    """What a run reads: each existing table at its current version (also registered as a temp view of its name,
    for the cross-table queries) and each stateful query's newest committed batch."""
    # The state first: the tables its batch wrote (and the bronze rows other queries wrote meanwhile) are then in.
    state = {q: b.batch_id for q in (EVALUATE_QUERY,) if (b := state_reader.last_committed(cfg, q)) is not None}
    pinned = {name: table_version(spark, cfg, name) for name in JOB_TABLES if tables.exists(spark, cfg, name)}
    for name, version in pinned.items():
        read_version(spark, cfg, name, version).createOrReplaceTempView(name)
    declared_views(spark, cfg, "transactions" in pinned)
    return {"tables": pinned, "state": state}


def declared_views(spark: SparkSession, cfg: JobConfig, bronze: bool) -> None:
    """What the suites check that follows the job's declared event schema, as temp views:

    - `quarantine_reasons` (kind, reason): every reason the parsers give (transactions: of this schema);
    - `bronze_columns` (field, declaredType, bronzeType): each declared field and its bronze column's type;
    - `bronze_violations`: bronze rows with a NOT NULL field null, a value outside the declared ones, or a
      decimal beyond what the engine evaluates exactly.
    """
    schema = event_schema.for_job(cfg)
    known = [("transaction", r) for r in ingest.reasons(schema)] + [("login", r) for r in ingest.LOGIN_REASONS]
    spark.createDataFrame(known, "kind string, reason string").createOrReplaceTempView("quarantine_reasons")
    if not bronze:
        return
    transactions = spark.table("transactions")
    columns = [(f.path, f.spark_type, _type_at(transactions.schema, f.path)) for f in schema.fields.values()]
    columns_ddl = "field string, declaredType string, bronzeType string"
    spark.createDataFrame(columns, columns_ddl).createOrReplaceTempView("bronze_columns")
    broken = [c for c in columns if c[1] != c[2]]  # only columns of the declared type can be checked by value
    checks = [
        _violation(f, node_present) for f, node_present in _leaves(schema) if f.path not in {c[0] for c in broken}
    ]
    condition = " OR ".join(c for c in checks if c) or "false"
    transactions.where(condition).createOrReplaceTempView("bronze_violations")


def _type_at(struct, path: str) -> str | None:
    """The Spark type (simple string) of a dotted path in a schema, None where it is not there."""
    for name in path.split("."):
        if not hasattr(struct, "fieldNames") or name not in struct.fieldNames():
            return None
        struct = struct[name].dataType
    return struct.simpleString()


def _leaves(schema: event_schema.EventSchema):
    """Each declared leaf with the SQL condition that its struct (if any) is there."""
    for leaf in schema.fields.values():
        parents = leaf.path.split(".")[:-1]
        yield leaf, " AND ".join(f"{'.'.join(parents[: i + 1])} IS NOT NULL" for i in range(len(parents))) or "true"


def _violation(leaf: event_schema.Field, present: str) -> str:
    """SQL that is true where a bronze value breaks what the schema declares for it (empty: nothing to check)."""
    col = ".".join(f"`{p}`" for p in leaf.path.split("."))
    parts = []
    if leaf.not_null or leaf.path in (event_schema.ID, event_schema.TIME):
        parts.append(f"({present} AND {col} IS NULL)")
    if leaf.values:
        parts.append(f"{col} NOT IN ({', '.join(_quoted(v) for v in leaf.values)})")
    if leaf.kind == "decimal":
        parts.append(f"abs({col}) >= {leaf.limit}")
    return " OR ".join(parts)


def _quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def missing_table(spark: SparkSession | None, cfg: JobConfig, name: str) -> str | None:
    return None if tables.exists(spark, cfg, name) else f"no table {name} at {cfg.table(name)}"


def missing_state(cfg: JobConfig, detector: str) -> str | None:
    """Why the `detector`'s state (window or login) cannot be read, or None."""
    checkpoint = cfg.checkpoint(EVALUATE_QUERY)
    if state_reader.last_committed(cfg) is None:
        return f"the {EVALUATE_QUERY} query has no committed batch under {checkpoint}"
    if detector == "login" and lines.logged_sources(checkpoint) == 2:  # transactions and rule changes only
        return f"the {EVALUATE_QUERY} query under {checkpoint} runs without login detection"
    return None


# ------------------------------------------------------------------------------------------ state frames


def _facts(cfg: JobConfig, batch: state_reader.CommittedBatch, watermark: int) -> dict[str, int]:
    """The facts of the batch a detector's state rows are the state of (what its checks compare with)."""
    return {
        "batchId": batch.batch_id,
        "watermarkMs": watermark,
        "batchTimeMs": batch.timestamp_ms,
        "latenessMs": cfg.lateness_ms,
    }


def _watermark(marks: dict[int, int]) -> int:
    """A detector's watermark after a batch from its shards' (every shard sees every event: they all have it)."""
    return max(marks.values(), default=0)


def window_state(
    spark: SparkSession, cfg: JobConfig, batch: state_reader.CommittedBatch, marks: dict[int, int]
) -> DataFrame:
    """The evaluate query's retained events that a window can still reach (by the shards' watermarks `marks`),
    one row each, with the batch's facts: built by Spark's tasks (an hour of state is millions of rows)."""
    facts = _facts(cfg, batch, _watermark(marks))
    frame = state_reader.entries(spark, cfg, batch.batch_id, marks)
    return _kept(frame.withColumns({k: F.lit(v).cast("long") for k, v in facts.items()}))


def login_state(
    spark: SparkSession, cfg: JobConfig, batch: state_reader.CommittedBatch, marks: dict[int, int]
) -> DataFrame:
    """The login detector's open sequences, one row each, with the batch's facts (a few per user: in the
    driver)."""
    frame = state_reader.login_sequences(spark, cfg, batch.batch_id).assign(**_facts(cfg, batch, _watermark(marks)))
    return _kept(spark.createDataFrame(pa.Table.from_pandas(frame, preserve_index=False), LOGIN_STATE_SCHEMA))


def _kept(frame: DataFrame) -> DataFrame:
    """A state frame kept in Spark's block store by the first expectation that reads it: else every expectation
    (each a Spark job or more) decodes and keys the state again."""
    return frame.persist(StorageLevel.MEMORY_AND_DISK)


# ------------------------------------------------------------------------------------------ GX types


class _JobSource(SparkDatasource):
    """A Spark data source over the job configured by `job` (JobConfig fields as JSON, usually a config variable)."""

    _EXTRA_EXCLUDED_EXEC_ENG_ARGS: ClassVar[set] = {"job"}  # ours, not the Spark execution engine's
    job: ConfigStr | str

    def job_config(self) -> JobConfig:
        text = self.job.get_config_value(self._config_provider) if isinstance(self.job, ConfigStr) else self.job
        return event_schema.resolved(config_from(json.loads(text)))


class _PinnedAsset(DataAsset):
    """An asset whose batch is the one the run's `snapshot` pins (pinned here when the run gives none)."""

    _reads: ClassVar[str] = "input"

    def get_batch_parameters_keys(self, partitioner=None) -> tuple[str, ...]:
        return (SNAPSHOT,)

    def build_batch_request(self, options=None, batch_slice=None, partitioner=None) -> BatchRequest:
        if batch_slice is not None or partitioner is not None:
            raise ValueError(f"{type(self).__name__} has one batch: no slices, no partitioners")
        unknown = set(options or {}) - {SNAPSHOT}
        if unknown:
            raise ValueError(f"unknown batch parameters {sorted(unknown)}; the only one is {SNAPSHOT!r}")
        return BatchRequest(datasource_name=self.datasource.name, data_asset_name=self.name, options=options or {})

    def _validate_batch_request(self, batch_request: BatchRequest) -> None:
        if batch_request.data_asset_name != self.name or set(batch_request.options or {}) - {SNAPSHOT}:
            raise ValueError(f"not a batch request of asset {self.name}: {batch_request}")

    def get_batch_identifiers_list(self, batch_request: BatchRequest) -> list[dict]:
        return [IDDict(batch_request.options or {})]

    def test_connection(self) -> None:
        reason = self.missing()
        if reason:
            raise TestConnectionError(reason)

    def missing(self) -> str | None:
        """Why this asset's input cannot be read, or None."""
        raise NotImplementedError

    def frame(self, spark: SparkSession, cfg: JobConfig, snapshot: dict) -> tuple[DataFrame, dict, dict]:
        """The pinned batch's rows, what its spec says about them, and its pin (which identifies the batch)."""
        raise NotImplementedError

    def get_batch(self, batch_request: BatchRequest) -> Batch:
        self._validate_batch_request(batch_request)
        source: _JobSource = self.datasource  # type: ignore[assignment]
        spark, cfg = source.get_spark(), source.job_config()
        reason = self.missing()
        if reason:
            raise MissingInput(reason)
        snapshot = (batch_request.options or {}).get(SNAPSHOT) or pin(spark, cfg)
        df, described, pinned = self.frame(spark, cfg, snapshot)
        spec = RuntimeDataBatchSpec(batch_data=df, data_asset_name=self.name, **described)
        data, markers = source.get_execution_engine().get_batch_data_and_markers(batch_spec=spec)
        # The batch is identified by this asset's own pin (e.g. `tables-alerts-delta_version_12`), not the snapshot.
        own = BatchRequest(datasource_name=source.name, data_asset_name=self.name, options=pinned)
        legacy = LegacyBatchDefinition(
            datasource_name=source.name,
            data_connector_name=DATA_CONNECTOR_NAME,
            data_asset_name=self.name,
            batch_identifiers=make_batch_identifier(pinned),
            batch_spec_passthrough=None,
        )
        metadata = {**self.batch_metadata, **described}
        return Batch(
            datasource=source,
            data_asset=self,
            batch_request=own,
            data=data,
            metadata=metadata,
            batch_markers=markers,
            batch_spec=spec,
            batch_definition=legacy,
        )

    def _cfg(self) -> JobConfig:
        return self.datasource.job_config()  # type: ignore[attr-defined]


class DeltaTableAsset(_PinnedAsset):
    """A project table (`table`), read with Spark at the Delta version the run pinned."""

    type: Literal["delta_table"] = "delta_table"
    table: str

    class Config:
        extra = pydantic.Extra.forbid

    def missing(self) -> str | None:
        cfg = self._cfg()
        spark = self.datasource.get_spark() if cfg.uses_catalog else None  # local tables: a look at the folder
        return missing_table(spark, cfg, self.table)

    def frame(self, spark: SparkSession, cfg: JobConfig, snapshot: dict) -> tuple[DataFrame, dict, dict]:
        version = int(snapshot["tables"][self.table])
        described = {"table": cfg.table(self.table), "delta_version": version, "reader_method": "delta"}
        return read_version(spark, cfg, self.table, version), described, {"delta_version": version}


class StreamStateAsset(_PinnedAsset):
    """A detector's state (`detector`: window or login) in the evaluate query, at the committed batch the run
    pinned."""

    type: Literal["stream_state"] = "stream_state"
    detector: Literal["window", "login"]

    class Config:
        extra = pydantic.Extra.forbid

    def missing(self) -> str | None:
        return missing_state(self._cfg(), self.detector)

    def frame(self, spark: SparkSession, cfg: JobConfig, snapshot: dict) -> tuple[DataFrame, dict, dict]:
        batch = state_reader.committed(cfg, EVALUATE_QUERY, int(snapshot["state"][EVALUATE_QUERY]))
        read = window_state if self.detector == "window" else login_state
        marks = state_reader.watermarks(spark, cfg, batch.batch_id, self.detector)  # read once, for both uses
        described = {
            "checkpoint": cfg.checkpoint(EVALUATE_QUERY),
            "state_batch_id": batch.batch_id,
            "watermark_ms": _watermark(marks),
            "reader_method": "statestore",
        }
        return read(spark, cfg, batch, marks), described, {"state_batch": batch.batch_id}


class TablesSource(_JobSource):
    """The job's Delta tables: one `delta_table` asset per checked table."""

    asset_types: ClassVar[list[type[DataAsset]]] = [DeltaTableAsset]
    type: Literal["fraudrules_tables"] = "fraudrules_tables"
    assets: list[DeltaTableAsset] = pydantic.Field(default_factory=list)


class StateSource(_JobSource):
    """The job's streaming state: one `stream_state` asset per detector."""

    asset_types: ClassVar[list[type[DataAsset]]] = [StreamStateAsset]
    type: Literal["fraudrules_state"] = "fraudrules_state"
    assets: list[StreamStateAsset] = pydantic.Field(default_factory=list)


def pinned(spec: dict[str, Any]) -> str:
    """The version a batch spec read: `Delta version N` of a table, `batch N` of a state."""
    if "delta_version" in spec:
        return f"Delta version {spec['delta_version']}"
    if "state_batch_id" in spec:
        return f"batch {spec['state_batch_id']}"
    return "-"


def describe(spec: dict[str, Any]) -> str:
    """What a batch spec says was read: `table @ Delta version N` or `checkpoint @ batch N (watermark W ms)`."""
    if "delta_version" in spec:
        return f"{spec['table']} @ {pinned(spec)}"
    if "state_batch_id" in spec:
        return f"{spec['checkpoint']} @ {pinned(spec)} (watermark {spec['watermark_ms']} ms)"
    return str(spec.get("data_asset_name"))
