"""A shard's small state as one value for both detectors: one state variable to register, one round trip to read it
and one to write it per micro-batch.

Spark calls the processor's `init` in every task, so in every micro-batch, and registering a state variable there
is a round trip in which the JVM builds its encoders. The window rules' rules, chunk catalog (with their clock) and
COUNT_WITH_RESET bookkeeping and the login detector's rules, open sequences and clock are therefore the fields of
one value, `shard`; the chunks stay in their map (`processors.MapBackend`), one entry written per micro-batch.

Checkpoints of the layout before, layout 1, keep the six fields as six state variables (`LEGACY`). The job's first
micro-batch migrates them: every shard gets every micro-batch's rows, and a shard without the value reads the six
once, clears them, and writes the value. A start registers the six too (`Layout.legacy`) while any of them still
holds a value at the last committed batch; the start after that finds none, drops them and marks the checkpoint
(`LAYOUT_FILE`), and later starts read only that mark.
"""

from __future__ import annotations

import json
from dataclasses import astuple, dataclass

import pyarrow.fs as pafs
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StatefulProcessorHandle
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from fraudrules.compat import spark_checkpoint
from fraudrules.engine.lines import open_fs

VALUE = "shard"  # the value's state variable
LAYOUT_FILE = "state_layout.json"  # beside Spark's own logs in the evaluate query's checkpoint
LAYOUT = 2  # layout 1: the six variables of `LEGACY`


@dataclass
class ShardValues:
    """The fields of the value; None where a detector holds nothing yet."""

    rules: str | None = None  # the window rules (`RuleSet` JSON)
    meta: str | None = None  # chunk catalog and clock (`state.Meta` JSON)
    resets: bytes | None = None  # COUNT_WITH_RESET bookkeeping (`state.Resets`)
    login_rules: str | None = None  # the login detector's rules (`RuleSet` JSON)
    login_sequences: bytes | None = None  # open login sequences (`logins.encode_sequences`)
    login_clock: int | None = None  # the newest login event time seen

    @staticmethod
    def of(row: tuple | None) -> ShardValues:
        values = ShardValues(*row) if row is not None else ShardValues()
        for name in ("resets", "login_sequences"):  # the state API hands binary fields over as bytearray
            if (blob := getattr(values, name)) is not None:
                setattr(values, name, bytes(blob))
        return values

    def row(self) -> tuple:
        return astuple(self)


SCHEMA = StructType(
    [
        StructField("rules", StringType()),
        StructField("meta", StringType()),
        StructField("resets", BinaryType()),
        StructField("login_rules", StringType()),
        StructField("login_sequences", BinaryType()),
        StructField("login_clock", LongType()),
    ]
)  # the fields of ShardValues, in order
# layout 1: each field a variable of its own name, of one column: `text`, `blob` or (the login clock) `clock`
_COLUMN = {StringType(): "text", BinaryType(): "blob", LongType(): "clock"}
LEGACY = {f.name: StructType([StructField(_COLUMN[f.dataType], f.dataType)]) for f in SCHEMA.fields}


class ShardState:
    """The value's handle in a task; with `legacy`, also the variables of layout 1, moved into the value the first
    time a shard is read (and cleared there)."""

    def __init__(self, handle: StatefulProcessorHandle, legacy: bool = False):
        self.value = handle.getValueState(VALUE, SCHEMA)
        self.legacy = {n: handle.getValueState(n, s) for n, s in LEGACY.items()} if legacy else {}

    def get(self) -> ShardValues:
        row = self.value.get()
        if row is not None or not self.legacy:
            return ShardValues.of(row)
        moved = []
        for state in self.legacy.values():  # in the value's field order
            old = state.get()
            moved.append(old[0] if old is not None else None)
            if old is not None:
                state.clear()
        return ShardValues.of(tuple(moved))

    def put(self, values: ShardValues) -> None:
        self.value.update(values.row())


def read_state(spark: SparkSession, checkpoint: str, var: str, batch_id: int | None = None) -> DataFrame:
    """A state variable of the checkpoint's stateful operator through Spark's state data source (at `batch_id`,
    default the newest committed batch)."""
    spark.streams.active  # noqa: B018 - starts the state store coordinator the RocksDB reader reports to
    reader = spark.read.format("statestore").option("path", checkpoint).option("stateVarName", var)
    if batch_id is not None:
        reader = reader.option("batchId", str(batch_id))
    return reader.load()


class Layout:
    """The state layout of the evaluate query's checkpoint (`LAYOUT_FILE`)."""

    def __init__(self, checkpoint: str):
        self.checkpoint = checkpoint
        self.fs, self.root = open_fs(checkpoint)
        self.path = f"{self.root}/{LAYOUT_FILE}"

    def legacy(self, spark: SparkSession) -> bool:
        """Whether a start must register the variables of layout 1 too: a shard still holds one. Marks the
        checkpoint otherwise (a new one included)."""
        if self.fs.get_file_info(self.path).type != pafs.FileType.NotFound:
            return False
        if self._holds_legacy(spark):
            return True
        self.fs.create_dir(self.root, recursive=True)
        with self.fs.open_output_stream(self.path) as fh:
            fh.write(json.dumps({"layout": LAYOUT}).encode())
        return False

    def _holds_legacy(self, spark: SparkSession) -> bool:
        if spark_checkpoint.newest_committed(self.fs, self.root) is None:
            return False  # no committed state: nothing to move
        try:  # every legacy shard wrote `meta` in every micro-batch; migration clears it
            return read_state(spark, self.checkpoint, "meta").limit(1).count() > 0
        except PySparkException as err:
            if spark_checkpoint.missing_state_variable(err):
                return False  # not a variable of this checkpoint: its job registered none of the legacy ones
            raise
