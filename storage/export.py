"""Exports for analysts' own tools: what each dataset is, its rows in the request model's SQL, and Parquet
written partitioned by date and tenant.

The same record batches come from the service (streamed over the API) or from the file opened
read-only, and are written here as hive-partitioned Parquet (`date=2026-11-20/tenant_id=acme/...`),
which DuckDB, Polars, pandas and Spark read back with the partition columns restored.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

from storage.span_layout import STORED_ONLY

# Each dataset's rows whose time is in [since, until), with `date` (UTC day of end_time) and
# `tenant_id` as the partition columns; NULL tenants go to tenant_id=__HIVE_DEFAULT_PARTITION__.
# A backend answers them through `AnalystSQL.export`.
DATASETS = ("spans", "requests", "scores")
# Each dataset in the request model's SQL (DuckDB's dialect), with `$since` and `$until`: the DuckDB backend runs
# it on its file, ClickHouse on the request model it evaluates in memory.
DATASET_SQL = {
    # `attributes` and the derived columns as read, not how they are stored (storage/duckdb/stored_attributes.py).
    "spans": f"SELECT * EXCLUDE ({', '.join(STORED_ONLY)}), end_time::DATE AS date FROM spans "
    "WHERE end_time >= $since AND end_time < $until",
    "requests": "SELECT *, end_time::DATE AS date FROM llm_requests_between($since, $until)",
    "scores": """
        SELECT s.*, r.end_time::DATE AS date, r.tenant_id
        FROM llm_request_scores_between($since, $until) AS s
        JOIN llm_requests_between($since, $until) AS r USING (trace_id, span_id)""",
}
PARTITIONING = ds.partitioning(pa.schema([("date", pa.date32()), ("tenant_id", pa.string())]), flavor="hive")


class ExportError(ValueError):
    """An export that cannot be made; the message says why."""


def check_export(dataset: str, since: datetime, until: datetime) -> None:
    """Raise an `ExportError` unless `dataset` is one of DATASETS and [since, until) is not empty."""
    if dataset not in DATASETS:
        raise ExportError(f"unknown dataset {dataset!r}; one of: {', '.join(DATASETS)}")
    if until <= since:
        raise ExportError(f"until ({until.isoformat()}) must be after since ({since.isoformat()})")


def write_partitioned(batches: pa.RecordBatchReader, directory: Path) -> int:
    """Write the batches under `directory` as Parquet partitioned by date and tenant; returns rows written."""
    written = 0

    def counted() -> Iterator[pa.RecordBatch]:
        nonlocal written
        for batch in batches:
            written += batch.num_rows
            yield batch

    directory.mkdir(parents=True, exist_ok=True)
    ds.write_dataset(
        pa.RecordBatchReader.from_batches(batches.schema, counted()),
        directory,
        format="parquet",
        partitioning=PARTITIONING,
        # Files are named by this export: a second export into the same directory replaces the
        # partitions it writes and leaves the others, instead of mixing old and new files.
        basename_template="part-{i}.parquet",
        existing_data_behavior="delete_matching",
    )
    return written
