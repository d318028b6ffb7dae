"""Drive the engine's per-shard step without Spark: key transactions the way engine/keying.py does."""

from __future__ import annotations

import json
import zlib
from decimal import Decimal

import pandas as pd

from fraudrules.engine.evaluation import KEYED_COLUMNS, Meta, step
from fraudrules.engine.logins import LOGIN_COLUMNS
from fraudrules.engine.windowing import Events
from fraudrules.rules.codec import encode_active_logins, encode_active_windows, encode_spec
from fraudrules.rules.model import COUNT_FIELDS, Rule, parse_rule
from tests.support.reference import passes


def keyed_frame(batch: list[dict], rules: list[Rule], batch_no: int, shards: int = 1) -> pd.DataFrame:
    active = [r for r in rules if r.state == "ACTIVE"]
    active_set = encode_active_windows((r.rule_id, r.sig, r.window_ms) for r in active)
    rows = []
    for pos, tx in enumerate(batch):
        for r in active:
            if not passes(r, tx):
                continue
            key = json.dumps({n: str(tx.get(n)) for n in r.grouping_key_names})
            val = 0 if r.field in COUNT_FIELDS else int(Decimal(str(tx[r.field])) * 10**r.scale)
            uniq = zlib.crc32(json.dumps([str(tx.get(f)) for f in r.unique]).encode()) if r.unique else 0
            rows.append(
                {
                    "shard": zlib.crc32(f"{r.rule_id}|{key}".encode()) % shards,
                    "transactionId": tx["transactionId"],
                    "eventTime": tx["eventTime"],
                    "ingestionTimestamp": tx.get("ingestionTimestamp", -1),
                    "srcTime": batch_no,
                    "srcId": 0,
                    "srcPos": pos,
                    "ruleId": r.rule_id,
                    "sig": r.sig,
                    "spec": encode_spec(r),
                    "key": key,
                    "val": val,
                    "uniq": uniq,
                    "active": active_set,
                    "epoch": 0,
                }
            )
    return pd.DataFrame(rows, columns=list(KEYED_COLUMNS))


def login_event(user: int, kind: str, ip: str, t: int) -> dict:
    """A login event as the detector's source delivers it."""
    return {"userId": user, "eventType": kind, "ipAddress": ip, "eventTimestamp": t}


def seed_attack(user: int = 1) -> list[dict]:
    """Seed 000's scenario: failures from three IPs, then a success from a fourth, within seconds."""
    ips = ("1.1.1.1", "2.2.2.2", "3.3.3.3")
    return [
        *(login_event(user, "FAIL", ip, 1_000 * (i + 1)) for i, ip in enumerate(ips)),
        login_event(user, "SUCCESS", "9.9.9.9", 4_000),
    ]


def login_frame(
    batch: list[dict], batch_no: int, min_failures: int = 3, min_ips: int = 2, window_ms: int = 600_000
) -> pd.DataFrame:
    """Login events keyed the way engine/keying.py keys them for one detector rule (ruleId 1, shard 0)."""
    rows = [
        {
            **e,
            "shard": 0,
            "ingestionTimestamp": -1,
            "srcTime": batch_no,
            "srcId": 0,
            "srcPos": i,
            "ruleId": 1,
            "ruleVersion": 1,
            "minFailures": min_failures,
            "minDistinctIps": min_ips,
            "windowMs": window_ms,
            "active": encode_active_logins({1: window_ms}),
        }
        for i, e in enumerate(batch)
    ]
    return pd.DataFrame(rows, columns=list(LOGIN_COLUMNS))


class Engine:
    """Per-shard state held in memory; each `feed` is one micro-batch with Spark's watermark rule."""

    def __init__(self, lateness_ms: int, shards: int = 1):
        self.lateness_ms, self.shards = lateness_ms, shards
        self.state = {s: (Events.empty(), Meta()) for s in range(shards)}
        self.max_seen: int | None = None
        self.batch_no = 0

    def feed(self, batch: list[dict], rules: list[Rule]) -> pd.DataFrame:
        wm = 0 if self.max_seen is None else max(0, self.max_seen - self.lateness_ms)
        frame = keyed_frame(batch, rules, self.batch_no, self.shards)
        outs = []
        for shard, rows in frame.groupby("shard"):
            state, meta = self.state[int(shard)]
            res = step(rows, state, meta, wm, self.lateness_ms, int(shard), now_ms=0)
            self.state[int(shard)] = (res.state, res.meta)
            outs.append(res.output)
        if batch:
            top = max(tx["eventTime"] for tx in batch)
            self.max_seen = top if self.max_seen is None else max(self.max_seen, top)
        self.batch_no += 1
        return pd.concat(outs, ignore_index=True) if outs else pd.DataFrame()

    def run(self, batches: list[list[dict]], rules_per_batch: list[list[Rule]]):
        outs = [self.feed(b, r) for b, r in zip(batches, rules_per_batch, strict=True)]
        out = pd.concat([o for o in outs if len(o)], ignore_index=True) if any(len(o) for o in outs) else None
        if out is None:
            return {}, set()
        alerts = out[out.kind == "alert"]
        late = out[out.kind == "late"]
        return (
            {(int(r.ruleId), int(r.transactionId)): Decimal(r.aggregate) for r in alerts.itertuples()},
            set(late.transactionId.astype(int)),
        )


def rule(rid, field="paymentAmount", agg="SUM", op="GREATER", limit="0", window=1, keys=("payeeId",), **kw) -> Rule:
    """A window rule from keyword arguments (the demo's JSON field names underneath)."""
    return parse_rule(
        {
            "ruleId": rid,
            "ruleState": kw.pop("state", "ACTIVE"),
            "groupingKeyNames": list(keys),
            "aggregateFieldName": field,
            "aggregatorFunctionType": agg,
            "limitOperatorType": op,
            "limit": limit,
            "windowMinutes": window,
            **kw,
        }
    )
