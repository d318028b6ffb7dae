"""PySpark internals, guarded: transformWithStateInPandas input grouped by key without a Python step per row, map
state writes without copies of the value (both for PySpark 4.2.1 only), and query progress handed over as JSON.

PySpark 4.2's `TransformWithStateInPandasSerializer.load_stream` regroups the input rows by key one row at a
time (`itertuples`, `itertools.groupby`, then `pd.DataFrame(rows)`), on the one core a shard's task has: about
ten times what converting the same Arrow batches to pandas costs. The JVM sends a key's rows together, so the
same groups are runs of equal keys in each Arrow batch: found with numpy and sliced from the batch's frame. The
frames, keys and modes yielded are those of the upstream method (`tests/unit/test_compat_pyspark.py` compares both
on the installed PySpark).

Upstream cuts a key's rows into frames of at most `arrow_max_records_per_batch` rows, and of fewer rows than fit
in `arrow_max_bytes_per_batch` at the running average row size it keeps (`_update_batch_size_stats`): the same
cuts here, at the same rows, with the same statistics.

The same release's `MapStateClient.update_value` builds a state write's request one nested message at a time, and
protobuf copies each message's bytes into its parent: four copies of a chunk's blob (11 MB for 500,000 events) before
the one sent. `update_value` builds the same request in place: the same bytes on the socket, one copy.

Both are installed in a Python worker when it unpickles one of the job's processors (`VectorizedInput`), before the
worker reads its input. Only on the PySpark release they were written against (exactly `RELEASE`), and
`load_stream` only for batches of plain columns (integers, floats, booleans, strings, binary): a batch with other
columns is regrouped row by row as upstream does. Every other PySpark keeps its own methods: another release, and a
Databricks runtime's (its own build, whatever version it reports). `FRAUDRULES_UPSTREAM_INPUT=1` keeps upstream's
here too (what a cluster runs). The job says once when upstream's are in use (`notice`).

The job's query listeners take progress events from the JVM as JSON (`JsonEventsListener`), one call per event,
through the bridge class PySpark's `StreamingQueryListener._jlistener` builds its own from.

PySpark's private modules are imported in guards: a PySpark that moved one of the first two's (`MOVED` names it)
keeps its own regrouping and map state writes, one that moved the bridge class (`BRIDGE_MOVED`) its own listener
bridge; the job imports and runs as before, only slower.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyspark
from pyspark import SparkContext
from pyspark.errors import PySparkRuntimeError
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import QueryIdleEvent, QueryProgressEvent

from fraudrules.config import on_databricks

try:  # PySpark's private modules: a release that moved one keeps its own code (`MOVED` says why), the job runs on
    from pyspark.sql.conversion import ArrowBatchTransformer
    from pyspark.sql.pandas.serializers import ArrowStreamPandasSerializer, TransformWithStateInPandasSerializer
    from pyspark.sql.streaming.map_state_client import MapStateClient
    from pyspark.sql.streaming.stateful_processor_util import TransformWithStateInPandasFuncMode as Mode

    MOVED: str | None = None
    UPSTREAM = TransformWithStateInPandasSerializer.load_stream
    UPSTREAM_UPDATE = MapStateClient.update_value
except (ImportError, AttributeError) as err:
    MOVED = f"PySpark {pyspark.__version__}: {err}"
try:  # the listener bridge on its own: without it, PySpark's listeners read progress field by field
    from pyspark.sql.streaming.listener import JStreamingQueryListener

    BRIDGE_MOVED: str | None = None
except ImportError as err:
    BRIDGE_MOVED = f"PySpark {pyspark.__version__}: {err}"
    JStreamingQueryListener = object  # type: ignore[assignment,misc]

RELEASE = "4.2.1"  # the release whose load_stream and update_value these reproduce
UPSTREAM_ENV = "FRAUDRULES_UPSTREAM_INPUT"


def plain(schema: pa.Schema) -> bool:
    """Columns whose pandas values compare and convert the same whether taken row by row or as columns."""
    kinds = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_string, pa.types.is_binary)
    return all(any(k(f.type) for k in kinds) for f in schema)


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _as_rows_would_be(frame: pd.DataFrame) -> pd.DataFrame:
    """The dtypes `pd.DataFrame(rows)` infers from Python scalars: 64-bit integers and floats."""
    widen = {c: ("int64" if t.kind in "iu" else "float64") for c, t in frame.dtypes.items() if t.kind in "iuf"}
    return frame.astype(widen, copy=False)


def runs(frame: pd.DataFrame, key_offsets: list[int]) -> Iterator[tuple[tuple, pd.DataFrame]]:
    """(key, rows) for each run of rows with equal key columns, in order."""
    n = len(frame)
    if not n:
        return
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    for offset in key_offsets:
        column = frame.iloc[:, offset].to_numpy()
        starts[1:] |= column[1:] != column[:-1]
    bounds = [*np.flatnonzero(starts).tolist(), n]
    for start, end in itertools.pairwise(bounds):
        key = tuple(_scalar(frame.iat[start, offset]) for offset in key_offsets)
        yield key, frame.iloc[start:end].reset_index(drop=True)


def row_runs(frame: pd.DataFrame, key_offsets: list[int]) -> Iterator[tuple[tuple, list[tuple]]]:
    """`runs` as upstream finds them, row by row, as rows: for columns whose values a row and a column hold
    differently (upstream makes a frame of a key's rows with `pd.DataFrame(rows)`)."""
    rows = ((tuple(row[o] for o in key_offsets), row) for row in frame.itertuples(index=False))
    for key, group in itertools.groupby(rows, key=lambda kv: kv[0]):
        yield key, [row for _, row in group]


def rows_to_cut(count: int, max_rows: int, max_bytes: int, row_size: float) -> int:
    """How many more rows a frame holding `count` takes before upstream cuts it (at least one): the first row
    count at which it holds `max_rows`, or at which that count times `row_size` reaches `max_bytes` (the same
    float comparison as upstream's)."""
    cut = max_rows
    if row_size > 0:
        n = max(1, math.ceil(max_bytes / row_size))
        while n > 1 and (n - 1) * row_size >= max_bytes:
            n -= 1
        while n * row_size < max_bytes:
            n += 1
        cut = min(cut, n)
    return max(cut - count, 1)


class Cutter:
    """A key's rows cut into frames as upstream cuts them (`rows_to_cut`), whatever batches they came in."""

    def __init__(self, max_rows: int, max_bytes: int):
        self.max_rows, self.max_bytes = max_rows, max_bytes
        self.key: tuple | None = None
        self.held: list[pd.DataFrame | list[tuple]] = []  # the current frame's rows so far
        self.count = 0

    def add(
        self, key: tuple, rows: pd.DataFrame | list[tuple], row_size: float
    ) -> Iterator[tuple[tuple, pd.DataFrame]]:
        """The frames complete once `rows` (a run of `key`, after those added before) are added."""
        if key != self.key:
            yield from self.flush()
            self.key = key
        at = 0
        while at < len(rows):
            room = rows_to_cut(self.count, self.max_rows, self.max_bytes, row_size)
            take = min(room, len(rows) - at)
            self.held.append(rows.iloc[at : at + take] if isinstance(rows, pd.DataFrame) else rows[at : at + take])
            self.count, at = self.count + take, at + take
            if take == room:
                yield from self.flush()
                self.key = key

    def flush(self) -> Iterator[tuple[tuple, pd.DataFrame]]:
        if self.held:
            if isinstance(self.held[0], pd.DataFrame):
                frame = self.held[0] if len(self.held) == 1 else pd.concat(self.held)
                frame = frame.reset_index(drop=True)
            else:
                frame = pd.DataFrame([row for part in self.held for row in part])
            yield self.key, frame
        self.key, self.held, self.count = None, [], 0


def load_stream(self: TransformWithStateInPandasSerializer, stream) -> Iterator[tuple]:
    """Drop-in for the upstream method: (PROCESS_DATA, key, rows) per key, then PROCESS_TIMER and COMPLETE."""
    batches = super(ArrowStreamPandasSerializer, self).load_stream(stream)  # Arrow batches, as upstream reads them

    def grouped() -> Iterator[tuple[tuple, pd.DataFrame]]:
        cutter = Cutter(self.arrow_max_records_per_batch, self.arrow_max_bytes_per_batch)
        for batch in batches:
            self._update_batch_size_stats(batch)
            series = ArrowBatchTransformer.to_pandas(
                batch,
                timezone=self._timezone,
                schema=self._input_type,
                struct_in_pandas=self._struct_in_pandas,
                ndarray_as_list=self._ndarray_as_list,
                prefer_int_ext_dtype=self._prefer_int_ext_dtype,
                df_for_struct=self._df_for_struct,
            )
            frame = pd.concat(series, axis=1)
            if plain(batch.schema) and not self._prefer_int_ext_dtype:
                keyed = runs(_as_rows_would_be(frame), self.key_offsets)
            else:
                keyed = row_runs(frame, self.key_offsets)
            for key, rows in keyed:
                yield from cutter.add(key, rows, self.average_arrow_row_size)
        yield from cutter.flush()

    for key, group in itertools.groupby(grouped(), key=lambda kv: kv[0]):
        yield (Mode.PROCESS_DATA, key, group)
    yield (Mode.PROCESS_TIMER, None, None)
    yield (Mode.COMPLETE, None, None)


def request(state_name: str, key: bytes, value: bytes) -> bytes:
    """A map state write's `StateRequest` as upstream serializes it, built in place."""
    import pyspark.sql.streaming.proto.StateMessage_pb2 as messages

    message = messages.StateRequest()
    call = message.stateVariableRequest.mapStateCall
    call.stateName = state_name
    call.updateValue.userKey, call.updateValue.value = key, value
    return message.SerializeToString()


def update_value(self: MapStateClient, state_name: str, user_key: tuple, value: tuple) -> None:
    """Drop-in for upstream's `MapStateClient.update_value`, with the request built by `request`."""
    client = self._stateful_processor_api_client
    key = client._serialize_to_bytes(self.user_key_schema, user_key)
    client._send_proto_message(request(state_name, key, client._serialize_to_bytes(self.value_schema, value)))
    status, error, _ = client._receive_proto_message()
    if status != 0:
        raise PySparkRuntimeError(f"Error updating map state value: {error}")


def applies() -> bool:
    """Whether this process's PySpark is the open-source release `load_stream` and `update_value` reproduce (and not
    opted out)."""
    return not MOVED and pyspark.__version__ == RELEASE and not on_databricks() and not os.environ.get(UPSTREAM_ENV)


def install() -> bool:
    """Use `load_stream` and `update_value` in this process where they `applies`; True if in use."""
    if applies():
        TransformWithStateInPandasSerializer.load_stream = load_stream
        MapStateClient.update_value = update_value
    return not MOVED and TransformWithStateInPandasSerializer.load_stream is load_stream


def notice() -> str | None:
    """What to say once when a job starts with upstream's regrouping and map state writes (None: this module's are
    in use)."""
    if applies():
        return None
    why = MOVED or (UPSTREAM_ENV if os.environ.get(UPSTREAM_ENV) else f"PySpark {pyspark.__version__}, not {RELEASE}")
    return f"stateful input regrouped and map state written by PySpark's own transformWithStateInPandas code ({why})"


class VectorizedInput:
    """Mixin of a StatefulProcessor: unpickled in a Python worker, it installs `load_stream` and `update_value`
    there first."""

    def __setstate__(self, state: dict) -> None:
        install()
        self.__dict__.update(state)


class _EventsAsJson(JStreamingQueryListener):
    """PySpark's bridge from the JVM's listener bus, handing progress and idle events over as their JSON: one call
    into the JVM per event. PySpark's own reads a progress field by field (`fromJObject`: a call per field and per
    metric of each source and state store): with the job's four queries on Kafka at 1,000 tx/s, the JVM thread
    serving those calls took a fifth of a core, beside the micro-batches."""

    def onQueryProgress(self, jevent: Any) -> None:
        self.pylistener.onQueryProgress(QueryProgressEvent.fromJson(json.loads(jevent.json())))

    def onQueryIdle(self, jevent: Any) -> None:
        self.pylistener.onQueryIdle(QueryIdleEvent.fromJson(json.loads(jevent.json())))


class JsonEventsListener(StreamingQueryListener):
    """A listener whose JVM side hands progress and idle events over as JSON (`_EventsAsJson`), where this PySpark
    has the bridge that replaces (its private `_jlistener`); PySpark's own bridge elsewhere."""

    @property
    def _jlistener(self) -> Any:
        if BRIDGE_MOVED:
            return super()._jlistener  # type: ignore[misc]
        if not hasattr(self, "_jlistenerobj"):
            wrapper = SparkContext._jvm.PythonStreamingQueryListenerWrapper  # type: ignore[union-attr]
            self._jlistenerobj = wrapper(_EventsAsJson(self))
        return self._jlistenerobj
