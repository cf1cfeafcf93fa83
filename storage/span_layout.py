"""How the migrated schema lays out `spans`: the table rows are stored in, and the columns only that storage has.

The migrations build it for DuckDB, and the ClickHouse schema is read from a DuckDB migrated in memory: both
backends derive their tables from this layout, so it is stated here rather than in either.
"""

from __future__ import annotations

from model.columns import DERIVED, MOVED
from model.derived_columns import DURATION_REM

# The physical columns behind `spans.attributes` (storage/duckdb/stored_attributes.py): DuckDB's own storage,
# not part of the request model another backend stores.
STORED_ONLY = ("attributes_rest", MOVED.name, DERIVED.name, DURATION_REM)
# The table `spans` is a view of, and what writes go to. Not a virtual column of one table: DuckDB
# evaluates a virtual column on every INSERT to check it, nearly half the cost of inserting a span.
SPAN_ROWS = "span_rows"
