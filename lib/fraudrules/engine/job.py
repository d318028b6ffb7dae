"""The continuous job: rule changes, bronze ingest, and the stateful query (window rules and login detector).

Bronze ingest and evaluation read the same source, each with its own checkpoint (and position in the source), so
that an alert is one micro-batch away from ingestion rather than two. The ingest queries run in the background
scheduler pool (on a small machine they never make the others wait for a core longer than a task) and their stream
threads at the lowest priority (`session.background_thread`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from fraudrules import event_schema, tables
from fraudrules.compat import pyspark as pyspark_compat
from fraudrules.compat import spark_checkpoint
from fraudrules.config import (
    EVALUATE_QUERY,
    INGEST_QUERY,
    LOGINS_INGEST_QUERY,
    QUERIES,
    RULES_QUERY,
    TRANSACTION_QUERIES,
    JobConfig,
)
from fraudrules.engine import ingest, inputs, kafka, lines
from fraudrules.engine.bronze import IngestSink
from fraudrules.engine.committer import BACKGROUND_POOL, HOT_POOL, Committer
from fraudrules.engine.evaluation import OUTPUT_SCHEMA
from fraudrules.engine.processors import Detectors
from fraudrules.engine.progress import STATEFUL, Printer, say
from fraudrules.engine.results import ResultSink
from fraudrules.engine.rule_changes import RuleChangeSink
from fraudrules.engine.shard_values import Layout
from fraudrules.engine.sources import raw_logins, raw_transactions, rule_changes
from fraudrules.event_schema import SchemaError
from fraudrules.rules import store
from fraudrules.rules.codec import from_row
from fraudrules.rules.model import EVALUATED, RuleError, validate
from fraudrules.session import on_databricks

BACKGROUND = (INGEST_QUERY, LOGINS_INGEST_QUERY)  # off the alert path: background pool, stream thread niced


def namespace(cfg: JobConfig, query: str) -> str:
    """Names the state caches of one checkpoint (see state.Cache)."""
    return hashlib.sha1(cfg.checkpoint(query).encode()).hexdigest()[:16]


def evaluate(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    """Transactions, login events (`cfg.logins`) and rule changes → keyed, windowed evaluation and login sequences:
    the processor's output rows."""
    labels = inputs.shard_labels(cfg.shards, cfg.shuffle_partitions)
    schema = event_schema.for_job(cfg)
    processor = Detectors(
        cfg.lateness_ms,
        labels,
        namespace(cfg, EVALUATE_QUERY),
        schema=schema,
        state_memory_mb=cfg.state_memory_mb,
        detect_logins=cfg.logins,
        legacy=Layout(cfg.checkpoint(EVALUATE_QUERY)).legacy(spark),
    )
    logins = raw_logins(spark, cfg, EVALUATE_QUERY, ledger="login_lines") if cfg.logins else None
    rows = inputs.detector_input(spark, cfg, raw_transactions(spark, cfg, EVALUATE_QUERY), logins, labels, schema)
    return rows.groupBy("shard").transformWithStateInPandas(processor, OUTPUT_SCHEMA, "append", "None")


def check_sources(cfg: JobConfig) -> None:
    """SchemaError when the evaluation checkpoint was started with login detection on and the job now runs without
    it, or the other way round: Spark cannot add a source to a query that has run, or remove one."""
    logged = lines.logged_sources(cfg.checkpoint(EVALUATE_QUERY))
    wanted = 3 if cfg.logins else 2  # transactions, (login events,) rule changes
    if logged is not None and logged != wanted:
        was = "on" if logged > wanted else "off"
        raise SchemaError(
            f"the checkpoint {cfg.checkpoint(EVALUATE_QUERY)} was started with login detection {was}, and Spark "
            f"cannot add a source to a query that has run, or remove one: run it with login detection {was} "
            "(JobConfig.logins), or start afresh with another checkpoint root (--checkpoint-root)"
        )


def adopt_schema(spark: SparkSession, cfg: JobConfig) -> list[str]:
    """Start with the event schema (`event_schema.for_job`) once it fits what the job already holds: SchemaError
    when an evaluated (ACTIVE or SHADOW) rule names a field it does not declare, or a field changes type, or when
    login detection is not what the evaluation checkpoint started with (`check_sources`). Bronze gains the columns
    of the fields it adds (returned), `batches` those of newer releases; the schema is recorded beside the
    checkpoints."""
    check_sources(cfg)
    schema = event_schema.for_job(cfg)
    problems = []
    previous = event_schema.recorded(cfg)
    if previous is not None and (changed := schema.changed_from(previous)):
        problems.append("a field cannot change its type (" + "; ".join(changed) + ")")
    for row in store.current(spark, cfg).values():
        if row["ruleState"] in EVALUATED:
            try:
                validate(from_row(row), schema)
            except RuleError as err:
                problems.append(
                    f"{row['ruleState']} {err} (pause or delete it first: `fraudrules rules pause {err.rule_id}`)"
                )
    if problems:
        raise SchemaError(
            f"the event schema {cfg.event_schema or '(default)'} does not fit this job: " + "; ".join(problems)
        )
    added = tables.evolve(spark, cfg, "transactions")
    tables.evolve(spark, cfg, "batches")  # `logins`: login events of the evaluate query's batches
    event_schema.record(cfg, schema)
    return added


def discard_unstarted(checkpoint: str) -> bool:
    """A checkpoint whose offset log holds no batch has run nothing: clear what a start killed before its first
    offset was written left behind (a temporary offset file, state schema files), which Spark would otherwise
    refuse as a non-empty checkpoint of a new query. True when something was cleared."""
    if not os.path.isdir(checkpoint) or spark_checkpoint.logged_batches(*lines.open_fs(checkpoint), "offsets"):
        return False
    leftovers = [d for d in ("offsets", "commits", "state") if os.path.isdir(os.path.join(checkpoint, d))]
    for name in leftovers:
        shutil.rmtree(os.path.join(checkpoint, name))
    return bool(leftovers)


def trigger_seconds(cfg: JobConfig, name: str) -> float:
    """How often a query may start a micro-batch: the stateful ones back to back, rule changes within a
    moment, bronze ingest in fewer, larger commits."""
    if name in STATEFUL:
        return cfg.trigger_seconds
    return cfg.rules_trigger_seconds if name == RULES_QUERY else cfg.background_trigger_seconds


def start_query(
    spark: SparkSession, df: DataFrame, sink: Callable[[DataFrame, int], None], cfg: JobConfig, name: str
) -> StreamingQuery:
    """Start one query with its foreachBatch sink, checkpoint, trigger and scheduler pool."""
    discard_unstarted(cfg.checkpoint(name))
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", BACKGROUND_POOL if name in BACKGROUND else HOT_POOL)
    writer = df.writeStream.queryName(name).foreachBatch(sink).option("checkpointLocation", cfg.checkpoint(name))
    if cfg.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{int(trigger_seconds(cfg, name) * 1000)} milliseconds")
    try:
        return writer.start()
    finally:
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", None)


class Job:
    """The running queries of the job, by name, and the committers of the stateful ones."""

    def __init__(self, queries: dict[str, StreamingQuery], committers: list[Committer]):
        self.by_name, self.committers = queries, committers

    def __getattr__(self, name: str) -> StreamingQuery:
        try:
            return self.__dict__["by_name"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def queries(self) -> list[StreamingQuery]:
        return list(self.by_name.values())

    def wait(self) -> None:
        """Until every query ends (available-now), then everything committed and the committers ended (a
        committer left running would go on watching its outbox folder, which a later job on the same
        checkpoint fills: it would commit that job's results under its own ledger as well)."""
        for q in self.queries:
            q.awaitTermination()
        for c in self.committers:
            c.stop()

    def commit(self) -> None:
        """Publish and commit every finished micro-batch's results now."""
        for c in self.committers:
            c.drain()

    def process_all_available(self) -> None:
        for q in self.queries:
            q.processAllAvailable()
        self.commit()

    def stop(self, drain_s: float = 30.0, failed: bool = False) -> None:
        """Stop every query, then commit what their committers hold; with `drain_s`, each query first gets
        that long to finish the micro-batch it is in (stopping interrupts a running batch: it is redone on
        restart, but the JVM reports the interruption). After a failure (`failed`) the committers end first,
        without waiting for a broker or storage that is down (`Committer.stop`): a micro-batch waiting for a
        publish would hold its query's stop up."""
        if failed:
            self._end_committers(failed)
        deadline = time.monotonic() + drain_s
        stuck = []
        for q in self.queries:
            finish_batch(q, deadline)
            try:
                q.stop()
            except Exception as error:  # its stream thread did not end within the session's stopTimeout
                stuck.append(error)
        if not failed:
            self._end_committers(failed)
        if stuck:  # the other queries are stopped and the committers ended first
            raise stuck[0]

    def _end_committers(self, failed: bool) -> None:
        for c in self.committers:
            c.stop(failed)


def finish_batch(q: StreamingQuery, deadline: float) -> None:
    """Wait until the micro-batch the query is in now has ended (or the deadline). Its status alone does not say
    so: a query running back to back is in its next micro-batch at once, and a stop waited for the deadline every
    time (30 s of `fraudrules run` finishing its evaluation's micro-batches after a Ctrl-C)."""
    if not (q.isActive and q.status["isTriggerActive"]):
        return
    running = last_batch(q) + 1
    while q.isActive and q.status["isTriggerActive"] and last_batch(q) < running and time.monotonic() < deadline:
        time.sleep(0.1)


def last_batch(q: StreamingQuery) -> int:
    """The id of the query's last ended micro-batch (-1: none yet in this run)."""
    progress = q.lastProgress
    return int(progress["batchId"]) if progress else -1


def query(
    spark: SparkSession, cfg: JobConfig, name: str, printer: Printer | None = say
) -> tuple[DataFrame, Callable[[DataFrame, int], None]]:
    """The named query's streaming DataFrame and its foreachBatch sink."""
    if name == RULES_QUERY:
        return rule_changes(spark, cfg), RuleChangeSink(cfg, printer)
    if name == INGEST_QUERY:
        return ingest.parse(raw_transactions(spark, cfg, name), event_schema.for_job(cfg)), IngestSink(
            cfg, INGEST_QUERY
        )
    if name == LOGINS_INGEST_QUERY:
        return ingest.parse_logins(raw_logins(spark, cfg, name)), IngestSink(cfg, LOGINS_INGEST_QUERY, "login")
    if name == EVALUATE_QUERY:
        publish = kafka.AlertsProducer(cfg) if cfg.kafka_alerts_topic else None
        committer = Committer(spark, cfg, name, printer, cfg.background_trigger_seconds, publish)
        return evaluate(spark, cfg), ResultSink(committer, printer)
    raise ValueError(f"unknown query {name!r}; queries: {', '.join(QUERIES)}")


def query_names(cfg: JobConfig) -> tuple[str, ...]:
    """The queries of the job: rules, ingest, evaluate, and (cfg.logins) the logins' ingest."""
    return QUERIES if cfg.logins else TRANSACTION_QUERIES


def start(
    spark: SparkSession, cfg: JobConfig, printer: Printer | None = say, names: tuple[str, ...] | None = None
) -> Job:
    """Create missing tables, adopt the event schema (`adopt_schema`), publish and commit what a previous run left
    in the outboxes, start the queries (`names`, by default `query_names(cfg)`)."""
    cfg = event_schema.resolved(cfg)  # once for every query, sink and processor
    tables.ensure(spark, cfg)
    warming = warm_up(spark, cfg)
    adopt_schema(spark, cfg)
    names = names or query_names(cfg)
    if printer and (note := pyspark_compat.notice()):
        printer(note)
    planned = {name: query(spark, cfg, name, printer) for name in names}
    committers = [sink.committer for _, sink in planned.values() if isinstance(sink, ResultSink)]
    running = Job({}, committers)
    try:
        for c in committers:  # a previous run's results before any query starts: Delta sees them in batch order
            if c.publisher:
                c.publisher.recover()  # its alerts that did not reach the topic
            c.commit_pending()
        # the admins' changes so far (a rules table's, or their database's through Debezium), before any transaction
        if (cfg.rules_table or cfg.rules_format == "debezium") and RULES_QUERY in planned:
            df, sink = planned[RULES_QUERY]
            start_query(spark, df, sink, cfg.with_(available_now=True), RULES_QUERY).awaitTermination()
        for name, (df, sink) in planned.items():
            running.by_name[name] = start_query(spark, df, sink, cfg, name)
    except BaseException:  # a broker or storage still down: nothing of this start keeps running
        for q in running.queries:
            q.stop()
        for c in committers:
            c.discard()
        raise
    for c in committers:
        c.start()
    for future in warming:
        future.result()  # done by now; a failure is the one the query's own call met
    return running


def _import_processors(_: int) -> None:
    """In a Python worker: import the stateful processors' modules (pandas, pyarrow, ...) before their first use."""
    import fraudrules.engine.processors  # noqa: F401


def warm_up(spark: SparkSession, cfg: JobConfig) -> list[Future]:
    """Begin, each in a thread, the slowest steps on the way to the first micro-batch, which would otherwise run
    one after the other: Spark's lookup of installed Python data sources on the first registration of one (a
    Python daemon and its worker, ~1 s; for the file source), the first read of the rule history's Delta log (1-2 s
    in a fresh JVM) and, in a local session, the start of the stateful processors' Python workers. The queries' own
    calls then find them done, or wait for them."""
    pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="warm-up")
    warming = [pool.submit(lambda: tables.read(spark, cfg, "rule_history").schema)]
    if cfg.source != "kafka":
        warming.append(pool.submit(lines.register, spark))
    if not on_databricks():
        # Spark keeps a Python daemon per worker environment, and an RDD job's runner and the stateful processors'
        # both leave simplified tracebacks off: the job's first stateful micro-batch finds their daemon started and
        # an idle worker that has imported the processors (~1 s)
        warming.append(pool.submit(lambda: spark.sparkContext.parallelize([0], 1).foreach(_import_processors)))
    pool.shutdown(wait=False)
    return warming
