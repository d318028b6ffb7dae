"""The rules query's foreachBatch sink: each change set merged into the rules table; invalid rules go to
`rule_errors` (appended exactly once per micro-batch with Delta's transaction), valid ones still apply.

A message is a change set of our own rule JSON (`rules_format="fraudrules"`) or one Debezium change event of a
database's rules table (`"debezium"`, `rules/cdc.py`): each event one `store.apply`, in log order, an event not
after its rule's last applied position a no-op."""

from __future__ import annotations

import os
from collections import Counter
from datetime import datetime, timezone

from pyspark.sql import DataFrame, Row, SparkSession

from fraudrules import event_schema, tables
from fraudrules.config import RULES_QUERY, JobConfig
from fraudrules.engine import progress
from fraudrules.engine.progress import Printer
from fraudrules.rules import cdc, store
from fraudrules.rules.codec import from_row
from fraudrules.rules.model import RuleError, parse_rules_text


class RuleChangeSink:
    """Merges each change set into the rules table; invalid rules go to rule_errors, valid ones still apply."""

    def __init__(self, cfg: JobConfig, printer: Printer | None = progress.say):
        self.cfg, self.printer = cfg, printer
        self.schema = event_schema.for_job(cfg)  # rules naming fields it does not declare go to rule_errors
        self.mapping = cdc.ColumnMapping(cfg.rules_columns)

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        spark = df.sparkSession
        # a few rows (one per change set): sorted here, not by a Spark sort (a sampling job and a shuffle)
        rows = sorted(df.collect(), key=lambda r: (r.modified, r.source))
        if self.cfg.rules_format == "debezium":
            errors = self._debezium(spark, rows)
        else:
            errors = [e for row in rows for e in self._change_set(spark, row, batch_id)]
        if errors:
            received = datetime.now(timezone.utc)
            records = [{**e, "receivedAt": received} for e in errors]
            txn = tables.Txn.of(self.cfg, RULES_QUERY, batch_id)
            tables.writer(spark, self.cfg).append("rule_errors", records, txn)

    def _change_set(self, spark: SparkSession, row: Row, batch_id: int) -> list[dict]:
        """One message of rule JSON (a rule or a list): the valid rules applied together; the invalid ones' errors."""
        changes, problems = parse_rules_text(row.value, self.schema)
        applied = store.apply(
            spark,
            self.cfg,
            changes,
            author=f"stream:{os.path.basename(row.source)}",
            change_id=f"{RULES_QUERY}:{batch_id}:{row.source}",
        )
        self._say(f"{os.path.basename(row.source)}: {len(applied)} rules changed, {len(problems)} rejected")
        return [_error(row, e) for e in problems]

    def _debezium(self, spark: SparkSession, rows: list[Row]) -> list[dict]:
        """Debezium change events in order, each applied on its own; the rejected ones' errors."""
        history = store.history_rows(spark, self.cfg)
        current, positions = store.latest(history), cdc.applied_positions(history)
        counts: Counter[str] = Counter()
        errors = []
        for row in rows:
            try:
                change = cdc.decode(row.value, row.source, self.mapping)
                if change is None:  # a tombstone: the delete before it did the work
                    continue
                if not change.position.after(positions.get(change.rule_id)):
                    counts["already applied"] += 1
                    continue
                stored = current.get(change.rule_id)
                rule = cdc.to_rule(change, self.mapping, self.schema, stored and from_row(stored, self.schema))
                applied = store.apply(
                    spark, self.cfg, [rule], author=f"debezium:{row.source}", change_id=change.change_id
                )
            except RuleError as err:
                errors.append(_error(row, err))
                continue
            current.update((r["ruleId"], r) for r in applied)
            positions[change.rule_id] = change.position
            counts["applied"] += 1
        if counts or errors:
            what = ", ".join(f"{n} {k}" for k, n in counts.items())
            self._say(f"Debezium events: {what + ', ' if what else ''}{len(errors)} rejected")
        return errors

    def _say(self, text: str) -> None:
        if self.printer:
            self.printer(f"[rules] {text}")


def _error(row: Row, err: RuleError) -> dict:
    """A rule_errors row: the rule (when known), the message, the reason and where the message came from."""
    rule_id = None if err.rule_id is None else str(err.rule_id)
    return {"ruleId": rule_id, "raw": row.value, "reason": "; ".join(err.problems), "source": row.source}
