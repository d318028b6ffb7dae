"""The Great Expectations internals the data-quality sources are built on (`compat/great_expectations.py`): still
there and still what the sources rely on, and a release that moved one fails at import, by name."""

from __future__ import annotations

import subprocess
import sys

import pytest

gx = pytest.importorskip("great_expectations")

from fraudrules.compat import great_expectations as compat  # noqa: E402


def test_the_spark_data_source_the_job_s_subclass_is_still_gx_s_with_what_the_subclass_sets():
    from great_expectations.datasource.fluent import SparkDatasource

    assert issubclass(SparkDatasource, compat.SparkDatasource)  # GX's public Spark source is built on it too
    assert isinstance(compat.SparkDatasource._EXTRA_EXCLUDED_EXEC_ENG_ARGS, set)
    assert compat.DATA_CONNECTOR_NAME == "fluent"
    assert issubclass(compat.DataAsset, compat.pydantic.BaseModel)


def test_a_release_that_moved_one_fails_at_import_naming_it(tmp_path):
    # a file, not `python -c`: PySpark Connect, which GX imports, takes a main module without a file for its doctests
    script = tmp_path / "moved.py"
    script.write_text("""
import great_expectations.datasource.fluent.constants as constants
del constants._DATA_CONNECTOR_NAME  # what a release that moved it looks like to an import
try:
    import fraudrules.ops.gx_sources
except ImportError as err:
    print(type(err).__name__, err)
""")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout
    assert out.startswith(
        "MovedError the data-quality sources are built on Great Expectations 1.24.1 internals; "
        f"great_expectations {gx.__version__} lacks one: cannot import name '_DATA_CONNECTOR_NAME'"
    ), out
