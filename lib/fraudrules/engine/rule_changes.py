"""The rules query's foreachBatch sink: each change set merged into the rules table; invalid rules go to
`rule_errors` (appended exactly once per micro-batch with Delta's transaction), valid ones still apply."""

from __future__ import annotations

import os
from datetime import datetime, timezone

from pyspark.sql import DataFrame

from fraudrules import event_schema, tables
from fraudrules.config import RULES_QUERY, JobConfig
from fraudrules.engine import progress
from fraudrules.engine.progress import Printer
from fraudrules.rules import store
from fraudrules.rules.model import parse_rules_text


class RuleChangeSink:
    """Merges each change set into the rules table; invalid rules go to rule_errors, valid ones still apply."""

    def __init__(self, cfg: JobConfig, printer: Printer | None = progress.say):
        self.cfg, self.printer = cfg, printer
        self.schema = event_schema.for_job(cfg)  # rules naming fields it does not declare go to rule_errors

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        spark = df.sparkSession
        errors = []
        # a few rows (one per change set): sorted here, not by a Spark sort (a sampling job and a shuffle)
        for row in sorted(df.collect(), key=lambda r: (r.modified, r.source)):
            changes, problems = parse_rules_text(row.value, self.schema)
            applied = store.apply(
                spark,
                self.cfg,
                changes,
                author=f"stream:{os.path.basename(row.source)}",
                change_id=f"{RULES_QUERY}:{batch_id}:{row.source}",
            )
            errors += [
                {
                    "ruleId": None if e.rule_id is None else str(e.rule_id),
                    "raw": row.value,
                    "reason": "; ".join(e.problems),
                    "source": row.source,
                }
                for e in problems
            ]
            if self.printer:
                self.printer(
                    f"[rules] {os.path.basename(row.source)}: {len(applied)} rules changed, {len(problems)} rejected"
                )
        if errors:
            received = datetime.now(timezone.utc)
            rows = [{**e, "receivedAt": received} for e in errors]
            txn = tables.Txn.of(self.cfg, RULES_QUERY, batch_id)
            tables.writer(spark, self.cfg).append("rule_errors", rows, txn)
