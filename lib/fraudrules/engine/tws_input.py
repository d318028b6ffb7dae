"""transformWithStateInPandas input grouped by key without a Python step per row.

PySpark 4.2's `TransformWithStateInPandasSerializer.load_stream` regroups the input rows by key one row at a
time (`itertuples`, `itertools.groupby`, then `pd.DataFrame(rows)`): 1.5 s of Python for 200,000 rows here,
on the one core a shard's task has, where Arrow → pandas itself takes 0.16 s. The JVM sends a key's rows
together, so the same groups are runs of equal keys in each Arrow batch: found with numpy and sliced from the
batch's frame. The frames, keys and modes yielded are those of the upstream method (`tests/unit/
test_tws_input.py` compares both on the installed PySpark).

Installed in a Python worker when it unpickles one of the job's processors (`VectorizedInput`), before the
worker reads its input. Only on the PySpark release it was written against, and only for batches of plain
columns (integers, floats, booleans, strings, binary): a batch with other columns is regrouped row by row as
upstream does, and every other PySpark keeps its own method: a later release, and a Databricks runtime's (its
own build, whatever version it reports).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyspark
from pyspark.sql.conversion import ArrowBatchTransformer
from pyspark.sql.pandas.serializers import ArrowStreamPandasSerializer, TransformWithStateInPandasSerializer
from pyspark.sql.streaming.stateful_processor_util import TransformWithStateInPandasFuncMode as Mode

from fraudrules.session import on_databricks

PYSPARK_RELEASE = "4.2."  # the release whose load_stream this one reproduces
UPSTREAM = TransformWithStateInPandasSerializer.load_stream


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


def row_runs(frame: pd.DataFrame, key_offsets: list[int]) -> Iterator[tuple[tuple, pd.DataFrame]]:
    """`runs` as upstream finds them, row by row: for columns whose values a row and a column hold differently."""
    rows = ((tuple(row[o] for o in key_offsets), row) for row in frame.itertuples(index=False))
    for key, group in itertools.groupby(rows, key=lambda kv: kv[0]):
        yield key, pd.DataFrame([row for _, row in group])


def load_stream(self: TransformWithStateInPandasSerializer, stream) -> Iterator[tuple]:
    """Drop-in for the upstream method: (PROCESS_DATA, key, rows) per key, then PROCESS_TIMER and COMPLETE."""
    batches = super(ArrowStreamPandasSerializer, self).load_stream(stream)  # Arrow batches, as upstream reads them

    def grouped() -> Iterator[tuple[tuple, pd.DataFrame]]:
        for batch in batches:
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
                yield from runs(_as_rows_would_be(frame), self.key_offsets)
            else:
                yield from row_runs(frame, self.key_offsets)

    for key, group in itertools.groupby(grouped(), key=lambda kv: kv[0]):
        yield (Mode.PROCESS_DATA, key, group)
    yield (Mode.PROCESS_TIMER, None, None)
    yield (Mode.COMPLETE, None, None)


def install() -> bool:
    """Use `load_stream` in this process when PySpark is the open-source release it reproduces; True if in use."""
    if pyspark.__version__.startswith(PYSPARK_RELEASE) and not on_databricks():
        TransformWithStateInPandasSerializer.load_stream = load_stream
    return TransformWithStateInPandasSerializer.load_stream is load_stream


class VectorizedInput:
    """Mixin of a StatefulProcessor: unpickled in a Python worker, it installs `load_stream` there first."""

    def __setstate__(self, state: dict) -> None:
        install()
        self.__dict__.update(state)
