"""The PySpark internals the job uses (`compat/pyspark.py`), guarded. The vectorized transformWithStateInPandas input
against PySpark's own, on the installed PySpark: same modes,
keys, frames (cut at the same rows by the records and bytes bounds), dtypes and batch-size statistics, from the
same Arrow stream. No Spark session."""

from __future__ import annotations

import io
import pickle
import socket
import struct
import subprocess
import sys
import threading

import pandas as pd
import pyarrow as pa
import pyspark.sql.streaming.proto.StateMessage_pb2 as messages
import pytest
from pyspark.errors import PySparkRuntimeError
from pyspark.sql.pandas.serializers import TransformWithStateInPandasSerializer
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import JStreamingQueryListener
from pyspark.sql.streaming.map_state_client import MapStateClient
from pyspark.sql.streaming.stateful_processor_api_client import StatefulProcessorApiClient
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from fraudrules.compat import pyspark as pyspark_compat
from fraudrules.compat.pyspark import Mode
from fraudrules.engine.processors import Detectors


def serializer(max_records: int = 10_000, max_bytes: int = 2**31 - 1) -> TransformWithStateInPandasSerializer:
    ser = TransformWithStateInPandasSerializer(
        timezone="UTC",
        safecheck=True,
        assign_cols_by_name=True,
        prefer_int_ext_dtype=False,
        arrow_max_records_per_batch=max_records,
        arrow_max_bytes_per_batch=max_bytes,
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
    """(mode, key, the key's frames as handed over, or None)."""
    return [
        (mode, key, [f for _, f in group] if group is not None else None) for mode, key, group in load_stream(ser, data)
    ]


def assert_same(ours: list[tuple], upstream: list[tuple]) -> None:
    """The same keys in the same modes, each with the same frames: as many, cut at the same rows, same dtypes."""
    assert [(m, k) for m, k, _ in ours] == [(m, k) for m, k, _ in upstream]
    for (_, key, frames), (_, _, expected) in zip(ours, upstream, strict=True):
        if expected is None:
            assert frames is None
            continue
        assert [len(f) for f in frames] == [len(f) for f in expected], f"frames of key {key}"
        for frame, want in zip(frames, expected, strict=True):
            pd.testing.assert_frame_equal(frame, want, check_dtype=True, obj=f"a frame of key {key}")
        assert [type(v) for v in key] == [int]  # a Python int, as upstream hands the processor


def parity(data: list[pa.RecordBatch], **bounds: int) -> list[tuple]:
    """Ours and upstream's on the same stream and bounds; also the serializers' batch-size statistics."""
    ours_ser, upstream_ser = serializer(**bounds), serializer(**bounds)
    ours = read(pyspark_compat.load_stream, ours_ser, stream(*data))
    assert_same(ours, read(pyspark_compat.UPSTREAM, upstream_ser, stream(*data)))
    stats = ("total_bytes", "total_rows", "average_arrow_row_size")
    assert [getattr(ours_ser, a) for a in stats] == [getattr(upstream_ser, a) for a in stats]
    return ours


def test_groups_runs_of_a_key_across_batches_as_upstream_does():
    data = [batch([1, 1, 2]), batch([2, 2, 3, 3, 3]), batch([3]), batch([4, 5])]
    ours = parity(data)
    assert [k for _, k, _ in ours] == [(1,), (2,), (3,), (4,), (5,), None, None]
    assert [[len(f) for f in frames] for _, _, frames in ours[:5]] == [[2], [3], [4], [1], [1]]


@pytest.mark.parametrize(
    "bounds",
    [
        {"max_records": 2},
        {"max_records": 3},
        {"max_bytes": 60},
        {"max_bytes": 100},
        {"max_records": 4, "max_bytes": 70},
    ],
)
def test_cuts_a_keys_rows_where_upstream_does_by_records_and_by_bytes(bounds):
    """Frames of at most max_records rows, or fewer rows than reach max_bytes at the running average row size
    (which changes from batch to batch): the same cuts, rows and statistics as upstream's."""
    data = [
        batch([1] * 5 + [2] * 2),
        batch([2] * 7),
        batch([2, 3, 3], ruleChange=pa.array(["x" * 40] * 3)),
        batch([3] * 9),
    ]
    ours = parity(data, **bounds)
    assert any(len(frames) > 1 for _, _, frames in ours if frames)  # the bounds did cut


def test_columns_a_row_holds_differently_are_regrouped_row_by_row_as_upstream_does():
    when = pa.array([1_700_000_000_000_000] * 3, pa.timestamp("us", tz="UTC"))
    data = [batch([1, 1, 2], at=when), batch([2, 3, 3], at=when)]
    assert not pyspark_compat.plain(data[0].schema)
    parity(data)
    parity(data, max_records=2, max_bytes=90)


def test_an_empty_stream_only_ends_the_batch():
    ours = parity([batch([])])
    assert [(m, k) for m, k, _ in ours] == [(Mode.PROCESS_TIMER, None), (Mode.COMPLETE, None)]


@pytest.mark.parametrize("processor", [Detectors(60_000, [7], "ns"), Detectors(60_000, [7], "ns", detect_logins=True)])
def test_a_worker_unpickling_a_processor_installs_it(monkeypatch, processor):
    upstream(monkeypatch)
    copy = pickle.loads(pickle.dumps(processor))
    assert TransformWithStateInPandasSerializer.load_stream is pyspark_compat.load_stream
    assert MapStateClient.update_value is pyspark_compat.update_value
    assert copy.__dict__ == processor.__dict__


def test_its_release_uses_it_and_says_nothing(monkeypatch):
    upstream(monkeypatch)
    assert pyspark_compat.pyspark.__version__ == pyspark_compat.RELEASE == "4.2.1"
    assert pyspark_compat.install() and pyspark_compat.notice() is None


@pytest.mark.parametrize("where", ["a patch release", "a later release", "a Databricks runtime", "an opt-out"])
def test_another_pyspark_keeps_its_own_and_the_job_says_so(monkeypatch, where):
    upstream(monkeypatch)
    if where in ("a patch release", "a later release"):
        monkeypatch.setattr(pyspark_compat.pyspark, "__version__", "4.2.2" if where == "a patch release" else "4.3.0")
    elif where == "a Databricks runtime":
        monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "17.3")
    else:
        monkeypatch.setenv(pyspark_compat.UPSTREAM_ENV, "1")
    assert not pyspark_compat.install()
    assert TransformWithStateInPandasSerializer.load_stream is pyspark_compat.UPSTREAM
    assert MapStateClient.update_value is pyspark_compat.UPSTREAM_UPDATE
    assert pyspark_compat.notice().startswith(
        "stateful input regrouped and map state written by PySpark's own transformWithStateInPandas"
    )


def test_a_pyspark_that_moved_a_private_module_runs_the_job_with_its_own_code():
    """The private modules are imported in a guard: without one, the job's modules import, nothing is replaced, the
    job says why, and its listeners take PySpark's own bridge."""
    script = """
import pyspark.sql.conversion
del pyspark.sql.conversion.ArrowBatchTransformer  # what a PySpark that moved it looks like to an import
from fraudrules.compat import pyspark as compat
from fraudrules.engine import job, processors, progress
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.pandas.serializers import TransformWithStateInPandasSerializer as S
print(compat.MOVED)
print(compat.applies(), compat.install(), S.load_stream is compat.load_stream)
print(compat.notice())
print(issubclass(progress.ProgressPrinter, StreamingQueryListener))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    moved = "cannot import name 'ArrowBatchTransformer' from 'pyspark.sql.conversion'"
    moved_line, effect, notice, listener = out.splitlines()
    assert moved_line.startswith(f"PySpark 4.2.1: {moved}")
    assert (effect, listener) == ("False False False", "True")
    assert notice.startswith("stateful input regrouped and map state written by PySpark's own") and moved in notice


def test_the_listener_bridge_replaces_what_pyspark_builds_its_own_from():
    """`JsonEventsListener` overrides PySpark's private `_jlistener` with the bridge class PySpark's own uses: an
    upgrade that renames either makes this fail (the override would be silently unused)."""
    assert isinstance(vars(StreamingQueryListener).get("_jlistener"), property)
    assert JStreamingQueryListener.Java.implements == ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]
    assert issubclass(pyspark_compat._EventsAsJson, JStreamingQueryListener)
    assert isinstance(vars(pyspark_compat.JsonEventsListener)["_jlistener"], property)
    assert pyspark_compat.MOVED is None and pyspark_compat.BRIDGE_MOVED is None


def upstream(monkeypatch) -> None:
    """This process with PySpark's own methods (a test before may have installed ours)."""
    monkeypatch.setattr(TransformWithStateInPandasSerializer, "load_stream", pyspark_compat.UPSTREAM)
    monkeypatch.setattr(MapStateClient, "update_value", pyspark_compat.UPSTREAM_UPDATE)


class Server:
    """The state server's end of a real socket: records each request, answers each with `status`."""

    def __init__(self, status: int = 0):
        self.status, self.sent = status, []
        self.listener = socket.create_server(("localhost", 0))
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        with self.listener:  # one client
            conn, _ = self.listener.accept()
        with conn, conn.makefile("rwb") as stream:
            while header := stream.read(8):
                _, length = struct.unpack(">ii", header)
                self.sent.append(stream.read(length))
                answer = messages.StateResponse(statusCode=self.status, errorMessage="no such state" * self.status)
                body = answer.SerializeToString()
                stream.write(struct.pack(">i", len(body)) + body)
                stream.flush()

    def client(self) -> StatefulProcessorApiClient:
        return StatefulProcessorApiClient(self.listener.getsockname()[1], StructType([]))


def map_state(server: Server) -> MapStateClient:
    key = StructType([StructField("chunkId", LongType())])
    return MapStateClient(server.client(), key, StructType([StructField("blob", BinaryType())]))


@pytest.mark.parametrize("size", [0, 1, 1 << 20])
def test_a_map_state_write_sends_the_bytes_upstream_sends(size):
    blob = bytes(range(256)) * (size // 256) + b"\x00" * (size % 256)
    ours, theirs = Server(), Server()
    pyspark_compat.update_value(map_state(ours), "chunks", (7,), (blob,))
    pyspark_compat.UPSTREAM_UPDATE(map_state(theirs), "chunks", (7,), (blob,))
    assert len(ours.sent) == 1 and ours.sent == theirs.sent
    assert blob in ours.sent[0]


def test_a_map_state_write_the_server_refuses_raises_as_upstream_does():
    for update in (pyspark_compat.update_value, pyspark_compat.UPSTREAM_UPDATE):
        with pytest.raises(PySparkRuntimeError, match="Error updating map state value: no such state"):
            update(map_state(Server(status=1)), "chunks", (7,), (b"blob",))
