"""A real KRaft broker from Maven Central jars: produce 100 keyed JSON records, read them back in order."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path

import pytest

from tools.support.kafka_broker import DEFAULT_JARS, DEFAULT_POM, LocalKafka, resolve_jars

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("java") is None, reason="needs a JVM"),
]

N = 100


def _produce(bootstrap: str, topic: str, records: list[tuple[str, dict]]) -> None:
    from confluent_kafka import Producer

    errors: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for key, value in records:
        producer.produce(
            topic,
            key=key.encode(),
            value=json.dumps(value).encode(),
            on_delivery=lambda err, _msg: errors.append(str(err)) if err else None,
        )
    assert producer.flush(30) == 0, "messages still in flight after 30s"
    assert errors == []


def _consume(bootstrap: str, topic: str, n: int, timeout_s: float = 60) -> list[tuple[str, dict]]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex[:8]}",  # exercises the group coordinator too
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    got: list[tuple[str, dict]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout_s
        while len(got) < n and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.key().decode(), json.loads(msg.value())))
    finally:
        consumer.close()
    return got


def test_local_kafka_roundtrip(tmp_path: Path) -> None:
    pytest.importorskip("confluent_kafka")
    jars = resolve_jars(Path(os.environ.get("FRAUDRULES_KAFKA_JARS", DEFAULT_JARS)), DEFAULT_POM)
    topic = "txns"
    records = [(f"card-{i % 7}", {"seq": i, "amount": round(i * 1.25, 2)}) for i in range(N)]

    with LocalKafka(jars, tmp_path / "kafka") as kafka:
        assert kafka.bootstrap.startswith("127.0.0.1:")
        kafka.create_topic(topic, partitions=1)  # one partition: total order is defined
        _produce(kafka.bootstrap, topic, records)
        assert _consume(kafka.bootstrap, topic, N) == records
        pid = kafka.pid
        assert pid is not None and kafka.running

    assert not kafka.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    kafka.stop()  # idempotent
