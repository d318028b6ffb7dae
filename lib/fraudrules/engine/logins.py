"""Login anomaly detection (seed 000): failures from several IPs, then a success from a new IP.

Per user, events in eventTimestamp order (ties in source order). A sequence opens at a FAIL when none
is open and stays open for events with time ≤ start + W. A FAIL inside it joins it, a FAIL after it
starts a new one. A SUCCESS inside it alerts iff the sequence holds ≥ minFailures failures from
≥ minDistinctIps distinct IPs and the success's IP is not one of them; the sequence closes either way.
An expired sequence (start + W behind the watermark) is dropped; that never changes a result.

This module is the pure per-shard step; the transformWithState adapter is `processors.LoginProcessor`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import pandas as pd

from fraudrules.engine.evaluation import LATE_REASON, typed
from fraudrules.rules.codec import decode_active_logins

LOGIN_COLUMNS = (
    "shard",
    "userId",
    "eventType",
    "ipAddress",
    "eventTimestamp",
    "ingestionTimestamp",
    "srcTime",
    "srcId",
    "srcPos",
    "ruleId",
    "ruleVersion",
    "minFailures",
    "minDistinctIps",
    "windowMs",
    "active",
)
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


def _alert(seq: Sequence, distinct: list[str], user: int, ip: str, t: int) -> dict:
    """The alert columns of a success from new IP `ip` at `t` closing `seq` (failed from `distinct` IPs)."""
    details = {
        "failures": len(seq.ips),
        "distinctIps": len(distinct),
        "failedIps": distinct,
        "successIp": ip,
        "sequenceStart": seq.start,
        "sequenceEnd": t,
    }
    message = (
        f"user {user}: {len(seq.ips)} failed logins from {len(distinct)} IPs ({', '.join(distinct)}) "
        f"then a success from new IP {ip} within {(t - seq.start) / 1000:.0f} s"
    )
    return {"kind": "alert", "aggregate": str(len(seq.ips)), "details": json.dumps(details), "message": message}


def expire(state: State, windows: dict[int, int], watermark: int) -> State:
    """Drop sequences whose window the watermark has passed, and those of rules no longer ACTIVE."""
    return {k: s for k, s in state.items() if k[0] in windows and s.start + windows[k[0]] >= watermark}


def next_expiry(state: State, windows: dict[int, int]) -> int:
    return min((s.start + windows[k[0]] + 1 for k, s in state.items()), default=-1)


def step(
    batch: pd.DataFrame, state: State, watermark: int, shard: int, now_ms: int | None = None
) -> tuple[pd.DataFrame, State, dict[int, int]]:
    """One shard's login events of one micro-batch: (output rows, next state, active windows)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    batch = batch.sort_values(["eventTimestamp", "srcTime", "srcId", "srcPos", "ruleId"], kind="stable")
    windows = decode_active_logins(str(batch["active"].iloc[0]))
    state = {k: s for k, s in state.items() if k[0] in windows}
    out: list[dict] = []
    for ev in batch.itertuples(index=False):
        base = {
            "shard": shard,
            "ruleId": ev.ruleId,
            "ruleVersion": ev.ruleVersion,
            "userId": ev.userId,
            "eventTime": ev.eventTimestamp,
            "ingestionTimestamp": ev.ingestionTimestamp,
            "key": f'{{"userId":"{ev.userId}"}}',
            "watermark": watermark,
            "producedAt": now_ms,
        }
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
                out.append({**base, **_alert(seq, distinct, ev.userId, ev.ipAddress, t)})
            del state[k]
    frame = typed(pd.DataFrame(out, columns=list(LOGIN_OUTPUT_COLUMNS)), LOGIN_OUTPUT_SCHEMA)
    return frame, expire(state, windows, watermark), windows
