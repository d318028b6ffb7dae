"""One config object for every entry point: tables as local Delta paths or Unity Catalog names."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

TABLES = (
    "transactions", "logins", "quarantine", "rules", "rule_history", "rule_errors", "rules_export", "rule_applied",
    "alerts", "late_events", "batches", "dq_results",
)  # fmt: skip


@dataclass(frozen=True)
class JobConfig:
    data_dir: str = "data"
    catalog: str | None = None  # set both catalog and schema to use Unity Catalog tables
    schema: str | None = None
    checkpoint_root: str | None = None
    shards: int = 16  # state groups of the stateful stage; fixed for the life of a checkpoint
    shuffle_partitions: int = 2
    lateness_ms: int = 60_000
    trigger_seconds: float = 0.0
    available_now: bool = False
    max_files_per_trigger: int | None = None
    transactions_source: str | None = None  # folder of JSON-lines files; default <data>/landing/transactions
    logins: bool = False  # also run the login anomaly detector (seed 000)
    logins_source: str | None = None  # folder of login-event JSON-lines files; default <data>/landing/logins
    # Kafka (`source="kafka"`): transactions and logins from topics; rule changes / alerts via topics when named.
    source: str = "files"  # "files" | "kafka"
    kafka_bootstrap: str | None = None  # bootstrap servers, e.g. "host1:9092,host2:9092"
    kafka_options: dict[str, str] = field(default_factory=dict)  # `kafka.*` (SASL/SSL, ...) to every reader/writer
    kafka_transactions_topic: str = "transactions"
    kafka_logins_topic: str = "logins"
    kafka_rules_topic: str | None = None  # rule changes from this topic instead of the rules folder
    kafka_alerts_topic: str | None = None  # alerts also published here (at-least-once; key = alertId)
    kafka_starting_offsets: str = "earliest"  # for a fresh checkpoint only: "earliest", "latest" or JSON
    max_offsets_per_trigger: int | None = None  # bound of a micro-batch read from Kafka (backpressure)

    def __post_init__(self) -> None:
        if self.source not in ("files", "kafka"):
            raise ValueError(f"source must be 'files' or 'kafka', not {self.source!r}")
        uses_kafka = self.source == "kafka" or self.kafka_rules_topic or self.kafka_alerts_topic
        if uses_kafka and not self.kafka_bootstrap:
            raise ValueError("Kafka topics are configured but kafka_bootstrap is not")

    @property
    def uses_catalog(self) -> bool:
        return bool(self.catalog and self.schema)

    def table(self, name: str) -> str:
        """Unity Catalog name or local Delta path of a project table."""
        if name not in TABLES:
            raise ValueError(f"unknown table {name!r}; tables: {', '.join(TABLES)}")
        if self.uses_catalog:
            return f"{self.catalog}.{self.schema}.{name}"
        return os.path.abspath(os.path.join(self.data_dir, "tables", name))

    def checkpoint(self, query: str) -> str:
        root = self.checkpoint_root or os.path.join(self.data_dir, "checkpoints")
        return os.path.abspath(os.path.join(root, query))

    @property
    def rules_landing(self) -> str:
        """Folder of rule change files (JSON list or object per file), the local stand-in for the rules topic."""
        return os.path.abspath(os.path.join(self.data_dir, "landing", "rules"))

    @property
    def logins_landing(self) -> str:
        return os.path.abspath(self.logins_source or os.path.join(self.data_dir, "landing", "logins"))

    @property
    def landing(self) -> str:
        return os.path.abspath(self.transactions_source or os.path.join(self.data_dir, "landing", "transactions"))

    def with_(self, **changes: object) -> JobConfig:
        return replace(self, **changes)
