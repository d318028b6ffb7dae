"""What the notebooks share: widget parameters, the job config, a local workload, the job's queries.

On Databricks parameters are notebook widgets (a job's `base_parameters` fill them); elsewhere
they are the notebook's defaults, each overridable by an environment variable
`FRAUDRULES_<KEY>` (so a headless run needs no edits to the notebook).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from fraudrules import backtest, config, event_schema, tables
from fraudrules.analyst import display, views
from fraudrules.backtest import BacktestResult
from fraudrules.config import EVALUATE_QUERY, INGEST_QUERY, QUERIES, JobConfig, flag
from fraudrules.engine import job
from fraudrules.generator import RichWorkload, Workload, is_rich, sample_rules_path, write_jsonl
from fraudrules.rules import shadow, store
from fraudrules.rules.model import Rule, load_rules_file, parse_rule, stored_rule
from fraudrules.rules.text import rule_text
from fraudrules.session import dbutils, kafka_secret_options, on_databricks

if TYPE_CHECKING:
    import pandas as pd

ENV_PREFIX = "FRAUDRULES_"
SHADOW_OFFSET = 1_000_000  # a candidate rule replays beside the live one under this offset id
# Records the local workload adds to the landing folder so that the quarantine has something to show.
INVALID_RECORDS = (
    "{not json",
    '{"transactionId": 1, "eventTime": 1, "payeeId": 1, "beneficiaryId": 1, "paymentAmount": "1.00"}',
    '{"transactionId": 2, "eventTime": 2, "payeeId": 1, "beneficiaryId": 1, "paymentAmount": "1.00",'
    ' "paymentType": "WIRE"}',
    '{"transactionId": "x", "eventTime": 3, "payeeId": 1, "beneficiaryId": 1, "paymentAmount": "1.001",'
    ' "paymentType": "CSH"}',
)


def params(defaults: Mapping[str, str]) -> dict[str, str]:
    """The notebook's parameters: widgets on Databricks, defaults overridden by FRAUDRULES_<KEY> elsewhere."""
    if on_databricks():
        widgets = dbutils().widgets
        for key, value in defaults.items():
            widgets.text(key, str(value))
        return {key: widgets.get(key) for key in defaults}
    return {key: os.environ.get(ENV_PREFIX + key.upper(), str(value)) for key, value in defaults.items()}


def _opt(p: Mapping[str, str], key: str) -> str | None:
    value = str(p.get(key, "") or "").strip()
    return value or None


def config_from(p: Mapping[str, str]) -> JobConfig:
    """A JobConfig from notebook parameters (`config.config_from`); with a Kafka bootstrap, the SASL options
    of the `kafka_secret_scope` widget's Databricks secret scope."""
    secrets = kafka_secret_options(_opt(p, "kafka_secret_scope")) if _opt(p, "kafka_bootstrap") else {}
    return event_schema.resolved(config.config_from(p, kafka_options=secrets))


def prepare(spark: SparkSession, cfg: JobConfig, p: Mapping[str, str]) -> dict[str, int]:
    """Tables, rules and (when asked) a landing workload, so a notebook also runs on a fresh data dir.

    - tables are created if missing;
    - an empty rules table gets the rules of `p["rules_file"]` (with `generate`, the sample rules by default);
    - with `p["generate"]` true, an empty landing folder gets `p["transactions"]` generated
      transactions (plus a few invalid records, which the ingest quarantines).
    """
    created = tables.ensure(spark, cfg)
    schema = event_schema.for_job(cfg)
    current = store.current(spark, cfg)
    loaded = 0
    rules_file = _opt(p, "rules_file") or (sample_rules_path(schema) if flag(p.get("generate", "false")) else None)
    if not current and rules_file:
        rows = store.upsert(spark, cfg, load_rules_file(rules_file, schema), author="notebook")
        current, loaded = {r["ruleId"]: r for r in rows}, len(rows)
    generated = 0
    if flag(p.get("generate", "false")) and cfg.source == "files" and not _has_files(cfg.landing):
        count, seed = int(p.get("transactions", "3000")), int(p.get("seed", "7"))
        generated = generate_workload(cfg.landing, count, seed, rich=is_rich(schema))
    active = sum(1 for r in current.values() if r["ruleState"] == "ACTIVE")
    return {"tables_created": len(created), "rules_loaded": loaded, "active_rules": active, "generated": generated}


def _has_files(folder: str) -> bool:
    return os.path.isdir(folder) and any(not n.startswith((".", "_")) for n in os.listdir(folder))


def generate_workload(
    folder: str, count: int, seed: int = 7, per_file: int = 500, invalid: bool = True, rich: bool = False
) -> int:
    """A small reproducible workload stamped with ingestionTimestamp (`rich`: of the rich schema).

    Five transactions a second of event time (3,000 span ten minutes) and a burst every 250.
    """
    now = int(time.time() * 1000)
    workload = (RichWorkload if rich else Workload)(count=count, seed=seed, burst_every=250, events_per_second=5.0)
    txs = ({**tx, "ingestionTimestamp": now} for tx in workload.transactions())
    n = write_jsonl(folder, txs, per_file=per_file)
    if invalid:
        path = os.path.join(folder, "invalid-000000.json")
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            fh.write("".join(r + "\n" for r in INVALID_RECORDS))
        os.replace(path + ".tmp", path)
    return n


def run_queries(spark: SparkSession, cfg: JobConfig, names: str | Sequence[str]) -> dict[str, Any]:
    """Start the named queries of the job ("rules,evaluate" or a list, `config.QUERIES`) as `fraudrules run`
    starts them, and wait for them: to completion with available-now, for as long as they run otherwise (the
    continuous job). Their results are committed to Delta before it returns; a failed query raises.

    Returns, per query, its micro-batches' progress as Spark reports it (`progress`) and their number.
    """
    wanted = tuple(n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip())
    unknown = [n for n in wanted if n not in QUERIES]
    if unknown:
        raise ValueError(f"unknown query {unknown[0]!r}; queries: {', '.join(QUERIES)}")
    running = job.start(spark, cfg, names=wanted)
    try:  # until all have finished, or the first one fails (then the others are stopped with it)
        while active := [q for q in running.queries if q.isActive]:
            active[0].awaitTermination(2)
            failed = [q.exception() for q in running.queries if not q.isActive and q.exception() is not None]
            if failed:
                raise failed[0]
    finally:
        running.stop(drain_s=0)  # stops what still runs, commits the results
    out = {}
    for query in running.queries:
        progress = [json.loads(pr.json) for pr in query.recentProgress]
        out[query.name] = {"batches": len(progress), "progress": progress}
    return out


def run_query(spark: SparkSession, cfg: JobConfig, name: str) -> dict[str, Any]:
    """`run_queries` for one query: its {batches, progress}."""
    return run_queries(spark, cfg, [name])[name]


def catch_up(
    spark: SparkSession, cfg: JobConfig, queries: Sequence[str] = (INGEST_QUERY, EVALUATE_QUERY)
) -> list[dict[str, Any]]:
    """Locally, run each of `queries` that never ran (its table is still empty) over the landing folder.

    This lets a notebook run on a fresh data dir; on Databricks the continuous job does this.
    """
    if on_databricks() or not cfg.available_now:
        return []
    todo = []
    if INGEST_QUERY in queries and tables.read(spark, cfg, "transactions").isEmpty():
        todo.append(INGEST_QUERY)
    evaluated = tables.read(spark, cfg, "batches").where(F.col("query") == EVALUATE_QUERY)
    if EVALUATE_QUERY in queries and evaluated.isEmpty():
        todo.append(EVALUATE_QUERY)
    done = {name: run_query(spark, cfg, name) for name in todo}  # one after the other: 2 cores
    return [{"query": name, "micro-batches": d["batches"]} for name, d in done.items()]


def scratch_config(cfg: JobConfig, folder: str) -> JobConfig:
    """A config for throw-away tables (backtests): local Delta paths under an emptied `folder`."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder, exist_ok=True)
    return cfg.with_(data_dir=folder, catalog=None, schema=None, checkpoint_root=None, transactions_source=None)


def live_rule(spark: SparkSession, cfg: JobConfig, rule_id: int) -> Rule | None:
    """The rule as the rules table holds it now (None if there is no such rule)."""
    row = store.current(spark, cfg).get(int(rule_id))
    return None if row is None else stored_rule(json.loads(row["ruleJson"]), event_schema.for_job(cfg))


def candidate_rule(cfg: JobConfig, text: str) -> Rule:
    """A rule an analyst wrote (JSON), validated against the job's event schema (RuleError naming every problem)."""
    return parse_rule(json.loads(text), event_schema.for_job(cfg))


@dataclass
class Comparison:
    """A candidate rule replayed beside the live one: the backtest, their alerts matched, counts per side."""

    result: BacktestResult
    compared: DataFrame  # views.compare_alerts(live, candidate)
    counts: dict[str, int]  # views.comparison_counts: "live only", "candidate only", "both"
    live: Rule | None
    candidate: Rule

    def summary(self) -> pd.DataFrame:
        """One row per side: the rule and its alerts in the replay."""
        import pandas as pd

        only_live, only_candidate, both = views.comparison_sides()
        rows = []
        for label, rule, only in (("live", self.live, only_live), ("candidate", self.candidate, only_candidate)):
            if rule is None:
                continue
            alerts = self.counts[only] + self.counts[both]
            rows.append({"": f"{label} rule {rule.rule_id}", "rule": rule_text(rule), "alerts": alerts})
        return pd.DataFrame(rows).set_index("")

    def plot(self) -> Any:
        """The alerts of each side and of both, the two rules named by what they check."""
        from fraudrules.analyst import plots

        live = f"rule {self.live.rule_id}: {rule_text(self.live)}" if self.live else None
        return plots.plot_comparison(self.counts, live, f"rule {self.candidate.rule_id}: {rule_text(self.candidate)}")


def backtest_candidate(
    spark: SparkSession, cfg: JobConfig, transactions: str, candidate: Rule, work_dir: str
) -> Comparison:
    """Replay `transactions` (JSON-lines file, folder or glob) with the live rule and the candidate side by side.

    Both run in one backtest under `work_dir` (emptied first), the candidate under a shadow id that never
    shows: its alerts are compared with the live rule's (`views.compare_alerts`).
    """
    live = live_rule(spark, cfg, candidate.rule_id)
    shadow_id = SHADOW_OFFSET + candidate.rule_id
    replay = [views.with_rule_id(candidate, shadow_id)]
    if live is not None and live.state == "ACTIVE":
        replay.insert(0, live)
    bt_cfg = scratch_config(cfg, work_dir)
    result = backtest.run(spark, bt_cfg, transactions, replay)
    alerts = tables.read(spark, bt_cfg, "alerts")
    compared = views.compare_alerts(
        alerts.where(F.col("ruleId") == candidate.rule_id), alerts.where(F.col("ruleId") == shadow_id)
    ).cache()
    active = live if live is not None and live.state == "ACTIVE" else None
    return Comparison(result, compared, views.comparison_counts(compared), active, candidate)


def shadow_candidate(
    spark: SparkSession, cfg: JobConfig, candidate: Rule, confirmed: str | bool, author: str
) -> list[dict]:
    """Only when `confirmed`: put `candidate` in SHADOW on the running job beside the live rule it edits,
    under the shadow id `SHADOW_OFFSET + ruleId` with `shadowOf` = its ruleId (`fraudrules rules shadow`);
    returns the new rows. Its hits go to `shadow_alerts` from the job's next micro-batch on."""
    if not flag(confirmed):
        return []
    live = store.current(spark, cfg).get(candidate.rule_id)
    shadow_of = candidate.rule_id if live is not None and live["ruleState"] == "ACTIVE" else None
    rule = replace(candidate, rule_id=SHADOW_OFFSET + candidate.rule_id, state="SHADOW", shadow_of=shadow_of)
    return store.shadow(spark, cfg, [rule], author=author)


def compare_shadow(
    spark: SparkSession, cfg: JobConfig, shadow_id: int, wait_minutes: float = 0.0, traffic: int = 1000
) -> shadow.Comparison | None:
    """The shadow rule against its live rule (`fraudrules rules compare`) after `wait_minutes` of live traffic;
    None if `shadow_id` never was a shadow rule.

    Locally with available-now there is no running job: `traffic` new transactions (after the newest in
    bronze) are generated and the job's queries run over them instead of waiting."""
    if not any(r["ruleState"] == "SHADOW" for r in store.history(spark, cfg, shadow_id)):
        return None
    if cfg.available_now and not on_databricks() and cfg.source == "files":
        more_traffic(spark, cfg, traffic)
        for name in (INGEST_QUERY, EVALUATE_QUERY):
            run_query(spark, cfg, name)
    else:
        time.sleep(max(0.0, float(wait_minutes)) * 60)
    return shadow.compare(spark, cfg, shadow_id)


def more_traffic(spark: SparkSession, cfg: JobConfig, count: int) -> int:
    """`count` generated transactions after the newest in bronze (event time and id), into the landing folder."""
    top = tables.read(spark, cfg, "transactions").agg(F.max("eventTime"), F.max("transactionId")).first()
    start, first_id = (int(top[0]) + 1, int(top[1]) + 1) if top and top[0] is not None else (None, 1)
    kind = RichWorkload if is_rich(event_schema.for_job(cfg)) else Workload
    workload = kind(count=count, seed=first_id, burst_every=250, events_per_second=5.0, first_id=first_id)
    if start is not None:
        workload = replace(workload, start_ms=start)
    now = int(time.time() * 1000)
    txs = ({**tx, "ingestionTimestamp": now} for tx in workload.transactions())
    return write_jsonl(cfg.landing, txs, per_file=500, prefix=f"more-{first_id}")


def newest_shadow_rule(spark: SparkSession, cfg: JobConfig) -> int | None:
    """The rule to plot against its live rule: the newest SHADOW rule, else the last to write shadow alerts."""
    rules = [r for r in store.current(spark, cfg).values() if r["ruleState"] == "SHADOW"]
    if rules:
        return max(rules, key=lambda r: (r["updatedAt"], r["ruleId"]))["ruleId"]
    last = tables.read(spark, cfg, "shadow_alerts").orderBy(F.desc("producedAtMs")).select("ruleId").first()
    return None if last is None else int(last.ruleId)


def plot_shadow(spark: SparkSession, cfg: JobConfig, shadow_id: int | None, figures_dir: str, name: str) -> Any:
    """The live-vs-shadow alerts chart of a shadow rule (saved as `<name>.png`), or why there is none."""
    if shadow_id is None:
        return "no shadow rules (put one with `fraudrules rules shadow FILE`)"
    from fraudrules.analyst import plots

    c = shadow.compare(spark, cfg, int(shadow_id))
    live = f"rule {c.live_id}: {c.rules['live']}" if "live" in c.rules else "no live rule"
    fig = plots.plot_live_vs_shadow(shadow.live_vs_shadow(c), live, f"rule {shadow_id}: {c.rules['shadow']}")
    return plots.save_figure(fig, figures_dir, name)


def plot_shard_load(keyed: DataFrame, cfg: JobConfig, figures_dir: str, name: str) -> Any:
    """The keyed rows per shard chart (saved as `<name>.png`); with one shard there is no load to compare, which
    it says instead."""
    if cfg.shards == 1:
        return "one shard (shards = 1): every keyed row goes to shard 0, so there is no load to compare"
    from fraudrules.analyst import plots

    return plots.save_figure(plots.plot_shard_load(views.shard_load(keyed), cfg.shards), figures_dir, name)


def export_alerts(spark: SparkSession, cfg: JobConfig, out: str | None = None) -> tuple[str, int]:
    """Publish the alerts table as JSON lines (default `<data_dir>/exports/alerts.jsonl`).

    Returns (path, alerts written); folders are created as needed.
    """
    path = os.path.abspath(out or os.path.join(cfg.data_dir, "exports", "alerts.jsonl"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path, backtest.write_alerts(spark, cfg, path)


def activate(spark: SparkSession, cfg: JobConfig, rule: Rule, confirmed: str | bool, author: str) -> list[dict]:
    """Write `rule` to the live rules table, only when `confirmed` (a widget's "true"); returns the new rows."""
    if not flag(confirmed):
        return []
    return store.upsert(spark, cfg, [rule], author=author)


def show(df: Any, n: int = 20) -> Any:
    """Databricks' display for a Spark DataFrame there; elsewhere its first `n` rows as a table people can read
    (`display.readable`: amounts at 2 places, times as ISO timestamps, keys as name=value)."""
    if on_databricks():
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None and "display" in shell.user_ns:
            return shell.user_ns["display"](df)
    return display.readable(df, n)


def finish(spark: SparkSession) -> None:
    """Stop the local Spark session at the end of a notebook (never the cluster's on Databricks)."""
    if not on_databricks():
        for q in spark.streams.active:
            q.stop()
        spark.stop()
