"""The crash demo's rules from change data capture (`make crash-demo ARGS="--rules-from cdc"`).

While the job is killed and restarted, an admin edits a rule with SQL: `tools/rules_db.py`'s steps (the rule
inserted, its limit updated, the rule disabled, then deleted), one as each run starts (its queries take the changes
there are at their start: `--available-now`), the ones left before the last run. With files as the source the
rules are rows of a Delta table the job follows through its change feed (`--rules-table`); with Kafka they are rows
of a real PostgreSQL table whose changes a real Debezium publishes to the job's rules topic (`--rules-format
debezium`). Either way the job writes each applied change to `rule_history`, and its evaluation reads that table as
a third source: the evaluation's offset log says which changes each micro-batch applied, before its events.
`segments` reads it back; the backtest then applies the same changes at the same positions of the input.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from fraudrules.compat import spark_checkpoint
from fraudrules.engine.lines import Position, open_fs

RULE_SOURCE = -1  # the evaluation's sources: transactions, logins, then rule_history


@dataclass
class Segment:
    """Input from these positions on (records of the transactions and logins inputs), after these changes, which the
    job applied at this micro-batch of its evaluation."""

    batch: int
    transactions: int
    logins: int
    changes: list[dict] = field(default_factory=list)  # rule_history rows, in the order they were applied


class AdminEdits:
    """The SQL steps `(what, sql, params)`, run by `execute(sql, params)` as the job is down between two runs: one
    before each run that will be killed, the ones left before the last run. `done` counts the steps run."""

    def __init__(
        self, steps: list[tuple[str, str, object]], execute: Callable[[str, object], object], say: Callable[[str], None]
    ) -> None:
        self.pending, self.execute, self.say = list(steps), execute, say
        self.done = 0

    def before_run(self, last: bool) -> None:
        for _ in range(len(self.pending) if last else min(1, len(self.pending))):
            what, sql, params = self.pending.pop(0)
            self.execute(sql, params)
            self.done += 1
            self.say(f"  admin: {what}")


def segments(spark, checkpoint: str, rule_history: str, per_file: int) -> list[Segment]:
    """Where the evaluation applied rule changes: for each micro-batch that read new `rule_history` rows, the
    records of each input read before it (file sources of `per_file` lines, or one Kafka partition each) and those
    rows. The first segment starts at 0 with the rules applied at the first batch."""
    fs, root = open_fs(checkpoint)
    out: list[Segment] = []
    seen: set[tuple[int, int]] = set()
    start = [0, 0]
    read: dict[int, list[dict]] = {}  # most batches read no new version: one Delta read per version
    for batch in sorted(spark_checkpoint.logged_batches(fs, root, "offsets")):
        offsets = spark_checkpoint.planned(fs, root, batch)[1]
        version = spark_checkpoint.delta_read_through(offsets[RULE_SOURCE])
        if version not in read:
            read[version] = _rows_through(spark, rule_history, version)
        new = [r for r in read[version] if (r["ruleId"], r["version"]) not in seen]
        if new or not out:
            out.append(Segment(batch, start[0], start[1], new))
            seen.update((r["ruleId"], r["version"]) for r in new)
        start = [_records(o, per_file) for o in offsets[:2]]
    return out


def _rows_through(spark, table: str, version: int) -> list[dict]:
    """`rule_history` (append-only) as of a version, each rule's versions in order."""
    if version < 0:
        return []
    frame = spark.read.format("delta").option("versionAsOf", version).load(table)
    return [r.asDict() for r in frame.orderBy("ruleId", "version").collect()]


def _records(offset: str, per_file: int) -> int:
    """The records an end offset has read: a lines source's (file, line) or one Kafka partition's offset."""
    value = json.loads(offset)
    if set(value) == {"file", "byte", "line"}:
        position = Position.of(value)
        return position.file * per_file + position.line
    (partitions,) = value.values()  # {"topic": {"0": n}}
    (n,) = partitions.values()
    return int(n)


def applied_once(
    spark, tables: Callable[[str], str], rule_id: int, edits: int, found: list[Segment]
) -> tuple[str, bool]:
    """A line on the edited rule: one `rule_history` version per SQL edit, none twice, the evaluation batch that
    applied each, and its alerts. `tables` gives a table's path."""
    rows = spark.read.format("delta").load(tables("rule_history")).where(f"ruleId = {rule_id}").collect()
    versions = sorted((r.version, r.ruleState) for r in rows)
    alerts = spark.read.format("delta").load(tables("alerts")).where(f"ruleId = {rule_id}").groupBy("ruleVersion")
    per_version = {r.ruleVersion: r["count"] for r in alerts.count().collect()}
    at = {(r["ruleId"], r["version"]): s.batch for s in found for r in s.changes}
    ok = len(versions) == len(set(versions)) == edits and all((rule_id, v) in at for v, _ in versions)
    applied = ", ".join(
        f"v{v} {state} at batch {at.get((rule_id, v), '?')}: {per_version.get(v, 0)} alerts" for v, state in versions
    )
    line = f"rule {rule_id}: {edits} SQL edits by the admin, {len(versions)} versions in rule_history ({applied})"
    return line + ("" if ok else "  <-- MISMATCH"), ok
