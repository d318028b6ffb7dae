"""A chunk's events as the state store keeps them: compact Arrow IPC, LZ4-compressed."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from fraudrules.engine.state.catalog import rule_pairs
from fraudrules.engine.windowing import FIELDS, Events

_STORED = pa.ipc.IpcWriteOptions(compression="lz4")  # state store bytes cost ~30 ms/MB to write


_NARROW = (pa.int8(), pa.int16(), pa.int32(), pa.int64())


def encode(ev: Events) -> bytes:
    """A chunk as the state store keeps it, compact: (rule, sig) as an index into the chunk's pairs, every
    other column as offsets from its minimum in the narrowest integer type, LZ4-compressed."""
    span, pairs = rule_pairs(ev)
    columns = {"span": span, **{f: getattr(ev, f) for f in FIELDS if f not in ("rule", "sig")}}
    arrays, bases = {}, {}
    for name, values in columns.items():
        low, high = (int(values.min()), int(values.max())) if len(values) else (0, 0)
        kind = next((t for t in _NARROW if high - low <= np.iinfo(t.to_pandas_dtype()).max), None)
        base = low if kind is not None else 0  # a range wider than int64 (hashes): stored as it is
        kind = kind or pa.int64()
        arrays[name], bases[name] = pa.array((values - base).astype(kind.to_pandas_dtype()), type=kind), base
    meta = {"bases": json.dumps(bases), "pairs": json.dumps(pairs.tolist())}
    return ipc(pa.table(arrays).replace_schema_metadata(meta))


def decode(blob: bytes) -> Events:
    table = pa.ipc.open_file(pa.py_buffer(blob)).read_all()
    meta = table.schema.metadata
    bases = json.loads(meta[b"bases"])
    col = {n: table.column(n).to_numpy().astype(np.int64) + bases[n] for n in table.column_names}
    pairs = np.array(json.loads(meta[b"pairs"]), dtype=np.int64).reshape(-1, 2)
    return Events(
        rule=pairs[col["span"], 0], sig=pairs[col["span"], 1], **{f: col[f] for f in FIELDS if f not in ("rule", "sig")}
    )


def ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema, options=_STORED) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()
