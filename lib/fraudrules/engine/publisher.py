"""The publisher: a stateful query's alerts to the Kafka alerts topic (`kafka.AlertsProducer`), on a thread of its
own while the next micro-batch runs: the micro-batch does not wait for the broker.

At-least-once, as a publish inside the micro-batch was: a micro-batch's alerts are in the outbox before it ends, and
the committer removes a batch from the outbox only once the publisher has it as well (its `Progress` "kafka",
recorded after each publish). A start publishes again what the outbox holds beyond that (`recover`), then the
queries resume. One publish at a time, in batch order: handing a micro-batch over waits for the previous one's
publish, and raises its error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

import pyarrow as pa

from fraudrules.engine.outbox import OUTBOX, Outbox, Progress

PROGRESS = "kafka"  # the publisher's progress file beside the outbox


class Publisher:
    """Publishes each micro-batch's alert rows (outbox form) with `publish`, in batch order, on one thread."""

    def __init__(self, publish: Callable[[pa.Table], None], outbox: Outbox):
        self.publish, self.outbox = publish, outbox
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="publisher")
        self.lock = threading.Lock()
        self.last: tuple[int, Future] | None = None  # the last batch handed over and its publish
        self.aborted = False

    def submit(self, batch_id: int, alerts: pa.Table) -> None:
        """Publish a micro-batch's alerts once the previous micro-batch's are (raising that publish's error)."""
        self.flush()
        with self.lock:
            if self.aborted:
                raise RuntimeError(f"micro-batch {batch_id}: the publisher stopped after a failure (redone on restart)")
            self.last = batch_id, self.pool.submit(self._publish, batch_id, alerts)

    def flush(self) -> None:
        """Wait for the last publish handed over; raise its error."""
        with self.lock:
            last = self.last
        if last is None:
            return
        batch_id, publish = last
        try:
            publish.result()
        except Exception as err:
            raise RuntimeError(f"publishing the alerts of micro-batch {batch_id} to the alerts topic failed") from err

    def close(self) -> None:
        """Wait for the last publish, then end the thread, and the producer if `publish` is one (`close`)."""
        self.flush()
        self._end()

    def abort(self, wait_s: float) -> None:
        """After a failure: give the publish in flight `wait_s` to finish, then cancel what the producer still holds
        (`cancel`, when `publish` has it) and end the thread and the producer, raising nothing. What is not
        published stays in the outbox: the next start publishes it (`recover`)."""
        with self.lock:
            last, self.aborted = self.last, True
        if last is not None:
            done = wait([last[1]], timeout=wait_s).done
            cancel = getattr(self.publish, "cancel", None)
            while not done and cancel is not None:  # a send still queueing adds messages after a cancel: again
                cancel()
                done = wait([last[1]], timeout=1.0).done
        self._end()

    def _end(self) -> None:
        self.pool.shutdown()
        if close := getattr(self.publish, "close", None):
            close()

    def published(self) -> int:
        """The last batch whose alerts are published (every one before it is), -1 before any."""
        return self.outbox.progress(PROGRESS).committed

    def recover(self) -> int:
        """Publish the outbox's batches that a previous run did not publish, in order: how many."""
        done = self.published()
        batches = [b for b in self.outbox.pending() if b > done]
        for b in batches:
            rows = self.outbox.read(b, "alerts")
            self._publish(b, OUTBOX["alerts"].empty_table() if rows is None else rows)
        return len(batches)

    def _publish(self, batch_id: int, alerts: pa.Table) -> None:
        if alerts.num_rows:
            self.publish(alerts)
        self.outbox.set_progress(PROGRESS, Progress(batch_id, None))
