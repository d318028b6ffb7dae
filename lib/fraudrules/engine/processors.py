"""The transformWithState stages: one call per shard per micro-batch, state read and written once.

Per-event (or even per-key) state calls cost about a millisecond each through the Python state
API, so a shard's state lives in one Arrow-encoded value (`state.py`) and is processed by the pure
steps (`evaluation.step` for window rules, `logins.step` for the login detector). One event-time
timer per shard, coalesced, cleans up shards that stop receiving events.
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from fraudrules.engine import logins
from fraudrules.engine.evaluation import OUTPUT_COLUMNS, Meta, expire, step
from fraudrules.engine.logins import LOGIN_OUTPUT_COLUMNS, State
from fraudrules.engine.state import decode_events, decode_sequences, encode_events, encode_sequences
from fraudrules.engine.windowing import Events
from fraudrules.rules.codec import decode_active_logins, encode_active_logins

META_SCHEMA = StructType(
    [
        StructField("next_seq", LongType()),
        StructField("epoch", LongType()),
        StructField("active", StringType()),
        StructField("timer", LongType()),
    ]
)
EVENTS_SCHEMA = StructType([StructField("blob", BinaryType())])


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
        return decode_events(blob[0] if blob else None), (Meta(*meta) if meta else Meta())

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
        self.events_state.update((encode_events(events),))
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


LOGIN_META_SCHEMA = StructType([StructField("timer", LongType())])
SEQUENCES_SCHEMA = StructType([StructField("blob", BinaryType()), StructField("active", BinaryType())])


class LoginProcessor(StatefulProcessor):
    """transformWithState adapter: per shard, open sequences in one value and one coalesced timer."""

    def __init__(self, timer_coalesce_ms: int = 10_000):
        self.coalesce_ms = timer_coalesce_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.blob = handle.getValueState("sequences", SEQUENCES_SCHEMA)
        self.meta = handle.getValueState("meta", LOGIN_META_SCHEMA)

    def _load(self) -> tuple[State, dict[int, int], int]:
        blob, meta = self.blob.get(), self.meta.get()
        windows = decode_active_logins(bytes(blob[1]).decode()) if blob else {}
        return decode_sequences(bytes(blob[0]) if blob else None), windows, (meta[0] if meta else -1)

    def _save(self, state: State, windows: dict[int, int], timer: int) -> None:
        if timer >= 0:
            self.handle.deleteTimer(timer)
        if not state:
            self.blob.clear()
            self.meta.clear()
            return
        wanted = -(-logins.next_expiry(state, windows) // self.coalesce_ms) * self.coalesce_ms
        self.handle.registerTimer(wanted)
        active = encode_active_logins(windows).encode()
        self.blob.update((encode_sequences(state), active))
        self.meta.update((wanted,))

    def handleInputRows(self, key, rows: Iterator[pd.DataFrame], timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        batch = pd.concat(list(rows), ignore_index=True)
        state, _windows, timer = self._load()
        out, state, windows = logins.step(batch, state, timerValues.getCurrentWatermarkInMs(), int(key[0]))
        self._save(state, windows, timer)
        if len(out):
            yield out

    def handleExpiredTimer(
        self, key, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        state, windows, _timer = self._load()
        self._save(logins.expire(state, windows, timerValues.getCurrentWatermarkInMs()), windows, -1)
        yield pd.DataFrame(columns=list(LOGIN_OUTPUT_COLUMNS))

    def close(self) -> None:
        pass
