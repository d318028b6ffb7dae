"""The vectorized transformWithStateInPandas input against PySpark's own, on the installed PySpark: same modes,
keys, frames and dtypes, from the same Arrow stream. No Spark session."""

from __future__ import annotations

import io
import pickle

import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.pandas.serializers import TransformWithStateInPandasSerializer

from fraudrules.engine import tws_input
from fraudrules.engine.processors import LoginProcessor, RulesProcessor
from fraudrules.engine.tws_input import Mode


def serializer(max_records: int = 10_000) -> TransformWithStateInPandasSerializer:
    ser = TransformWithStateInPandasSerializer(
        timezone="UTC",
        safecheck=True,
        assign_cols_by_name=True,
        prefer_int_ext_dtype=False,
        arrow_max_records_per_batch=max_records,
        arrow_max_bytes_per_batch=2**31 - 1,
        int_to_decimal_coercion_enabled=False,
    )
    ser.key_offsets = [0]
    return ser


def stream(*batches: pa.RecordBatch) -> io.BytesIO:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return io.BytesIO(sink.getvalue())


def batch(shards: list[int], **extra: pa.Array) -> pa.RecordBatch:
    """Rows like the stateful stage's: the shard key first, then event columns (`extra`, or defaults)."""
    n = len(shards)
    columns = {
        "shard": pa.array(shards, pa.int32()),
        "eventTime": pa.array(range(n), pa.int64()),
        "paymentAmount": pa.array([None if i % 3 == 0 else i * 100 for i in range(n)], pa.int64()),
        "score": pa.array([float("nan") if i % 2 else 0.5 * i for i in range(n)], pa.float64()),
        "flag": pa.array([i % 2 == 0 for i in range(n)], pa.bool_()),
        "ruleChange": pa.array([None if i % 4 else f'{{"ruleId": {i}}}' for i in range(n)], pa.string()),
        **extra,
    }
    return pa.RecordBatch.from_pydict(columns)


def read(load_stream, ser: TransformWithStateInPandasSerializer, data: io.BytesIO) -> list[tuple]:
    """(mode, key, the key's rows as one frame or None, how many frames they came in)."""
    out = []
    for mode, key, group in load_stream(ser, data):
        frames = [frame for _, frame in group] if group is not None else []
        rows = pd.concat(frames, ignore_index=True) if frames else None
        out.append((mode, key, rows, len(frames)))
    return out


def assert_same(ours: list[tuple], upstream: list[tuple]) -> None:
    assert [(m, k) for m, k, _, _ in ours] == [(m, k) for m, k, _, _ in upstream]
    for (_, key, rows, _), (_, _, expected, _) in zip(ours, upstream, strict=True):
        if expected is None:
            assert rows is None
        else:
            pd.testing.assert_frame_equal(rows, expected, check_dtype=True, obj=f"rows of key {key}")
            assert [type(v) for v in key] == [int]  # a Python int, as upstream hands the processor


def test_groups_runs_of_a_key_across_batches_as_upstream_does():
    data = [batch([1, 1, 2]), batch([2, 2, 3, 3, 3]), batch([3]), batch([4, 5])]
    ours = read(tws_input.load_stream, serializer(), stream(*data))
    upstream = read(tws_input.UPSTREAM, serializer(), stream(*data))
    assert [k for _, k, _, _ in ours] == [(1,), (2,), (3,), (4,), (5,), None, None]
    assert [len(r) for _, _, r, _ in ours if r is not None] == [2, 3, 4, 1, 1]
    assert_same(ours, upstream)
    assert [n for *_, n in ours[:5]] == [1, 2, 2, 1, 1]  # a key's rows, one frame per batch they arrived in


def test_columns_a_row_holds_differently_are_regrouped_row_by_row_as_upstream_does():
    when = pa.array([1_700_000_000_000_000] * 3, pa.timestamp("us", tz="UTC"))
    data = [batch([1, 1, 2], at=when), batch([2, 3, 3], at=when)]
    assert not tws_input.plain(data[0].schema)
    assert_same(
        read(tws_input.load_stream, serializer(), stream(*data)), read(tws_input.UPSTREAM, serializer(), stream(*data))
    )


def test_an_empty_stream_only_ends_the_batch():
    ours = read(tws_input.load_stream, serializer(), stream(batch([])))
    assert [(m, k) for m, k, _, _ in ours] == [(Mode.PROCESS_TIMER, None), (Mode.COMPLETE, None)]
    assert_same(ours, read(tws_input.UPSTREAM, serializer(), stream(batch([]))))


@pytest.mark.parametrize("processor", [RulesProcessor(60_000, [7], "ns"), LoginProcessor([7])])
def test_a_worker_unpickling_a_processor_installs_it(monkeypatch, processor):
    monkeypatch.setattr(TransformWithStateInPandasSerializer, "load_stream", tws_input.UPSTREAM)
    copy = pickle.loads(pickle.dumps(processor))
    assert TransformWithStateInPandasSerializer.load_stream is tws_input.load_stream
    assert copy.__dict__ == processor.__dict__


@pytest.mark.parametrize("where", ["a later release", "a Databricks runtime"])
def test_another_pyspark_keeps_its_own(monkeypatch, where):
    monkeypatch.setattr(TransformWithStateInPandasSerializer, "load_stream", tws_input.UPSTREAM)
    if where == "a later release":
        monkeypatch.setattr(tws_input.pyspark, "__version__", "4.3.0")
    else:
        monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "17.3")
    assert not tws_input.install()
    assert TransformWithStateInPandasSerializer.load_stream is tws_input.UPSTREAM
