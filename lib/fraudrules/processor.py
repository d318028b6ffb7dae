"""The transformWithState stage: one call per shard per micro-batch, state read and written once.

Per-event (or even per-key) state calls cost about a millisecond each through the Python state
API, so a shard's retained events live in one Arrow-encoded value and are evaluated vectorised
(`evaluation.step`). One event-time timer per shard, coalesced, cleans up shards that stop
receiving events.
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from fraudrules.evaluation import OUTPUT_COLUMNS, Meta, expire, step
from fraudrules.windowing import Events

META_SCHEMA = StructType(
    [
        StructField("next_seq", LongType()),
        StructField("epoch", LongType()),
        StructField("active", StringType()),
        StructField("timer", LongType()),
    ]
)
EVENTS_SCHEMA = StructType([StructField("blob", BinaryType())])


def encode(events: Events) -> bytes:
    return arrow_bytes(pa.Table.from_pandas(events.to_frame(), preserve_index=False))


def arrow_bytes(table: pa.Table) -> bytes:
    """A table as one Arrow IPC stream: the form every processor keeps its state in."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode(blob: bytes | None) -> Events:
    if not blob:
        return Events.empty()
    return Events.from_frame(pa.ipc.open_stream(blob).read_all().to_pandas())


class RulesProcessor(StatefulProcessor):
    def __init__(self, lateness_ms: int, timer_coalesce_ms: int = 10_000):
        self.lateness_ms = lateness_ms
        self.coalesce_ms = timer_coalesce_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.meta_state = handle.getValueState("meta", META_SCHEMA)
        self.events_state = handle.getValueState("events", EVENTS_SCHEMA)

    def _load(self) -> tuple[Events, Meta]:
        meta = self.meta_state.get()
        blob = self.events_state.get()
        return decode(blob[0] if blob else None), (Meta(*meta) if meta else Meta())

    def _save(self, events: Events, meta: Meta, expiry: int) -> None:
        if len(events) == 0:  # nothing retained: leave no state and no timer behind
            if meta.timer >= 0:
                self.handle.deleteTimer(meta.timer)
            self.events_state.clear()
            self.meta_state.clear()
            return
        wanted = -(-expiry // self.coalesce_ms) * self.coalesce_ms  # round up: one timer serves many keys
        if wanted != meta.timer:
            if meta.timer >= 0:
                self.handle.deleteTimer(meta.timer)
            self.handle.registerTimer(wanted)
            meta.timer = wanted
        self.events_state.update((encode(events),))
        self.meta_state.update((meta.next_seq, meta.epoch, meta.active, meta.timer))

    def handleInputRows(self, key, rows: Iterator[pd.DataFrame], timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        batch = pd.concat(list(rows), ignore_index=True)
        events, meta = self._load()
        result = step(batch, events, meta, timerValues.getCurrentWatermarkInMs(), self.lateness_ms, int(key[0]))
        self._save(result.state, result.meta, result.next_expiry)
        if len(result.output):
            yield result.output

    def handleExpiredTimer(
        self, key, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        events, meta = self._load()
        meta.timer = -1  # this timer has fired and is gone
        kept, expiry = expire(events, meta, timerValues.getCurrentWatermarkInMs())
        self._save(kept, meta, expiry)
        yield pd.DataFrame(columns=list(OUTPUT_COLUMNS))

    def close(self) -> None:
        pass
