"""`fraudrules` command line: argument parsing over the library (what a cluster or an operator runs).

Arguments are checked before Spark starts: a missing or unreadable input, an invalid rules file, an output that
cannot be written, a data dir without the tables a command reads, missing Spark jars or an invalid value ends the
command at once with a one-line error and exit status 2. Commands that only read never create a table.
"""

from __future__ import annotations

import argparse
import io
import os
import sys

from fraudrules import __version__, logs
from fraudrules.cli.common import Parser, UsageError, common_parent, died, engine_parent, tables_parent
from fraudrules.cli.files import add_backtest, add_export, add_generate
from fraudrules.cli.ops import add_maintain, add_quality, add_status
from fraudrules.cli.rules import add_rules
from fraudrules.cli.run import add_run


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="fraudrules",
        description="Dynamic fraud rules on Spark Structured Streaming + Delta Lake: run the job, backtest rules "
        "over files, manage the rules, export tables, check data quality and health.",
        epilog="`fraudrules COMMAND --help` describes a command. Spark logs only errors unless -v/--verbose "
        f"or {logs.ENV}=WARN|INFO|DEBUG.",
    )
    p.add_argument("--version", action="version", version=f"fraudrules {__version__}")
    common, where, engine = common_parent(), tables_parent(), engine_parent()
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_run(sub, [common, where, engine])
    add_backtest(sub, [common, engine])
    add_export(sub, [common, where])
    add_generate(sub, [common])
    add_rules(sub, [common, where])
    add_quality(sub, [common, where, engine])
    add_maintain(sub, [common, where])
    add_status(sub, [common])
    return p


def main(argv: list[str] | None = None) -> int:
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # progress shows as it happens, also through a pipe
    args = parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        if args.verbose:
            logs.set_verbose()
        try:
            logs.level()
        except ValueError as err:
            raise UsageError(str(err)) from None
        return int(args.func(args) or 0)
    except UsageError as err:
        print(f"fraudrules {args.command}: {err}", file=sys.stderr)
        return 2
    except Exception as err:
        if (why := died(err)) is None:
            raise
        print(f"fraudrules {args.command}: {why}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # no Spark shutdown to run; threads and native libraries still bound to it must not hold the exit
    except KeyboardInterrupt:
        print(f"fraudrules {args.command}: interrupted", file=sys.stderr)
        return 130
