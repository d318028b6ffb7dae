"""`make setup`: the local JVM's class-data archive (see fraudrules.local_runtime), from a backtest of the test
fixtures. The JVM writes the archive when it exits, after this process has closed its end of the gateway."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from pyspark import SparkContext

from fraudrules import cli
from fraudrules.local_runtime import TRAIN_ENV


def main(transactions: str, rules: str) -> int:
    os.environ[TRAIN_ENV] = "1"
    with tempfile.TemporaryDirectory(prefix="fraudrules-archive-") as work:
        args = ["backtest", "--data-dir", work, "--transactions", transactions, "--rules", rules]
        code = cli.main([*args, "--out", os.path.join(work, "alerts.jsonl")])
        gateway = SparkContext._gateway
        if gateway is not None:  # the JVM exits on the end of its stdin, writing the archive first
            gateway.proc.stdin.close()
            gateway.proc.wait()
    return code


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m tools.class_archive", description=__doc__.split("\n\n")[0])
    p.add_argument("--transactions", default="tests/fixtures/transactions.jsonl")
    p.add_argument("--rules", default="tests/fixtures/rules.json")
    a = p.parse_args()
    sys.exit(main(a.transactions, a.rules))
