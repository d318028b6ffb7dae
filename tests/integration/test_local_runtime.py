"""What a local session's JVM and Python workers are launched with (`fraudrules.local_runtime`)."""

from __future__ import annotations

import os

import pytest

from fraudrules.local_runtime import MALLOC_ENV

pytestmark = pytest.mark.spark


def test_the_jvm_and_its_python_workers_return_freed_native_memory(spark):
    """The session's JVM was launched with glibc's fixed mmap threshold, and the Python workers it forks inherit it."""
    ((key, value),) = MALLOC_ENV.items()
    assert spark._jvm.java.lang.System.getenv(key) == value
    seen = spark.sparkContext.parallelize([0], 1).map(lambda _: os.environ.get(key)).collect()
    assert seen == [value]
