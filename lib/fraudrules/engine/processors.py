"""The transformWithState adapters: one call per shard per micro-batch, few state calls.

Python state calls cost a socket round trip each. A window-rules shard keeps its rules (one value), its
chunk catalog (one value), COUNT_WITH_RESET bookkeeping (one value) and its events as chunks in a map (one
entry written per batch, see `state`); one event-time timer per shard, coalesced, drops chunks whose events
have all left their windows, also when the shard gets no more events. A login shard keeps its rules, its
open sequences (one value, small: sequences last minutes) and one coalesced timer.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from fraudrules.engine import logins
from fraudrules.engine.evaluation import OUTPUT_COLUMNS, Batch, Timings, stats_row, step
from fraudrules.engine.logins import decode_sequences, encode_sequences
from fraudrules.engine.pyspark_compat import VectorizedInput
from fraudrules.engine.ruleset import RuleSet
from fraudrules.engine.state import (
    BUDGET,
    STATE_MEMORY_MB,
    Bounds,
    Meta,
    Resets,
    ShardEvents,
    cache_for,
    death_time,
    drop_dead,
)
from fraudrules.event_schema import DEFAULT, EventSchema

TEXT = StructType([StructField("text", StringType())])
BLOB = StructType([StructField("blob", BinaryType())])
CHUNK_ID = StructType([StructField("id", LongType())])


def coalesce(t: int, step_ms: int) -> int:
    """Round a timer up to the next multiple of `step_ms`: one timer serves many expiries."""
    return -(-t // step_ms) * step_ms


class MapBackend:
    """A shard's chunks in the map state `chunks` (id → compressed Arrow file)."""

    def __init__(self, state):
        self.state = state

    def put_chunk(self, chunk_id: int, blob: bytes) -> None:
        self.state.updateValue((chunk_id,), (blob,))

    def remove_chunk(self, chunk_id: int) -> None:
        self.state.removeKey((chunk_id,))

    def chunks(self) -> Iterator[tuple[int, bytes]]:
        for k, v in self.state.iterator():
            yield int(k[0]), bytes(v[0])


class ShardState:
    """Load and save of one shard's rules, catalog and reset bookkeeping."""

    def __init__(self, handle: StatefulProcessorHandle, schema: EventSchema):
        self.handle, self.schema = handle, schema
        self.rules = handle.getValueState("rules", TEXT)
        self.meta = handle.getValueState("meta", TEXT)
        self.resets = handle.getValueState("resets", BLOB)
        self.backend = MapBackend(handle.getMapState("chunks", CHUNK_ID, BLOB))

    def load_rules(self) -> RuleSet:
        row = self.rules.get()
        return RuleSet.from_json(row[0] if row else None, self.schema)

    def load_meta(self) -> Meta:
        row = self.meta.get()
        return Meta.from_json(row[0] if row else None)

    def load_resets(self) -> Resets:
        row = self.resets.get()
        return Resets.decode(bytes(row[0]) if row else None)

    def save(self, meta: Meta, expiry: int, coalesce_ms: int) -> None:
        wanted = coalesce(expiry, coalesce_ms) if expiry >= 0 else -1
        if wanted != meta.timer:
            if meta.timer >= 0:
                self.handle.deleteTimer(meta.timer)
            if wanted >= 0:
                self.handle.registerTimer(wanted)
            meta.timer = wanted
        meta.token = uuid.uuid4().hex
        self.meta.update((meta.to_json(),))


class RulesProcessor(VectorizedInput, StatefulProcessor):
    """Window rules on transformWithStateInPandas over events of the declared `schema`; `namespace` names the
    shard caches of one checkpoint."""

    def __init__(
        self,
        lateness_ms: int,
        labels: list[int],
        namespace: str,
        timer_coalesce_ms: int = 10_000,
        schema: EventSchema = DEFAULT,
        state_memory_mb: int = STATE_MEMORY_MB,
    ):
        self.lateness_ms, self.coalesce_ms = lateness_ms, timer_coalesce_ms
        self.index = {label: i for i, label in enumerate(labels)}
        self.namespace, self.schema, self.state_memory_mb = namespace, schema, state_memory_mb

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = ShardState(handle, self.schema)
        BUDGET.limit = self.state_memory_mb << 20  # one budget for the worker's shards

    def handleInputRows(self, key, rows: Iterator[pd.DataFrame], timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        timings = Timings()
        shard = self.index[int(key[0])]
        batch = Batch.of(pd.concat(list(rows), ignore_index=True))  # includes Arrow → pandas of the input
        timings.lap("input")
        rules, meta, resets = self.state.load_rules(), self.state.load_meta(), self.state.load_resets()
        store = ShardEvents(meta, resets, self.state.backend, cache_for(self.namespace, shard))
        timings.lap("state_calls")
        result = step(
            batch,
            rules,
            store,
            timerValues.getCurrentWatermarkInMs(),
            self.lateness_ms,
            shard,
            len(self.index),
            timings=timings,
            schema=self.schema,
        )
        if result.rules_changed:
            self.state.rules.update((rules.to_json(),))
        if store.resets is not resets:
            self.state.resets.update((store.resets.encode(),))
        self.state.save(store.meta, result.next_expiry, self.coalesce_ms)
        store.cache.retain(store.meta.chunks)
        timings.lap("state_calls")
        yield pd.concat([result.output, stats_row(shard, store, result.counts, timings)], ignore_index=True)

    def handleExpiredTimer(
        self, key, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        rules, meta = self.state.load_rules(), self.state.load_meta()
        meta.timer = -1  # this timer has fired and is gone
        windows = rules.windows()
        drop_dead(meta, Bounds.of(windows, timerValues.getCurrentWatermarkInMs()), self.state.backend)
        expiry = min((death_time(c, windows) for c in meta.chunks), default=-1)
        self.state.save(meta, expiry, self.coalesce_ms)
        yield pd.DataFrame(columns=list(OUTPUT_COLUMNS))

    def close(self) -> None:
        pass


TIMER = StructType([StructField("timer", LongType())])


class LoginProcessor(VectorizedInput, StatefulProcessor):
    """The login detector on transformWithStateInPandas: per shard its rules, open sequences, one timer."""

    def __init__(self, labels: list[int], timer_coalesce_ms: int = 10_000):
        self.index = {label: i for i, label in enumerate(labels)}
        self.coalesce_ms = timer_coalesce_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.rules = handle.getValueState("rules", TEXT)
        self.sequences = handle.getValueState("sequences", BLOB)
        self.meta = handle.getValueState("meta", TIMER)

    def _load(self) -> tuple[RuleSet, logins.State, int]:
        rules, blob, meta = self.rules.get(), self.sequences.get(), self.meta.get()
        state = decode_sequences(bytes(blob[0]) if blob else None)
        return RuleSet.from_json(rules[0] if rules else None), state, meta[0] if meta else -1

    def _save(self, rules: RuleSet, state: logins.State, timer: int) -> None:
        self.rules.update((rules.to_json(),))
        expiry = logins.next_expiry(state, logins.windows_of(rules))
        wanted = coalesce(expiry, self.coalesce_ms) if state else -1
        if wanted != timer:
            if timer >= 0:
                self.handle.deleteTimer(timer)
            if wanted >= 0:
                self.handle.registerTimer(wanted)
        if state:
            self.sequences.update((encode_sequences(state),))
        else:
            self.sequences.clear()
        self.meta.update((wanted,))

    def handleInputRows(self, key, rows: Iterator[pd.DataFrame], timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        batch = Batch.of(pd.concat(list(rows), ignore_index=True))
        rules, state, timer = self._load()
        out, state = logins.step(batch, rules, state, timerValues.getCurrentWatermarkInMs(), self.index[int(key[0])])
        self._save(rules, state, timer)
        yield out

    def handleExpiredTimer(
        self, key, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        rules, state, _timer = self._load()
        live = logins.expire(state, logins.windows_of(rules), timerValues.getCurrentWatermarkInMs())
        self._save(rules, live, -1)
        yield pd.DataFrame(columns=list(OUTPUT_COLUMNS))

    def close(self) -> None:
        pass
