"""The rules query's foreachBatch sink: each change set merged into the rules table; invalid rules go to
`rule_errors` (appended exactly once per micro-batch with Delta's transaction), valid ones still apply.

A message is a change set of our own rule JSON (`rules_format="fraudrules"`) or one Debezium change event of a
database's rules table (`"debezium"`, `rules/cdc.py`); with a `rules_table`, a row is one change of the table's
change feed. Each row change is one `store.apply`, in log order, a change not after its rule's last applied
position a no-op."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone

from pyspark.sql import DataFrame, Row, SparkSession

from fraudrules import event_schema, tables
from fraudrules.config import RULES_QUERY, JobConfig
from fraudrules.engine import progress
from fraudrules.engine.progress import Printer
from fraudrules.rules import cdc, store
from fraudrules.rules import table as rules_table
from fraudrules.rules.codec import from_row
from fraudrules.rules.model import Rule, RuleError, parse_rules_text


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
        if self.cfg.rules_table:
            errors = self._table(spark, rows)
        elif self.cfg.rules_format == "debezium":
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

        def decoded(row: Row) -> tuple[cdc.Change | None, str]:
            return cdc.decode(row.value, row.source, self.mapping), f"debezium:{row.source}"

        return self._row_changes(spark, rows, decoded, "Debezium events")

    def _table(self, spark: SparkSession, rows: list[Row]) -> list[dict]:
        """The rules table's row changes in version order, each applied on its own, its author the commit's
        (operation, and user where the commit records one); the rejected ones' errors. A rule id on two rows of
        one commit is an error for both: which one the admin meant is unknowable."""
        rows = sorted(rows, key=lambda r: r.source)  # "<table>@<zero-padded version>"
        changes = {id(row): _table_change(row.value, self.mapping) for row in rows}
        ids = Counter((c.rule_id, c.position.major) for c in changes.values() if isinstance(c, cdc.Change))
        commits = rules_table.commit_notes(spark, str(self.cfg.rules_table), {v for _, v in ids})

        def decoded(row: Row) -> tuple[cdc.Change | None, str]:
            change = changes[id(row)]
            if isinstance(change, RuleError):
                raise change
            if ids[(change.rule_id, change.position.major)] > 1:
                raise RuleError(change.rule_id, [f"rule id {change.rule_id} is on more than one row of {row.source}"])
            version = change.position.major
            return change, f"{commits.get(version, 'a commit')} ({self.cfg.rules_table} v{version})"

        return self._row_changes(spark, rows, decoded, "rules table changes")

    def _row_changes(
        self, spark: SparkSession, rows: list[Row], decoded: Callable[[Row], tuple[cdc.Change | None, str]], what: str
    ) -> list[dict]:
        """Row changes in order, applied unless their rule has seen their position (a redelivery, a replayed
        micro-batch); `decoded` gives a row's change (None: nothing to do) and its author. The changes of one
        commit of a rules table are one change set (one rule_history commit: the job applies them at one batch
        boundary, e.g. both halves of a promotion); each Debezium event is its own. The rejected rows' errors."""
        history = store.history_rows(spark, self.cfg)
        current, positions = store.latest(history), cdc.applied_positions(history)
        counts: Counter[str] = Counter()
        errors: list[dict] = []
        pending: list[tuple[Row, cdc.Change, Rule, str]] = []

        def flush() -> None:
            if not pending:
                return
            change_id = cdc.change_set_id([c for _, c, _, _ in pending])
            rules = [r for _, _, r, _ in pending]
            try:
                applied = store.apply(spark, self.cfg, rules, pending[0][3], change_id, promotion(rules, current))
            except RuleError as err:
                errors.extend(_error(row, err) for row, _, _, _ in pending)
            else:
                current.update((r["ruleId"], r) for r in applied)
                positions.update((c.rule_id, c.position) for _, c, _, _ in pending)
                counts["applied"] += len(pending)
            pending.clear()

        for row in rows:
            try:
                change, author = decoded(row)
                if change is None:  # a tombstone: the delete before it did the work
                    continue
                if not change.position.after(positions.get(change.rule_id)):
                    counts["already applied"] += 1
                    continue
                stored = current.get(change.rule_id)
                rule = cdc.to_rule(change, self.mapping, self.schema, stored and from_row(stored, self.schema))
            except RuleError as err:
                errors.append(_error(row, err))
                continue
            if pending and not (change.origin == cdc.DELTA and pending[-1][1].position == change.position):
                flush()
            pending.append((row, change, rule, author))
            if change.origin != cdc.DELTA:
                flush()
        flush()
        if counts or errors:
            done = ", ".join(f"{n} {k}" for k, n in counts.items())
            self._say(f"{what}: {done + ', ' if done else ''}{len(errors)} rejected")
        return errors

    def _say(self, text: str) -> None:
        if self.printer:
            self.printer(f"[rules] {text}")


def _error(row: Row, err: RuleError) -> dict:
    """A rule_errors row: the rule (when known), the message, the reason and where the message came from."""
    rule_id = None if err.rule_id is None else str(err.rule_id)
    return {"ruleId": rule_id, "raw": row.value, "reason": "; ".join(err.problems), "source": row.source}


def promotion(rules: list[Rule], current: dict[int, dict]) -> str | None:
    """`promote:<id>` when a change set deletes a SHADOW rule and changes the rule it shadows (what `rules promote`
    writes to a rules table, or an admin's MERGE doing the same): the label `rules compare` finds a promotion by."""
    ids = {r.rule_id for r in rules}
    for rule in rules:
        stored = current.get(rule.rule_id)
        shadowing = stored and stored["ruleState"] == "SHADOW" and json.loads(stored["ruleJson"]).get("shadowOf")
        if rule.state == "DELETE" and shadowing in ids:
            return f"promote:{rule.rule_id}"
    return None


def _table_change(value: str, mapping: cdc.ColumnMapping) -> cdc.Change | RuleError:
    try:
        return cdc.table_change(value, mapping)
    except RuleError as err:
        return err
