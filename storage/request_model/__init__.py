"""The request model, stated once per backend's SQL and kept side by side.

What a request is (client and server spans of one request counted once, attempts, engine facts joined by
replica and time, settled reads) and everything read through it (the `spans` view, scores, traffic patterns,
the analyst views):
- `duckdb/*.sql`: the DuckDB views and table macros, one readable file per subject, applied in name order
  whenever a database is brought to its head revision (`duckdb_files`, called by storage.duckdb.migrate);
- `clickhouse.py`: the settled model restated in ClickHouse's SQL, for request summaries computed in
  ClickHouse (tests/test_clickhouse.py holds it to the DuckDB statement).

The migrations (migrations/versions) hold the tables and the data moves; none defines a view or a macro.
"""
