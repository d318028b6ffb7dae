"""The processors' state codec: each shard's state is one Arrow IPC stream in one value.

Per-event (or even per-key) state calls cost about a millisecond each through the Python state API, so
a shard's retained window events, and its open login sequences, are read and written as one blob per
micro-batch.
"""

from __future__ import annotations

import pyarrow as pa

from fraudrules.engine.logins import Sequence, State
from fraudrules.engine.windowing import Events


def arrow_bytes(table: pa.Table) -> bytes:
    """A table as one Arrow IPC stream: the form every processor keeps its state in."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def encode_events(events: Events) -> bytes:
    return arrow_bytes(pa.Table.from_pandas(events.to_frame(), preserve_index=False))


def decode_events(blob: bytes | None) -> Events:
    if not blob:
        return Events.empty()
    return Events.from_frame(pa.ipc.open_stream(blob).read_all().to_pandas())


def encode_sequences(state: State) -> bytes:
    frame = pa.table(
        {
            "rule": [k[0] for k in state],
            "user": [k[1] for k in state],
            "start": [s.start for s in state.values()],
            "ips": [s.ips for s in state.values()],
        }
    )
    return arrow_bytes(frame)


def decode_sequences(blob: bytes | None) -> State:
    if not blob:
        return {}
    table = pa.ipc.open_stream(blob).read_all().to_pydict()
    return {
        (int(r), int(u)): Sequence(int(s), list(ips))
        for r, u, s, ips in zip(table["rule"], table["user"], table["start"], table["ips"], strict=True)
    }
