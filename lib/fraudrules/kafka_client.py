"""librdkafka producers outside Spark: the demo generator's, the alerts producer's sends (`engine/kafka.py`) and
the bench's backlog. No Spark here: the generator imports this module, and the engine never imports the generator.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Producer


def producer(bootstrap: str, **extra: object) -> Producer:
    """An idempotent producer. librdkafka's own log says errors only: its warnings are retries it makes itself (a
    fresh broker's "Coordinator load in progress"), and a message it cannot deliver fails its delivery anyway."""
    config = {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5, "log_level": 3}
    return Producer({**config, **extra})


def send(
    to: Producer,
    topic: str,
    value: bytes,
    key: bytes | None = None,
    on_delivery: Callable[[object, object], None] | None = None,
) -> None:
    """Queue one message, waiting for deliveries to make room while librdkafka's local queue is full (a
    `produce` then raises BufferError instead)."""
    while True:
        try:
            to.produce(topic, value=value, key=key, on_delivery=on_delivery)
            return
        except BufferError:
            to.poll(0.1)
