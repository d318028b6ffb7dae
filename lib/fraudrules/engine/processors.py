"""The transformWithState adapter: one call per shard per micro-batch, few state calls.

One stateful query runs both detectors: the window rules over transactions and (with login detection on) the
login detector over login events. Each shard keeps each detector's state under its own names, and each detector
its own watermark: the newest event time it has seen (its clock), minus the allowed lateness, as Spark computes a
query's. Spark keeps one watermark per query, which cannot serve two streams whose event times differ, so the
query declares none.

Every shard gets every micro-batch's events (`inputs.detector_input`), so each batch prunes a shard's state to
the watermark that the next batch runs with: what no window can reach any more, the login sequences that no
event can join any more. That is what Flink's per-key cleanup timers do for keys that get no events; here a
shard's keys are pruned together, and no timer is needed.

Python state calls cost a socket round trip each, and Spark calls `init`, where each state variable is registered
(another round trip, in which the JVM builds its encoders), in every task. A shard therefore keeps two variables:
one value for both detectors (`shard_values`: the window rules' rules, chunk catalog with their clock and
COUNT_WITH_RESET bookkeeping; the login detector's rules, open sequences and clock), read once and written once per
micro-batch, and the window rules' events as chunks in a map (one entry written per batch, see `state`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import numpy as np
import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import TimerValues
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from fraudrules.compat.pyspark import VectorizedInput
from fraudrules.engine import logins
from fraudrules.engine.evaluation import Batch, Timings, stats_row, step, typed
from fraudrules.engine.inputs import LOGIN_FIELDS, login_column
from fraudrules.engine.logins import decode_sequences, encode_sequences
from fraudrules.engine.ruleset import RuleSet
from fraudrules.engine.shard_values import ShardState, ShardValues
from fraudrules.engine.state import BUDGET, STATE_MEMORY_MB, Meta, Resets, ShardEvents, cache_for
from fraudrules.event_schema import DEFAULT, SOURCE_COLUMNS, EventSchema

BLOB = StructType([StructField("blob", BinaryType())])
CHUNK_ID = StructType([StructField("id", LongType())])
LOGIN_TYPE = login_column("eventType")  # non-null exactly on login events
LOGIN_NAMES = {login_column(n): n for n in LOGIN_FIELDS}  # the login step reads the fields by their own names


def watermark_of(clock: int, lateness_ms: int) -> int:
    """A detector's watermark from the newest event time it has seen (`clock`, -1 before any): that time minus
    the allowed lateness, 0 (no watermark) until that is positive, as Spark computes a query's."""
    return max(clock - lateness_ms, 0) if clock >= 0 else 0


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


class WindowRules:
    """The window rules of one shard: rules, catalog (with the detector's clock) and reset bookkeeping in the shard's
    value, events as chunks in a map."""

    def __init__(self, handle: StatefulProcessorHandle, schema: EventSchema, lateness_ms: int, namespace: str):
        self.schema, self.lateness_ms, self.namespace = schema, lateness_ms, namespace
        self.backend = MapBackend(handle.getMapState("chunks", CHUNK_ID, BLOB))

    def process(
        self, events: pd.DataFrame, changes: list[dict], shard: int, shards: int, values: ShardValues, timings: Timings
    ) -> tuple[pd.DataFrame, ShardEvents, dict[str, int]]:
        """A batch's transactions and rule changes: (output rows, the shard's events, counts); `values` updated."""
        rule_set = RuleSet.from_json(values.rules, self.schema)
        catalog, resets = Meta.from_json(values.meta), Resets.decode(values.resets)
        store = ShardEvents(catalog, resets, self.backend, cache_for(self.namespace, shard))
        watermark = watermark_of(catalog.clock, self.lateness_ms)
        batch = Batch(events, changes)
        result = step(
            batch, rule_set, store, watermark, self.lateness_ms, shard, shards, timings=timings, schema=self.schema
        )
        if len(events):
            catalog.clock = max(catalog.clock, int(events["eventTime"].max()))
        if result.rules_changed:
            values.rules = rule_set.to_json()
        if store.resets is not resets:
            values.resets = store.resets.encode()
        catalog.token = uuid.uuid4().hex
        values.meta = catalog.to_json()
        store.cache.retain(catalog.chunks)
        timings.lap("state_calls")
        return result.output, store, result.counts


class LoginDetector:
    """The login detector of one shard: its rules, open sequences and clock in the shard's value."""

    def __init__(self, lateness_ms: int):
        self.lateness_ms = lateness_ms

    def process(
        self, events: pd.DataFrame, changes: list[dict], shard: int, shards: int, values: ShardValues
    ) -> pd.DataFrame:
        """A batch's login events (all shards' ones: each sees every event time) and rule changes: the output rows
        of this shard's users; `values` updated."""
        if events.empty and not changes:  # the clock, so what expires, moves with events: nothing to do
            return pd.DataFrame()
        rule_set = RuleSet.from_json(values.login_rules)
        newest = values.login_clock if values.login_clock is not None else -1
        watermark = watermark_of(newest, self.lateness_ms)
        mine = events[events[login_column("userId")].to_numpy(np.int64) % shards == shard]
        mine = mine[[*LOGIN_NAMES, *SOURCE_COLUMNS]].rename(columns=LOGIN_NAMES)  # not the transactions' columns
        if len(events):
            newest = max(newest, int(events[login_column("eventTimestamp")].max()))
            values.login_clock = newest
        # open sequences that no event at or after the next batch's watermark can join go now
        out, state = logins.step(
            Batch(mine, changes),
            rule_set,
            decode_sequences(values.login_sequences),
            watermark,
            shard,
            expire_at=watermark_of(newest, self.lateness_ms),
        )
        values.login_rules = rule_set.to_json()
        values.login_sequences = encode_sequences(state) if state else None
        return out


class Detectors(VectorizedInput, StatefulProcessor):
    """The window rules over events of the declared `schema` and, with `detect_logins`, the login detector, on
    transformWithStateInPandas; `namespace` names the shard caches of one checkpoint; `legacy`: the checkpoint may
    hold state of layout 1 (`shard_values`)."""

    def __init__(
        self,
        lateness_ms: int,
        labels: list[int],
        namespace: str,
        schema: EventSchema = DEFAULT,
        state_memory_mb: int = STATE_MEMORY_MB,
        detect_logins: bool = False,
        legacy: bool = False,
    ):
        self.lateness_ms = lateness_ms
        self.index = {label: i for i, label in enumerate(labels)}
        self.namespace, self.schema, self.state_memory_mb = namespace, schema, state_memory_mb
        self.detect_logins, self.legacy = detect_logins, legacy

    def init(self, handle: StatefulProcessorHandle) -> None:
        started = time.perf_counter()
        self.state = ShardState(handle, self.legacy)
        self.window = WindowRules(handle, self.schema, self.lateness_ms, self.namespace)
        self.logins = LoginDetector(self.lateness_ms) if self.detect_logins else None
        BUDGET.limit = self.state_memory_mb << 20  # one budget for the worker's shards
        # Spark calls init in every task, so every micro-batch: registering a state variable is a round trip in
        # which the JVM also builds its encoders (here 8-10 ms for the first, ~4 ms for each further value).
        # Reported as the stage "init" of the first shard of the task.
        self.init_ms = (time.perf_counter() - started) * 1000

    def handleInputRows(self, key, rows: Iterator[pd.DataFrame], timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        timings = Timings()
        timings.parts["init"], self.init_ms = self.init_ms, 0.0
        shard, shards = self.index[int(key[0])], len(self.index)
        batch = Batch.of(pd.concat(list(rows), ignore_index=True))  # includes Arrow → pandas of the input
        timings.lap("input")
        values = self.state.get()
        timings.lap("state_calls")
        if self.logins is None:
            out, store, counts = self.window.process(batch.events, batch.rule_changes, shard, shards, values, timings)
            found = pd.DataFrame()
        else:
            is_login = batch.events[LOGIN_TYPE].notna().to_numpy()
            transactions, login_events = batch.events[~is_login], batch.events[is_login]
            out, store, counts = self.window.process(transactions, batch.rule_changes, shard, shards, values, timings)
            found = self.logins.process(login_events, batch.rule_changes, shard, shards, values)
            counts = {**counts, "logins": len(login_events)}
            timings.lap("logins")
        self.state.put(values)
        timings.lap("state_calls")
        yield typed(out, found, stats_row(shard, store, counts, timings))

    def close(self) -> None:
        pass
