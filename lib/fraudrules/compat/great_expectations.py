"""Great Expectations internals the job's data sources are built on (`ops/gx_sources.py`).

GX 1.x has no public API for a new kind of data source: the job's subclass GX's Spark data source and build their
batches as GX's own do, from GX modules below its public surface (two of the names are private). They are imported
here only. A GX release that moved one fails at import with an error that names it and the release they were
written against (`GX_RELEASE`), not somewhere inside a validation run; `tests/unit/test_compat_great_expectations.py`
checks what the sources rely on.
"""

from __future__ import annotations

from importlib import metadata

GX_RELEASE = "1.24.1"


class MovedError(ImportError):
    """The installed Great Expectations lacks an internal the data sources are built on."""


try:
    from great_expectations.compatibility import pydantic
    from great_expectations.core import IDDict
    from great_expectations.core.batch import LegacyBatchDefinition
    from great_expectations.core.batch_spec import RuntimeDataBatchSpec
    from great_expectations.datasource.fluent import BatchRequest
    from great_expectations.datasource.fluent.batch_identifier_util import make_batch_identifier
    from great_expectations.datasource.fluent.config_str import ConfigStr
    from great_expectations.datasource.fluent.constants import _DATA_CONNECTOR_NAME as DATA_CONNECTOR_NAME
    from great_expectations.datasource.fluent.interfaces import Batch, DataAsset, TestConnectionError
    from great_expectations.datasource.fluent.spark_datasource import _SparkDatasource as SparkDatasource
except ImportError as err:
    if err.name == "great_expectations":
        raise  # not installed: the `quality` extra is missing, which the callers say
    raise MovedError(
        f"the data-quality sources are built on Great Expectations {GX_RELEASE} internals; "
        f"great_expectations {metadata.version('great_expectations')} lacks one: {err}"
    ) from err

__all__ = [
    "DATA_CONNECTOR_NAME",
    "Batch",
    "BatchRequest",
    "ConfigStr",
    "DataAsset",
    "IDDict",
    "LegacyBatchDefinition",
    "RuntimeDataBatchSpec",
    "SparkDatasource",
    "TestConnectionError",
    "make_batch_identifier",
    "pydantic",
]
