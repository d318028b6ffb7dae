"""Login anomaly detection (seed 000): failures from several IPs, then a success from a new IP.

Per user, events in eventTimestamp order (ties in source order). A sequence opens at a FAIL when none
is open and stays open for events with time ≤ start + W. A FAIL inside it joins it, a FAIL after it
starts a new one. A SUCCESS inside it alerts iff the sequence holds ≥ minFailures failures from
≥ minDistinctIps distinct IPs and the success's IP is not one of them; the sequence closes either way.
An expired sequence (start + W behind the watermark) is dropped; that never changes a result.

This module is the pure per-shard step; the transformWithState adapter is `processors.LoginDetector`.
The detector rules a shard holds come with the events, as rule changes (see `ruleset`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa

from fraudrules.engine.evaluation import LATE_REASON, OUTPUT_COLUMNS, Batch, alert_kind, typed
from fraudrules.engine.ruleset import RuleSet
from fraudrules.rules.model import LOGIN_RULE, Rule
from fraudrules.rules.text import duration_text


@dataclass
class Sequence:
    start: int
    ips: list[str] = field(default_factory=list)  # one entry per failure, in arrival order


State = dict[tuple[int, int], Sequence]  # (ruleId, userId) -> open sequence


def encode_sequences(state: State) -> bytes:
    """A shard's open sequences as one Arrow IPC file (the login processor's state value)."""
    table = pa.table(
        {
            "rule": pa.array([k[0] for k in state], type=pa.int64()),
            "user": pa.array([k[1] for k in state], type=pa.int64()),
            "start": pa.array([s.start for s in state.values()], type=pa.int64()),
            "ips": pa.array([s.ips for s in state.values()], type=pa.list_(pa.string())),
        }
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_sequences(blob: bytes | None) -> State:
    if not blob:
        return {}
    t = pa.ipc.open_file(pa.py_buffer(blob)).read_all().to_pydict()
    rows = zip(t["rule"], t["user"], t["start"], t["ips"], strict=True)
    return {(int(r), int(u)): Sequence(int(s), list(ips)) for r, u, s, ips in rows}


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
        f"then a success from new IP {ip} within {duration_text(t - seq.start)}"
    )
    return {"kind": "alert", "aggregate": str(len(seq.ips)), "details": json.dumps(details), "message": message}


def windows_of(rules: RuleSet) -> dict[int, int]:
    """ruleId -> window ms of the ACTIVE detector rules."""
    return {r.rule_id: r.window_ms for r in rules.active(LOGIN_RULE)}


def expire(state: State, windows: dict[int, int], watermark: int) -> State:
    """Drop sequences whose window the watermark has passed, and those of rules no longer ACTIVE."""
    return {k: s for k, s in state.items() if k[0] in windows and s.start + windows[k[0]] >= watermark}


def step(
    batch: Batch,
    rules: RuleSet,
    state: State,
    watermark: int,
    shard: int,
    now_ms: int | None = None,
    expire_at: int | None = None,
) -> tuple[pd.DataFrame, State]:
    """One shard's login events of one micro-batch: (output rows, next state). The next state keeps the sequences
    an event at or after `expire_at` (default: this batch's watermark; the caller passes the next batch's) can join."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    epoch = rules.epoch
    rules.apply(batch.rule_changes)
    if rules.epoch > epoch:  # CLEAR_STATE_ALL
        state = {}
    active: list[Rule] = rules.active(LOGIN_RULE)
    windows = windows_of(rules)
    state = {k: s for k, s in state.items() if k[0] in windows}
    events = batch.events.sort_values(["eventTimestamp", "srcTime", "srcId", "srcPos"], kind="stable")
    out: list[dict] = []
    seen = dict.fromkeys(windows, 0)
    for ev in events.itertuples(index=False):
        t, user = int(ev.eventTimestamp), int(ev.userId)
        base = {
            "userId": user,
            "eventTime": t,
            "ingestionTimestamp": ev.ingestionTimestamp,
            "key": f'{{"userId":"{user}"}}',
        }
        for rule in active:
            row = {**base, "ruleId": rule.rule_id, "ruleVersion": rule.version}
            if watermark > 0 and t < watermark:
                out.append({**row, "kind": "late", "reason": LATE_REASON})
                continue
            seen[rule.rule_id] += 1
            k = (rule.rule_id, user)
            seq = state.get(k)
            is_open = seq is not None and t <= seq.start + rule.window_ms
            if ev.eventType == "FAIL":
                if is_open:
                    seq.ips.append(ev.ipAddress)
                else:
                    state[k] = Sequence(t, [ev.ipAddress])
            elif is_open:  # SUCCESS inside an open sequence: decide, then close it
                distinct = sorted(set(seq.ips))
                new_ip = ev.ipAddress not in distinct
                if len(seq.ips) >= rule.min_failures and len(distinct) >= rule.min_distinct_ips and new_ip:
                    alert = _alert(seq, distinct, user, ev.ipAddress, t)
                    out.append({**row, **alert, "kind": alert_kind(rule), "rule": json.dumps(rule.to_json())})
                del state[k]
    versions = {r.rule_id: r.version for r in active}
    out += [
        {"kind": "rule", "ruleId": r, "ruleVersion": versions[r], "aggregate": str(n)} for r, n in seen.items() if n
    ]
    # as objects: a column that some rows lack would otherwise become floats (inexact above 2**53: 64-bit user ids)
    frame = pd.DataFrame(out, columns=list(OUTPUT_COLUMNS), dtype=object)
    frame = frame.assign(shard=shard, watermark=watermark, producedAt=now_ms)
    return typed(frame), expire(state, windows, watermark if expire_at is None else expire_at)
