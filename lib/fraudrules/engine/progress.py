"""Live progress of the running queries: one line per micro-batch."""

from __future__ import annotations

from pyspark.sql.streaming import StreamingQueryListener

from fraudrules.engine.sinks import Printer


class ProgressPrinter(StreamingQueryListener):
    def __init__(self, printer: Printer = print):
        self.printer = printer

    def onQueryStarted(self, event) -> None:
        self.printer(f"[{event.name}] started (id {event.id})")

    def onQueryProgress(self, event) -> None:
        p = event.progress
        if p.numInputRows == 0:
            return
        wm = p.eventTime.get("watermark", "-") if p.eventTime else "-"
        self.printer(
            f"[{p.name}] batch {p.batchId}: {p.numInputRows} rows in {p.batchDuration} ms "
            f"({p.processedRowsPerSecond:,.0f} rows/s), watermark {wm}"
        )

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        self.printer(f"[query {event.id}] stopped" + (f": {event.exception}" if event.exception else ""))
