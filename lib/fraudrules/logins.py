"""Login anomaly detection (seed 000): failures from several IPs, then a success from a new IP.

Per user, events in eventTimestamp order (ties in source order). A sequence opens at a FAIL when none
is open and stays open for events with time ≤ start + W. A FAIL inside it joins it, a FAIL after it
starts a new one. A SUCCESS inside it alerts iff the sequence holds ≥ minFailures failures from
≥ minDistinctIps distinct IPs and the success's IP is not one of them; the sequence closes either way.
An expired sequence (start + W behind the watermark) is dropped; that never changes a result.

This module is the pure per-shard step; the transformWithState adapter is `LoginProcessor`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from fraudrules.evaluation import LATE_REASON, typed
from fraudrules.processor import arrow_bytes

LOGIN_COLUMNS = (
    "shard", "userId", "eventType", "ipAddress", "eventTimestamp", "ingestionTimestamp", "srcTime", "srcId", "srcPos",
    "ruleId", "ruleVersion", "minFailures", "minDistinctIps", "windowMs", "active",
)  # fmt: skip
LOGIN_OUTPUT_SCHEMA = (
    "kind string, shard int, ruleId long, ruleVersion long, userId long, eventTime long, ingestionTimestamp long, "
    "key string, aggregate string, watermark long, producedAt long, reason string, details string, message string"
)
LOGIN_OUTPUT_COLUMNS = tuple(part.strip().split(" ")[0] for part in LOGIN_OUTPUT_SCHEMA.split(","))


@dataclass
class Sequence:
    start: int
    ips: list[str] = field(default_factory=list)  # one entry per failure, in arrival order


State = dict[tuple[int, int], Sequence]  # (ruleId, userId) -> open sequence


def encode(state: State) -> bytes:
    frame = pa.table({
        "rule": [k[0] for k in state], "user": [k[1] for k in state],
        "start": [s.start for s in state.values()], "ips": [s.ips for s in state.values()],
    })  # fmt: skip
    return arrow_bytes(frame)


def decode(blob: bytes | None) -> State:
    if not blob:
        return {}
    table = pa.ipc.open_stream(blob).read_all().to_pydict()
    return {
        (int(r), int(u)): Sequence(int(s), list(ips))
        for r, u, s, ips in zip(table["rule"], table["user"], table["start"], table["ips"], strict=True)
    }


def _active(text: str) -> dict[int, int]:
    """{ruleId: windowMs} from "ruleId:windowMs,..."."""
    return {int(r): int(w) for r, w in (item.split(":") for item in text.split(",") if item)}


def expire(state: State, windows: dict[int, int], watermark: int) -> State:
    """Drop sequences whose window the watermark has passed, and those of rules no longer ACTIVE."""
    return {k: s for k, s in state.items() if k[0] in windows and s.start + windows[k[0]] >= watermark}


def next_expiry(state: State, windows: dict[int, int]) -> int:
    return min((s.start + windows[k[0]] + 1 for k, s in state.items()), default=-1)


def step(batch: pd.DataFrame, state: State, watermark: int, shard: int, now_ms: int | None = None
         ) -> tuple[pd.DataFrame, State, dict[int, int]]:  # fmt: skip
    """One shard's login events of one micro-batch: (output rows, next state, active windows)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    batch = batch.sort_values(["eventTimestamp", "srcTime", "srcId", "srcPos", "ruleId"], kind="stable")
    windows = _active(str(batch["active"].iloc[0]))
    state = {k: s for k, s in state.items() if k[0] in windows}
    out: list[dict] = []
    for ev in batch.itertuples(index=False):
        base = {"shard": shard, "ruleId": ev.ruleId, "ruleVersion": ev.ruleVersion, "userId": ev.userId,
                "eventTime": ev.eventTimestamp, "ingestionTimestamp": ev.ingestionTimestamp,
                "key": f'{{"userId":"{ev.userId}"}}', "watermark": watermark, "producedAt": now_ms}  # fmt: skip
        t = int(ev.eventTimestamp)
        if watermark > 0 and t < watermark:
            out.append({**base, "kind": "late", "reason": LATE_REASON})
            continue
        k = (int(ev.ruleId), int(ev.userId))
        seq = state.get(k)
        is_open = seq is not None and t <= seq.start + int(ev.windowMs)
        if ev.eventType == "FAIL":
            if is_open:
                seq.ips.append(ev.ipAddress)
            else:
                state[k] = Sequence(t, [ev.ipAddress])
        elif is_open:  # SUCCESS inside an open sequence: decide, then close it
            distinct = sorted(set(seq.ips))
            if len(seq.ips) >= ev.minFailures and len(distinct) >= ev.minDistinctIps and ev.ipAddress not in distinct:
                out.append({**base, "kind": "alert", "aggregate": str(len(seq.ips)),
                            "details": json.dumps({"failures": len(seq.ips), "distinctIps": len(distinct),
                                                   "failedIps": distinct, "successIp": ev.ipAddress,
                                                   "sequenceStart": seq.start, "sequenceEnd": t}),
                            "message": f"user {ev.userId}: {len(seq.ips)} failed logins from {len(distinct)} IPs "
                                       f"({', '.join(distinct)}) then a success from new IP {ev.ipAddress} "
                                       f"within {(t - seq.start) / 1000:.0f} s"})  # fmt: skip
            del state[k]
    frame = typed(pd.DataFrame(out, columns=list(LOGIN_OUTPUT_COLUMNS)), LOGIN_OUTPUT_SCHEMA)
    return frame, expire(state, windows, watermark), windows


META_SCHEMA = StructType([StructField("timer", LongType())])
BLOB_SCHEMA = StructType([StructField("blob", BinaryType()), StructField("active", BinaryType())])


class LoginProcessor(StatefulProcessor):
    """transformWithState adapter: per shard, open sequences in one value and one coalesced timer."""

    def __init__(self, timer_coalesce_ms: int = 10_000):
        self.coalesce_ms = timer_coalesce_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.blob = handle.getValueState("sequences", BLOB_SCHEMA)
        self.meta = handle.getValueState("meta", META_SCHEMA)

    def _load(self) -> tuple[State, dict[int, int], int]:
        blob, meta = self.blob.get(), self.meta.get()
        windows = _active(bytes(blob[1]).decode()) if blob else {}
        return decode(bytes(blob[0]) if blob else None), windows, (meta[0] if meta else -1)

    def _save(self, state: State, windows: dict[int, int], timer: int) -> None:
        if timer >= 0:
            self.handle.deleteTimer(timer)
        if not state:
            self.blob.clear()
            self.meta.clear()
            return
        wanted = -(-next_expiry(state, windows) // self.coalesce_ms) * self.coalesce_ms
        self.handle.registerTimer(wanted)
        active = ",".join(f"{r}:{w}" for r, w in windows.items()).encode()
        self.blob.update((encode(state), active))
        self.meta.update((wanted,))

    def handleInputRows(self, key, rows: Iterator[pd.DataFrame], timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        batch = pd.concat(list(rows), ignore_index=True)
        state, _windows, timer = self._load()
        out, state, windows = step(batch, state, timerValues.getCurrentWatermarkInMs(), int(key[0]))
        self._save(state, windows, timer)
        if len(out):
            yield out

    def handleExpiredTimer(self, key, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:  # fmt: skip
        state, windows, _timer = self._load()
        self._save(expire(state, windows, timerValues.getCurrentWatermarkInMs()), windows, -1)
        yield pd.DataFrame(columns=list(LOGIN_OUTPUT_COLUMNS))

    def close(self) -> None:
        pass
