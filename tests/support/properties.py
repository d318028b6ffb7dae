"""Settings of the property tests: their full example counts in `make test`, a fifth of them in the quick loop
(`make test-unit` sets FRAUDRULES_QUICK_TESTS=1), which then runs in under a minute."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

QUICK = os.environ.get("FRAUDRULES_QUICK_TESTS") == "1"


def examples(count: int) -> settings:
    """`count` generated cases (a fifth, at least 10, in the quick loop); no deadline: cases run whole engines."""
    return settings(
        max_examples=max(10, count // 5) if QUICK else count,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
