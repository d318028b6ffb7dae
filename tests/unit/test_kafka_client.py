"""Sending through librdkafka while its local queue is full (no broker needed: one that is not there)."""

from __future__ import annotations

from fraudrules import kafka_client


def test_send_waits_for_room_in_a_full_queue():
    # a queue of one message, whose delivery to nobody fails after 300 ms and so makes room
    to = kafka_client.producer("127.0.0.1:1", **{"queue.buffering.max.messages": 1, "message.timeout.ms": 300})
    failed: list[bytes] = []

    def delivered(err: object, msg) -> None:
        if err is not None:
            failed.append(msg.value())

    kafka_client.send(to, "t", b"first", on_delivery=delivered)
    kafka_client.send(to, "t", b"second", on_delivery=delivered)  # a plain produce raises BufferError here
    assert failed == [b"first"]
    to.flush(5)
    assert failed == [b"first", b"second"]
