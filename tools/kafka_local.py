"""The local single-node broker of `tools/support/kafka_broker.py` from the command line: `make kafka`,
`make kafka-jars`, `make run SOURCE=kafka`.

    python -m tools.kafka_local start --work-dir DIR [--port N]      # in the foreground until Ctrl-C
    python -m tools.kafka_local jars                                 # resolve the broker's jars once
    python -m tools.kafka_local with-broker --work-dir DIR -- fraudrules run ...   # around a command
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from tools.support.kafka_broker import (
    DEFAULT_JARS,
    DEFAULT_POM,
    LocalKafka,
    create_topics,
    resolve_jars,
    start_local_broker,
)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def with_broker(work_dir: Path, topics: list[str], command: list[str], timeout_s: float = 120) -> int:
    """Start a broker, create `topics`, run `command --kafka-bootstrap HOST:PORT` to its end, stop the broker.

    `make run SOURCE=kafka` without a bootstrap: the job gets a local broker without knowing where it came from.
    Ctrl-C reaches the command (same terminal process group) and lets it stop cleanly; this only waits for it.
    """
    kafka = start_local_broker(str(work_dir), timeout_s=timeout_s)
    try:
        create_topics(kafka.bootstrap, topics)
        print(f"started a local Kafka broker: bootstrap.servers={kafka.bootstrap} (logs: {kafka.log_file})")
        child = subprocess.Popen([*command, "--kafka-bootstrap", kafka.bootstrap])
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the command handles its own Ctrl-C
        signal.signal(signal.SIGTERM, lambda *_: child.terminate())
        return child.wait()
    finally:
        kafka.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.kafka_local", description="Run a local single-node Kafka broker (KRaft)."
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    start = sub.add_parser("start", help="start a broker in the foreground until Ctrl-C/SIGTERM")
    start.add_argument("--work-dir", type=Path, required=True, help="config, data and logs go here")
    start.add_argument("--port", type=int, default=None, help="PLAINTEXT port (default: a free one)")
    start.add_argument("--jars", type=Path, default=DEFAULT_JARS, help="jar cache dir (env FRAUDRULES_KAFKA_JARS)")
    start.add_argument("--pom", type=Path, default=DEFAULT_POM)
    start.add_argument("--timeout", type=float, default=120, help="start-up timeout in seconds")
    sub.add_parser("jars", help="resolve the broker's jars (once) and print where they are")
    wrap = sub.add_parser("with-broker", help="run a command with a local broker: COMMAND --kafka-bootstrap H:P")
    wrap.add_argument("--work-dir", type=Path, required=True)
    wrap.add_argument("--topics", default="transactions,logins,rules,alerts", help="comma-separated, created first")
    wrap.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command")
    args = parser.parse_args(argv)

    if args.cmd == "jars":
        print("Kafka jars in", resolve_jars(DEFAULT_JARS, DEFAULT_POM))
        return 0
    if args.cmd == "with-broker":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        return with_broker(args.work_dir, [t for t in args.topics.split(",") if t], command)

    jars = resolve_jars(args.jars, args.pom)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    kafka = LocalKafka(jars, args.work_dir, args.port)
    try:
        kafka.start(timeout_s=args.timeout)
        print(
            f"Kafka ready: bootstrap.servers={kafka.bootstrap} (logs: {kafka.log_file}); Ctrl-C stops",
            flush=True,
        )
        while kafka.running:
            time.sleep(0.5)
        print("Kafka broker exited on its own", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        kafka.stop()


if __name__ == "__main__":
    sys.exit(main())
