"""Make the upgrade fixture again: a data dir left by a released commit's job, killed mid-run with micro-batches in
its outbox, packed as `tests/fixtures/upgrade-<commit>.tar.gz` (the harness is `tools/support/upgrade.py`; the test
that resumes it is `tests/e2e/test_upgrade.py`).

    .venv/bin/python -m tools.upgrade_fixture                  # the commit the test names (upgrade.COMMIT)
    .venv/bin/python -m tools.upgrade_fixture --commit v1.2.0  # a newer release: then set upgrade.COMMIT to it
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tools.support import upgrade


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.upgrade_fixture", description=__doc__.split("\n\n")[0])
    p.add_argument("--commit", default=upgrade.COMMIT, help="the released commit whose job writes the data dir")
    p.add_argument("--out", type=Path, help="default tests/fixtures/upgrade-<commit>.tar.gz")
    a = p.parse_args(argv)
    out = a.out or upgrade.FIXTURE.with_name(f"upgrade-{a.commit}.tar.gz")
    print(json.dumps({"out": str(out), **upgrade.make(a.commit, out)}))
    return 0


if __name__ == "__main__":
    sys.exit(cli())
