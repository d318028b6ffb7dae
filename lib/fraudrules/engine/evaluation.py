"""One shard's micro-batch: late events out, arrival order in, windows evaluated, state retained.

Pure pandas/numpy; the transformWithState processor (`processors.py`) only moves state in and out.
Input rows are keyed transactions (one row per transaction × ACTIVE rule, from `keying.py`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fraudrules.engine.windowing import Events, Retention, evaluate, retain
from fraudrules.rules.codec import decode_active_windows, decode_spec
from fraudrules.rules.model import Rule

# Columns the keyed stream carries into the stateful stage, in order. Kept narrow on purpose: every
# byte per row is shuffled, sorted and shipped to Python.
KEYED_COLUMNS = (
    "shard",
    "transactionId",
    "eventTime",
    "ingestionTimestamp",
    "srcTime",
    "srcId",
    "srcPos",
    "ruleId",
    "sig",
    "spec",
    "key",
    "val",
    "uniq",
    "active",
    "epoch",
)
OUTPUT_SCHEMA = (
    "kind string, shard int, ruleId long, ruleVersion long, transactionId long, eventTime long, "
    "ingestionTimestamp long, key string, aggregate string, watermark long, producedAt long, reason string"
)
OUTPUT_COLUMNS = tuple(part.strip().split(" ")[0] for part in OUTPUT_SCHEMA.split(","))


def typed(frame: pd.DataFrame, schema: str) -> pd.DataFrame:
    """Output rows with one clean dtype per column (nullable integers, strings with None), in schema order.

    Rows of different kinds leave different columns empty; mixed object columns would not convert to Arrow.
    """
    out = {}
    for part in schema.split(","):
        name, kind = part.split()
        col = frame[name] if name in frame else pd.Series([None] * len(frame), index=frame.index)
        if kind in ("long", "int"):
            out[name] = pd.array(pd.to_numeric(col, errors="coerce"), dtype="Int64" if kind == "long" else "Int32")
        else:
            out[name] = col.astype(object).where(col.notna(), None)
    return pd.DataFrame(out)


LATE_REASON = "eventTime behind the watermark on arrival"


@dataclass
class Meta:
    """Per-shard bookkeeping kept beside the retained events."""

    next_seq: int = 0
    epoch: int = 0
    active: str = ""  # last seen ACTIVE rules as "ruleId:sig:windowMs,..."
    timer: int = -1  # registered cleanup timer (event time ms), -1 = none

    def active_rules(self) -> dict[int, tuple[int, int]]:
        """{ruleId: (sig, windowMs)} of the rules ACTIVE at the last batch this shard saw."""
        return decode_active_windows(self.active)


@dataclass
class StepResult:
    output: pd.DataFrame
    state: Events
    meta: Meta
    next_expiry: int  # event time at which the oldest retained group can be dropped, -1 if none


def rules_of(rows: pd.DataFrame) -> dict[int, Rule]:
    pairs = rows.drop_duplicates("ruleId")[["ruleId", "spec"]].itertuples(index=False)
    return {int(rid): decode_spec(int(rid), spec) for rid, spec in pairs}


def retention(active: dict[int, tuple[int, int]], horizon: int) -> Retention:
    """Per ACTIVE rule: its signature and the event time below which its events are never needed again.

    `horizon` is a lower bound of every future watermark; a non-late event at T ≥ horizon looks back
    to T − W ≥ horizon − W at most.
    """
    return {rid: (sig, horizon - window) for rid, (sig, window) in active.items()}


def next_expiry(state: Events, active: dict[int, tuple[int, int]]) -> int:
    """Smallest watermark at which some group's newest event has left its rule's window."""
    if len(state) == 0:
        return -1
    frame = pd.DataFrame({"rule": state.rule, "t": state.t})
    newest = frame.groupby("rule")["t"].max()
    ends = [int(t) + active.get(int(r), (0, 0))[1] + 1 for r, t in newest.items()]
    return min(ends)


def step(
    batch: pd.DataFrame,
    state: Events,
    meta: Meta,
    watermark: int,
    lateness_ms: int,
    shard: int,
    now_ms: int | None = None,
) -> StepResult:
    """Process one shard's rows of one micro-batch."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    batch = batch.sort_values(["eventTime", "srcTime", "srcId", "srcPos", "ruleId"], kind="stable")
    batch = batch.reset_index(drop=True)
    epoch = int(batch["epoch"].iloc[0])
    if epoch > meta.epoch:  # CLEAR_STATE_ALL issued since this shard last ran
        state, meta = Events.empty(), Meta(next_seq=meta.next_seq, epoch=epoch, timer=meta.timer)
    meta.active = str(batch["active"].iloc[0])
    active = meta.active_rules()

    rules = rules_of(batch)
    batch["ruleVersion"] = batch["ruleId"].map({rid: rule.version for rid, rule in rules.items()})
    late = batch["eventTime"].to_numpy(np.int64) < watermark if watermark > 0 else np.zeros(len(batch), bool)
    live = batch[~late].reset_index(drop=True)
    n = len(live)
    new = Events(
        rule=live["ruleId"].to_numpy(np.int64),
        sig=live["sig"].to_numpy(np.int64),
        key=live["key"].to_numpy(object),
        t=live["eventTime"].to_numpy(np.int64),
        seq=meta.next_seq + np.arange(n, dtype=np.int64),
        val=live["val"].to_numpy(np.int64),
        uniq=live["uniq"].to_numpy(np.int64),
    )
    meta.next_seq += n

    horizon = max(watermark, int(batch["eventTime"].max()) - lateness_ms)
    result = evaluate(state, new, rules, retention(active, horizon))

    common = {"shard": shard, "watermark": watermark, "producedAt": now_ms}
    fired = live.iloc[result.fired.index]
    alerts = _event_rows(fired, kind="alert", aggregate=[str(a) for a in result.fired.aggregates()], **common)
    lates = _event_rows(batch[late], kind="late", reason=LATE_REASON, **common)
    # one row per rule version evaluated here: its event count (aggregate) and time, for the rule-apply delay
    seen = live.groupby(["ruleId", "ruleVersion"]).size().reset_index(name="n")
    applied = pd.DataFrame(
        {
            "kind": "rule",
            "shard": shard,
            "ruleId": seen["ruleId"].to_numpy(np.int64),
            "ruleVersion": seen["ruleVersion"].to_numpy(np.int64),
            "transactionId": None,
            "eventTime": None,
            "ingestionTimestamp": None,
            "key": None,
            "aggregate": seen["n"].astype(str).to_numpy(object),
            "watermark": watermark,
            "producedAt": now_ms,
            "reason": None,
        }
    )
    output = typed(pd.concat([alerts, lates, applied], ignore_index=True), OUTPUT_SCHEMA)
    return StepResult(output, result.state, meta, next_expiry(result.state, active))


def _event_rows(rows: pd.DataFrame, **values: object) -> pd.DataFrame:
    """Output rows about keyed events (alerts, late events): their identity plus the given columns."""
    return rows[["ruleId", "ruleVersion", "transactionId", "eventTime", "ingestionTimestamp", "key"]].assign(**values)


def expire(state: Events, meta: Meta, watermark: int) -> tuple[Events, int]:
    """Timer path: drop what the watermark has passed, using the rules last seen by this shard."""
    active = meta.active_rules()
    kept = state.take(retain(state, retention(active, watermark)))
    return kept, next_expiry(kept, active)
