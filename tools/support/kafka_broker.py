"""A real single-node Apache Kafka broker (KRaft, no ZooKeeper) on loopback, for dev and tests.

The broker runs from Maven Central jars (jvm/kafka-broker/pom.xml) as a child JVM:

    with LocalKafka(resolve_jars(cache, pom), work_dir) as kafka:
        kafka.create_topic("txns", partitions=3)
        ...  # any client, bootstrap servers = kafka.bootstrap

The tests start it so; `tools/kafka_local.py` is its command line (`make kafka`, `make run SOURCE=kafka`). The
broker needs only the stdlib (readiness is checked with a raw Kafka Metadata request); the client
helpers (topics, produce, consume, a tail that reads a topic as messages arrive) import confluent-kafka when called.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_POM = REPO_ROOT / "jvm" / "kafka-broker" / "pom.xml"
DEFAULT_JARS = Path(os.environ.get("FRAUDRULES_KAFKA_JARS") or REPO_ROOT / ".jars" / "kafka")

BROKER_MAIN = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
TOPIC_TOOL = "org.apache.kafka.tools.TopicCommand"

# Small, latency-friendly JVMs: the broker is long-lived, the CLI tools run for a second or two.
BROKER_JVM_OPTS = (
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-Djava.awt.headless=true",
)
TOOL_JVM_OPTS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")


def resolve_jars(cache_dir: Path, pom: Path) -> Path:
    """Copy the pom's runtime classpath into cache_dir with Maven, once; return the jar dir."""
    marker = cache_dir / ".resolved"
    if marker.exists():
        return cache_dir
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("Maven (mvn) is needed to resolve the Kafka jars")
    cache_dir.mkdir(parents=True, exist_ok=True)
    for stale in cache_dir.glob("*.jar"):  # a half-finished or older resolution
        stale.unlink()
    cmd = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={cache_dir.resolve()}",
        "-DincludeScope=runtime",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)  # Maven's quiet mode still prints colour resets
    if done.returncode != 0:
        raise RuntimeError(f"Maven could not resolve the Kafka jars: {(done.stdout + done.stderr).strip()[-2000:]}")
    marker.write_text(f"{pom.resolve()}\n")
    return cache_dir


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def random_cluster_id() -> str:
    """A Kafka Uuid string (url-safe base64, no padding) that does not start with '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


# --- minimal Kafka wire protocol: just enough to ask "are you up, and do you know a broker?" ---


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        buf += chunk
    return buf


def _request(sock: socket.socket, api_key: int, version: int, body: bytes, corr_id: int) -> bytes:
    """Send one request (header v1, non-flexible) and return the response body."""
    client_id = b"fraudrules"
    msg = struct.pack(">hhih", api_key, version, corr_id, len(client_id)) + client_id + body
    sock.sendall(struct.pack(">i", len(msg)) + msg)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    resp = _recv_exact(sock, size)
    if struct.unpack_from(">i", resp)[0] != corr_id:
        raise ConnectionError("correlation id mismatch")
    return resp[4:]


def _metadata_version(api_versions: bytes) -> int | None:
    """Pick a non-flexible (v1..v8) Metadata version from an ApiVersions v0 response."""
    (count,) = struct.unpack_from(">i", api_versions, 2)
    for i in range(count):
        key, lo, hi = struct.unpack_from(">hhh", api_versions, 6 + 6 * i)
        if key == 3 and max(lo, 1) <= min(hi, 8):
            return max(lo, 1)
    return None


def broker_ready(port: int, host: str = "127.0.0.1", timeout_s: float = 2.0) -> bool:
    """True when the broker answers a Metadata request listing at least one live broker."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            version = _metadata_version(_request(sock, 18, 0, b"", 1))  # ApiVersions v0
            if version is None:
                return False
            body = struct.pack(">i", -1)  # null topic list = all topics
            body += b"\x00" if version >= 4 else b""  # allow_auto_topic_creation
            body += b"\x00\x00" if version >= 8 else b""  # include_*_authorized_operations
            meta = _request(sock, 3, version, body, 2)
            (brokers,) = struct.unpack_from(">i", meta, 4 if version >= 3 else 0)  # after throttle_time
            return brokers > 0
    except (OSError, struct.error):
        return False


class LocalKafka:
    """A single-node KRaft broker+controller on 127.0.0.1 that lives under work_dir."""

    def __init__(self, jar_dir: Path, work_dir: Path, port: int | None = None) -> None:
        self.jar_dir = Path(jar_dir)
        self.work_dir = Path(work_dir).resolve()
        self.port = port or free_port()
        self.controller_port = free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_file(self) -> Path:
        return self.work_dir / "logs" / "server.log"

    # -- files ------------------------------------------------------------------------------------

    def _write_configs(self) -> Path:
        logs = self.work_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",  # static quorum
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.work_dir / "data"),
            "auto.create.topics.enable": "true",
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Small footprint: 2 cores, tiny data.
            "num.network.threads": "2",
            "num.io.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "background.threads": "2",
            "log.segment.bytes": str(16 * 1024 * 1024),
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
            "log.cleaner.threads": "1",
            "log.retention.hours": "24",
        }
        server = self.work_dir / "server.properties"
        server.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        for name, target in (("log4j2.properties", "File"), ("tools-log4j2.properties", "Console")):
            (self.work_dir / name).write_text(log4j2_config(target, self.log_file))
        return server

    # -- processes --------------------------------------------------------------------------------

    def _java(self, main: str, *args: str, jvm_opts: tuple[str, ...] = TOOL_JVM_OPTS) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("java is needed to run the Kafka broker")
        log_cfg = "log4j2.properties" if main == BROKER_MAIN else "tools-log4j2.properties"
        return [
            java,
            *jvm_opts,
            f"-Dlog4j2.configurationFile={self.work_dir / log_cfg}",
            "-cp",
            f"{self.jar_dir.resolve()}/*",
            main,
            *args,
        ]

    def _run_tool(self, main: str, *args: str) -> str:
        res = subprocess.run(self._java(main, *args), capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            raise RuntimeError(f"{main} {' '.join(args)} failed ({res.returncode}):\n{res.stdout}{res.stderr}")
        return res.stdout

    def _format_storage(self, server: Path) -> None:
        # A work_dir that was formatted before keeps its data and cluster id across restarts.
        if (self.work_dir / "data" / "meta.properties").exists():
            return
        self._run_tool(STORAGE_TOOL, "format", "-t", random_cluster_id(), "-c", str(server))

    def _launch(self, server: Path) -> subprocess.Popen[bytes]:
        cmd = self._java(BROKER_MAIN, str(server), jvm_opts=BROKER_JVM_OPTS)
        if sys.platform.startswith("linux") and shutil.which("setpriv"):
            # The JVM gets SIGTERM when the thread that started it exits, even if we are SIGKILLed.
            cmd = ["setpriv", "--pdeathsig", "TERM", *cmd]
        with open(self.work_dir / "logs" / "broker.out", "ab") as out:
            # Own session: a terminal Ctrl-C reaches us, and we stop the broker in order.
            return subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.work_dir,
                start_new_session=True,
            )

    def _tail(self, lines: int = 30) -> str:
        parts = []
        for f in (self.work_dir / "logs" / "broker.out", self.log_file):
            if f.exists():
                parts.append(f"--- {f} ---\n" + "\n".join(f.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(parts)

    def start(self, timeout_s: float = 60) -> LocalKafka:
        """Format storage, launch the broker, and block until it serves metadata."""
        if self.running:
            return self
        server = self._write_configs()
        self._format_storage(server)
        self._proc = self._launch(server)
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                raise RuntimeError(f"Kafka broker exited with {code} during start-up\n{self._tail()}")
            if broker_ready(self.port):
                return self
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"Kafka broker not ready on {self.bootstrap} after {timeout_s}s\n{self._tail()}")

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create a topic (replication factor 1); a no-op if it already exists."""
        if not self.running:
            raise RuntimeError("Kafka broker is not running")
        self._run_tool(
            TOPIC_TOOL,
            "--bootstrap-server",
            self.bootstrap,
            "--create",
            "--if-not-exists",
            "--topic",
            name,
            "--partitions",
            str(partitions),
            "--replication-factor",
            "1",
        )

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM (controlled shutdown), SIGKILL after timeout_s. Safe to call repeatedly."""
        proc, self._proc = self._proc, None
        atexit.unregister(self.stop)
        if proc is None:
            return
        stop_process(proc, timeout_s)

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def stop_process(proc: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM, then SIGKILL what has not exited within `timeout_s` (a JVM's shutdown hooks get their chance)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def log4j2_config(target: str, log_file: Path) -> str:
    """log4j2 properties: INFO to a file for the broker, WARN to stderr for the CLI tools."""
    if target == "File":
        appender = (f"appender.out.type = File\nappender.out.fileName = {log_file}\n", "INFO")
    else:
        appender = ("appender.out.type = Console\nappender.out.target = SYSTEM_ERR\n", "WARN")
    return (
        "status = warn\n"
        f"{appender[0]}"
        "appender.out.name = OUT\n"
        "appender.out.layout.type = PatternLayout\n"
        "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
        f"rootLogger.level = {appender[1]}\n"
        "rootLogger.appenderRef.out.ref = OUT\n"
    )


# --- clients of a broker (dev, tests, demos): confluent-kafka, imported lazily -----------------------------------


def start_local_broker(work_dir: str, port: int | None = None, timeout_s: float = 120) -> LocalKafka:
    """A LocalKafka under work_dir (jars resolved first), started; stop() it when done."""
    return LocalKafka(resolve_jars(DEFAULT_JARS, DEFAULT_POM), Path(work_dir), port).start(timeout_s=timeout_s)


def create_topics(bootstrap: str, topics: list[str], partitions: int = 1, timeout_s: float = 60) -> None:
    """Create topics that do not exist yet (replication factor 1: the local broker)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    wanted = [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in dict.fromkeys(topics)]
    wanted = [t for t in wanted if t.topic and t.topic not in existing]
    for topic, future in (admin.create_topics(wanted, operation_timeout=timeout_s) if wanted else {}).items():
        try:
            future.result(timeout_s)
        except Exception as err:  # a concurrent creator is fine
            if "TOPIC_ALREADY_EXISTS" not in str(err):
                raise RuntimeError(f"cannot create topic {topic}: {err}") from err
    # Created is not yet served: until each partition has a leader, reads of it fail (NOT_LEADER_FOR_PARTITION).
    deadline = time.monotonic() + timeout_s
    while True:
        served = admin.list_topics(timeout=timeout_s).topics
        waiting = [t for t in dict.fromkeys(topics) if t and not _led(served.get(t))]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics {', '.join(waiting)} have no leader after {timeout_s}s")
        time.sleep(0.1)


def _led(topic) -> bool:
    """Whether a topic's metadata shows it with partitions, each with a leader."""
    return (
        topic is not None
        and topic.error is None
        and bool(topic.partitions)
        and all(p.leader >= 0 for p in topic.partitions.values())
    )


def produce(bootstrap: str, topic: str, values: list, key: str | None = None, timeout_s: float = 60) -> int:
    """Produce values (dicts as JSON, strings as they are) in order and wait for every delivery."""
    from fraudrules.kafka_client import producer, send

    errors: list[str] = []
    p = producer(bootstrap)
    for value in values:
        text = value if isinstance(value, str) else json.dumps(value)
        send(
            p,
            topic,
            text.encode(),
            key.encode() if key else None,
            lambda err, _msg: errors.append(str(err)) if err else None,
        )
        p.poll(0)
    left = p.flush(timeout_s)
    if left or errors:
        raise RuntimeError(f"{left} messages undelivered to {topic}; errors: {errors[:3]}")
    return len(values)


def _reader(bootstrap: str, **extra: object):
    """A confluent-kafka consumer of its own throw-away group that commits nothing (it reads by assignment)."""
    from confluent_kafka import Consumer

    group = f"fraudrules-read-{time.time_ns()}"
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False, **extra})


def _end_offsets(consumer, topic: str, timeout_s: float) -> dict[int, int]:
    from confluent_kafka import TopicPartition

    meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
    if meta.error is not None:
        raise RuntimeError(f"topic {topic}: {meta.error}")
    return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1] for p in meta.partitions}


def end_offsets(bootstrap: str, topic: str, timeout_s: float = 60) -> dict[int, int]:
    """The end offset of each partition of a topic (what a reader has read all of when it gets there)."""
    consumer = _reader(bootstrap)
    try:
        return _end_offsets(consumer, topic, timeout_s)
    finally:
        consumer.close()


def consume_all(bootstrap: str, topic: str, timeout_s: float = 120) -> list:
    """Every message of a topic, all partitions, from the start up to the end offsets at the time of the call."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    consumer = _reader(bootstrap)
    messages = []
    try:
        ends = _end_offsets(consumer, topic, timeout_s)
        todo = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                raise RuntimeError(f"consuming {topic}: {msg.error()}")
            messages.append(msg)
            if msg.offset() + 1 >= ends[msg.partition()]:
                todo.discard(msg.partition())
        if todo:
            raise TimeoutError(f"{topic}: partitions {sorted(todo)} not read to the end in {timeout_s}s")
    finally:
        consumer.close()
    return messages


class TopicTail(threading.Thread):
    """Reads every partition of a topic (created and led: see create_topics) from its beginning as messages arrive,
    until stop(), handing each message and the wall-clock time (ms) it was received to `on_message` (called on this
    thread).

    For latency measurements: the broker answers a fetch as soon as a message is there, and the reader asks again
    at once. A failed read ends the thread with `error` set.
    """

    def __init__(self, bootstrap: str, topic: str, on_message: Callable[[object, int], None], timeout_s: float = 60):
        super().__init__(daemon=True, name=f"kafka-tail-{topic}")
        self.bootstrap, self.topic, self.on_message, self.timeout_s = bootstrap, topic, on_message, timeout_s
        self.read: dict[int, int] = {}  # partition -> next offset to read
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join()

    def caught_up(self, ends: dict[int, int]) -> bool:
        """Whether everything up to `ends` (end_offsets of the topic at some moment) has been read."""
        return all(self.read.get(p, 0) >= end for p, end in ends.items())

    def run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        try:
            consumer = _reader(self.bootstrap, **{"fetch.wait.max.ms": 100})
        except BaseException as err:  # reported through `error`
            self.error = err
            return
        try:
            partitions = consumer.list_topics(self.topic, timeout=self.timeout_s).topics[self.topic].partitions
            consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions])
            while not self._halt.is_set():
                # one message per call: poll returns as soon as one is there, where consume(n, timeout) waits for n
                # messages or its whole timeout (librdkafka's batch call) and would add up to that to each latency
                msg = consumer.poll(0.1)
                if msg is None:
                    continue
                received_ms = int(time.time() * 1000)
                if msg.error():
                    raise RuntimeError(f"consuming {self.topic}: {msg.error()}")
                self.on_message(msg, received_ms)
                self.read[msg.partition()] = msg.offset() + 1
        except BaseException as err:  # reported through `error`
            self.error = err
        finally:
            consumer.close()
