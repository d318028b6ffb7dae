"""Drive the engine's per-shard steps without Spark: the stateful stages' input rows built as Spark builds them."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from decimal import Decimal

import pandas as pd

from fraudrules.engine.evaluation import Batch, step
from fraudrules.engine.inputs import LOGIN_COLUMNS, LOGIN_FIELDS, login_column
from fraudrules.engine.ruleset import RuleSet
from fraudrules.engine.state import Cache, Chunk, Indexed, Meta, Resets, ShardEvents
from fraudrules.event_schema import DEFAULT, INGESTED, EventSchema, Field, mask_bit, mask_column
from fraudrules.rules import store
from fraudrules.rules.codec import RULE_CHANGE, encode_change, from_row
from fraudrules.rules.model import Rule, parse_rule


class MemoryBackend:
    """A shard's chunk map in memory, as transformWithState's map state would hold it."""

    def __init__(self):
        self.blobs: dict[int, bytes] = {}

    def put_chunk(self, chunk_id: int, blob: bytes) -> None:
        self.blobs[chunk_id] = blob

    def remove_chunk(self, chunk_id: int) -> None:
        del self.blobs[chunk_id]

    def chunks(self) -> Iterator[tuple[int, bytes]]:
        yield from self.blobs.items()


class NoCache(Cache):
    """Every chunk read from the backend: the path of a batch that lands on a fresh worker or machine."""

    def get(self, c: Chunk) -> Indexed | None:
        return None

    def put(self, c: Chunk, ev, blob: bytes) -> Indexed:
        return Indexed(ev)


def value_at(tx: dict, path: str) -> object:
    """A record's value at a dotted path (None where it or a struct on the way is absent)."""
    for name in path.split("."):
        if not isinstance(tx, dict):
            return None
        tx = tx.get(name)
    return tx


def _coded(f: Field, value: object) -> int:
    """A field's value as the engine carries it (see inputs.numeric), written here independently of it."""
    if value is None:
        return -1 if f.path == INGESTED else 0
    if f.values:
        return f.values.index(str(value))
    if f.kind == "boolean":
        return int(value is True or str(value).lower() == "true")
    return int(Decimal(str(value)).scaleb(f.scale))


def tx_rows(batch: list[dict], batch_no: int, schema: EventSchema = DEFAULT) -> pd.DataFrame:
    """Transactions as the stateful stage receives them (the engine columns of `schema`, see inputs.numeric)."""
    rows = []
    for pos, tx in enumerate(batch):
        row: dict = {"srcTime": batch_no, "srcId": 0, "srcPos": pos, **dict.fromkeys(schema.mask_columns, 0)}
        for f in schema.fields.values():
            value = value_at(tx, f.path)
            row[f.column] = _coded(f, value) if f.coded else (None if value is None else str(value))
            if value is None and f.null_bit >= 0:
                row[mask_column(f.null_bit)] |= mask_bit(f.null_bit)
        rows.append(row)
    columns = schema.engine_columns()
    frame = pd.DataFrame(rows, columns=list(columns))
    frame = frame.astype({c: "int64" for c, kind in columns.items() if kind == "long"})
    return frame.assign(**{RULE_CHANGE: None})


class RuleStream:
    """The rules' change history as the running job streams it: versions, window signatures, epochs."""

    def __init__(self):
        self.rows: dict[int, dict] = {}
        self.epoch = 0

    def changes(self, rules: list[Rule], event_columns: dict[str, str] | tuple[str, ...] | None = None) -> pd.DataFrame:
        """Rule-change rows for the rules that differ from those in force (a rule absent from `rules` stays);
        their event columns (default: the default schema's) zero, or null for text."""
        changed = [r for r in rules if r.rule_id not in self.rows or _differs(self.rows[r.rule_id], r)]
        p = store.plan(self.rows, self.epoch, changed, datetime.now(timezone.utc), "test", None)
        self.rows, self.epoch = p.rows, p.epoch
        kinds = DEFAULT.engine_columns() if event_columns is None else event_columns
        kinds = kinds if isinstance(kinds, dict) else dict.fromkeys(kinds, "long")
        empty = {c: None if kind == "string" else 0 for c, kind in kinds.items()}
        return pd.DataFrame({RULE_CHANGE: [encode_change(r) for r in p.log], **empty})


def _differs(row: dict, rule: Rule) -> bool:
    return from_row(row).with_version(0) != rule.with_version(0)


class Shard:
    def __init__(self, index: int, cache_root: str, cached: bool, schema: EventSchema = DEFAULT):
        self.index, self.rules = index, RuleSet(schema=schema)
        self.meta, self.resets, self.backend = Meta(), Resets.empty(), MemoryBackend()
        self.cache = (Cache if cached else NoCache)("test", index, root=cache_root)


class Engine:
    """Per-shard state held in memory; each `feed` is one micro-batch with Spark's watermark rule."""

    def __init__(self, lateness_ms: int, shards: int = 1, cached: bool = True, schema: EventSchema = DEFAULT):
        self.lateness_ms, self.shards, self.schema = lateness_ms, shards, schema
        root = tempfile.mkdtemp(prefix="fraudrules-test-cache-")
        self.state = [Shard(i, root, cached, schema) for i in range(shards)]
        self.stream = RuleStream()
        self.max_seen: int | None = None
        self.batch_no = 0
        self.outputs: list[pd.DataFrame] = []

    def feed(self, batch: list[dict], rules: list[Rule]) -> pd.DataFrame:
        wm = 0 if self.max_seen is None else max(0, self.max_seen - self.lateness_ms)
        changes = self.stream.changes(rules, self.schema.engine_columns())
        rows = pd.concat([tx_rows(batch, self.batch_no, self.schema), changes], ignore_index=True)
        outs = []
        for s in self.state:
            store_ = ShardEvents(s.meta, s.resets, s.backend, s.cache)
            res = step(
                Batch.of(rows),
                s.rules,
                store_,
                wm,
                self.lateness_ms,
                s.index,
                self.shards,
                now_ms=0,
                schema=self.schema,
            )
            s.meta, s.resets = store_.meta, store_.resets
            outs.append(res.output)
        if batch:
            top = max(tx["eventTime"] for tx in batch)
            self.max_seen = top if self.max_seen is None else max(self.max_seen, top)
        self.batch_no += 1
        out = pd.concat(outs, ignore_index=True)
        self.outputs.append(out)
        return out

    def run(self, batches: list[list[dict]], rules_per_batch: list[list[Rule]]):
        out = pd.concat([self.feed(b, r) for b, r in zip(batches, rules_per_batch, strict=True)], ignore_index=True)
        alerts = out[out.kind == "alert"]
        late = out[out.kind == "late"]
        return (
            {(int(r.ruleId), int(r.transactionId)): Decimal(r.aggregate) for r in alerts.itertuples()},
            set(late.transactionId.astype(int)),
        )

    def hits(self, kind: str = "alert") -> dict[tuple[int, int], Decimal]:
        """{(ruleId, transactionId): aggregate} of every batch fed so far: alerts, or "shadow" hits."""
        out = pd.concat(self.outputs, ignore_index=True) if self.outputs else pd.DataFrame(columns=["kind"])
        rows = out[out.kind == kind]
        return {(int(r.ruleId), int(r.transactionId)): Decimal(r.aggregate) for r in rows.itertuples()}


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


def login_rule(min_failures: int = 3, min_ips: int = 2, window_ms: int = 600_000, rule_id: int = 1) -> Rule:
    return parse_rule(
        {
            "ruleId": rule_id,
            "ruleState": "ACTIVE",
            "ruleType": "LOGIN_ANOMALY",
            "minFailures": min_failures,
            "minDistinctIps": min_ips,
            "windowMinutes": window_ms // 60_000,
        }
    )


LOGIN_EVENT_COLUMNS = (*LOGIN_FIELDS, "srcTime", "srcId", "srcPos")  # what the login step reads


def login_frame(batch: list[dict], batch_no: int, ingested: int = -1) -> pd.DataFrame:
    """Login events as the login step reads them (for one shard)."""
    rows = [
        {**e, "ingestionTimestamp": ingested, "srcTime": batch_no, "srcId": 0, "srcPos": i} for i, e in enumerate(batch)
    ]
    return pd.DataFrame(rows, columns=list(LOGIN_EVENT_COLUMNS)).assign(**{RULE_CHANGE: None})


def detector_frame(*parts: pd.DataFrame, schema: EventSchema = DEFAULT) -> pd.DataFrame:
    """Transactions (`tx_rows`), login events (`login_frame`) and rule changes (`RuleStream.changes` with
    `detector_columns`) as the evaluate query's processor receives them with login detection on: every column of
    both kinds, those of the other kind 0 or null."""
    columns = detector_columns(schema)
    logins = {n: login_column(n) for n in LOGIN_FIELDS}
    renamed = [p.rename(columns=logins) if "eventType" in p else p for p in parts]
    # each part given the columns it lacks first: pandas would align them as floats (inexact 64-bit ids)
    absent = [{n: 0 if kind == "long" else None for n, kind in columns.items() if n not in p} for p in renamed]
    frame = pd.concat([p.assign(**a) for p, a in zip(renamed, absent, strict=True)], ignore_index=True)
    for name, kind in columns.items():
        frame[name] = frame[name].fillna(0).astype("int64") if kind == "long" else frame[name]
    return frame[[*columns, RULE_CHANGE]]


def detector_columns(schema: EventSchema = DEFAULT) -> dict[str, str]:
    return {**schema.engine_columns(), **LOGIN_COLUMNS}


def rule(rid, field="paymentAmount", agg="SUM", op="GREATER", limit="0", window=1, keys=("payeeId",), **kw) -> Rule:
    """A window rule from keyword arguments (the demo's JSON field names underneath; `schema`: the event schema
    it is validated against, default the default one)."""
    schema = kw.pop("schema", DEFAULT)
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
        },
        schema,
    )
