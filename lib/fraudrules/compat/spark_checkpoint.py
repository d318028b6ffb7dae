"""Spark's streaming checkpoint, read without a running query: what a query planned and committed.

The offset log (`offsets/<batch>`) holds a version line, the batch's metadata as JSON (`batchTimestampMs`, ...),
then one end offset per source, in the order the query reads them; the commit log (`commits/<batch>`) marks the
batches whose results are committed. Spark 3.0 to 4.2 write both in version 1 (`OffsetSeqLog.VERSION`); an offset
file of another version (a Spark that names its sources, say) is refused with an error that says so, not misread
(`tests/integration/test_compat_spark_checkpoint.py` reads the logs of a query this Spark ran).

A Delta table's end offset (`delta_read_through`) is Delta's own `DeltaSourceOffset` JSON: the table version and
the index of the next file within it (negative: none of that version's files read yet).

Also here: the error condition Spark's state data source raises for a state variable the checkpoint lacks.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

if TYPE_CHECKING:
    from pyspark.errors import PySparkException

OFFSET_LOG_VERSION = "v1"
DELTA_SOURCE_VERSIONS = (1, 2, 3)  # DeltaSourceOffset's own format versions (Delta 2 to 4.4 write 1)
MISSING_STATE_VARIABLE = "STDS_INVALID_OPTION_VALUE"  # the state data source's `stateVarName` names no variable


class CheckpointFormatError(RuntimeError):
    """A checkpoint log this release cannot read."""


def logged_batches(fs: pafs.FileSystem, root: str, log: str) -> list[int]:
    """The batch ids in the checkpoint's `offsets` or `commits` log, newest first."""
    logged = fs.get_file_info(pafs.FileSelector(f"{root}/{log}", allow_not_found=True))
    return sorted((int(i.base_name) for i in logged if i.base_name.isdigit()), reverse=True)


def planned(fs: pafs.FileSystem, root: str, batch: int) -> tuple[dict[str, Any], list[str]]:
    """A planned batch's metadata and its end offsets (one text per source, as Spark wrote it)."""
    path = f"{root}/offsets/{batch}"
    with fs.open_input_stream(path) as fh:
        lines = fh.read().decode().splitlines()
    if len(lines) < 2 or lines[0] != OFFSET_LOG_VERSION:
        found = repr(lines[0]) if lines else "an empty file"
        raise CheckpointFormatError(f"{path}: offset log {found}, this release reads {OFFSET_LOG_VERSION!r}")
    return json.loads(lines[1]), lines[2:]


def delta_read_through(offset: str) -> int:
    """The newest version of a Delta table a streaming query's end offset (its text in the offset log) has read
    whole: a source without a read limit takes versions whole, and ends a batch at (next version, -1) or, in the
    version it started from, past that version's last file."""
    fields = json.loads(offset)
    if fields.get("sourceVersion") not in DELTA_SOURCE_VERSIONS or not {"reservoirVersion", "index"} <= set(fields):
        raise CheckpointFormatError(f"not a Delta source offset this release reads: {offset}")
    version = int(fields["reservoirVersion"])
    return version - 1 if int(fields["index"]) < 0 else version


def newest_committed(fs: pafs.FileSystem, root: str) -> int | None:
    """The newest batch the commit log has; None before any."""
    return next(iter(logged_batches(fs, root, "commits")), None)


def missing_state_variable(err: PySparkException) -> bool:
    """Whether the state data source refused a read because the checkpoint has no such state variable."""
    return MISSING_STATE_VARIABLE in str(err.getCondition())
