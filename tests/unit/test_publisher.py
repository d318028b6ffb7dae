"""The alerts publisher (engine/publisher.py) with a recording `publish` in place of the Kafka producer: no broker.

What it must keep from a publish inside the micro-batch: batch order, at-least-once across a crash (the outbox
holds a batch's alerts until they are published), and a failed publish failing the query.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from fraudrules.engine.outbox import OUTBOX, Outbox
from fraudrules.engine.publisher import Publisher


def alerts(*ids: str) -> pa.Table:
    return pa.Table.from_pylist([{"alertId": i} for i in ids], schema=OUTBOX["alerts"])


def put(box: Outbox, batch_id: int, table: pa.Table) -> None:
    box.put(batch_id, {"alerts": table})


def test_publishes_in_batch_order_on_its_thread_and_records_its_progress(tmp_path):
    box, seen, threads = Outbox(str(tmp_path)), [], set()
    release = threading.Event()

    def publish(table: pa.Table) -> None:
        release.wait(10)
        threads.add(threading.current_thread().name)
        seen.append(table.column("alertId").to_pylist())

    p = Publisher(publish, box)
    p.submit(0, alerts("1:1", "1:2"))  # returns while the publish waits: the micro-batch is not held up
    assert seen == [] and p.published() == -1
    release.set()
    p.submit(1, alerts())  # no alerts: nothing to write, progress still recorded
    p.submit(2, alerts("2:5"))
    p.close()
    assert seen == [["1:1", "1:2"], ["2:5"]]
    assert p.published() == 2
    assert threads and threading.current_thread().name not in threads


def test_a_failed_publish_fails_the_next_hand_over_and_is_not_recorded(tmp_path):
    box = Outbox(str(tmp_path))

    def publish(table: pa.Table) -> None:
        raise ConnectionError("broker gone")

    p = Publisher(publish, box)
    p.submit(0, alerts("1:1"))
    with pytest.raises(RuntimeError, match="micro-batch 0 to the alerts topic failed") as failed:
        p.submit(1, alerts("1:2"))
    assert isinstance(failed.value.__cause__, ConnectionError)
    with pytest.raises(RuntimeError):
        p.flush()
    assert p.published() == -1


def test_recover_publishes_what_a_crash_left_unpublished_in_order(tmp_path):
    box, seen = Outbox(str(tmp_path)), []
    for b, ids in enumerate([("1:1",), ("1:2",), (), ("1:3", "2:3")]):
        put(box, b, alerts(*ids))
    first = Publisher(lambda t: seen.append(t.column("alertId").to_pylist()), box)
    first.submit(0, box.read(0, "alerts"))
    first.close()  # then the process dies: batches 1-3 are in the outbox, unpublished

    again = Publisher(lambda t: seen.append(t.column("alertId").to_pylist()), box)
    assert again.recover() == 3
    assert seen == [["1:1"], ["1:2"], ["1:3", "2:3"]]
    assert again.published() == 3 and again.recover() == 0


def test_close_ends_a_producer_after_its_last_publish(tmp_path):
    events: list[str] = []

    class Producer:
        def __call__(self, table: pa.Table) -> None:
            events.append("publish")

        def close(self) -> None:
            events.append("close")

    p = Publisher(Producer(), Outbox(str(tmp_path)))
    p.submit(0, alerts("1:1"))
    p.close()
    assert events == ["publish", "close"]


def test_abort_cancels_a_publish_the_broker_does_not_take_and_leaves_it_unpublished(tmp_path):
    """After a failure the stop does not wait out the producer's delivery timeout: the publish in flight is
    cancelled, the batch stays unpublished (the next start publishes it), and a later hand-over is refused."""
    events: list[str] = []
    cancelled = threading.Event()

    class Producer:
        def __call__(self, table: pa.Table) -> None:
            if not cancelled.wait(30):  # a broker that is down: delivery waits for its timeout
                events.append("delivered")
                return
            raise RuntimeError("1 of 1 alerts not delivered to alerts: Local: Purged in queue")

        def cancel(self) -> None:
            events.append("cancel")
            cancelled.set()

        def close(self) -> None:
            events.append("close")

    p = Publisher(Producer(), Outbox(str(tmp_path)))
    p.submit(0, alerts("1:1"))
    started = time.monotonic()
    p.abort(wait_s=0.2)
    assert time.monotonic() - started < 5
    assert events == ["cancel", "close"] and p.published() == -1
    with pytest.raises(RuntimeError, match="micro-batch 0 to the alerts topic failed"):
        p.submit(1, alerts("1:2"))


def test_abort_lets_a_publish_in_flight_finish_within_its_wait(tmp_path):
    events: list[str] = []

    class Producer:
        def __call__(self, table: pa.Table) -> None:
            time.sleep(0.2)
            events.append("publish")

        def cancel(self) -> None:
            events.append("cancel")

        def close(self) -> None:
            events.append("close")

    p = Publisher(Producer(), Outbox(str(tmp_path)))
    p.submit(0, alerts("1:1"))
    p.abort(wait_s=10)
    assert events == ["publish", "close"] and p.published() == 0
    with pytest.raises(RuntimeError, match="micro-batch 1: the publisher stopped after a failure"):
        p.submit(1, alerts("1:2"))
