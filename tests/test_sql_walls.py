"""The analyst SQL's function wall: no statement reaches the database's own files (DuckDB lets its file functions
read them even with external access off, so `read_blob` on the database or its WAL handed out raw bytes, rows
retention deleted among them), the network, secrets or the service's state, or runs SQL given as text.

Every table and scalar function of the engine is either refused or reviewed here as harmless: a DuckDB upgrade
that adds one fails this file until someone decides which it is."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from storage.duckdb.analyst import REFUSED_FUNCTIONS, open_file, refused_call
from storage.duckdb.backend import DuckDBStorage
from storage.ports import QueryError

# Reviewed: they compute, or list the catalog, settings and memory; none takes a path or runs text as SQL.
HARMLESS_TABLE_FUNCTIONS = {
    "range", "generate_series", "unnest", "repeat", "repeat_row", "summary", "histogram", "histogram_values",
    "json_each", "json_tree", "icu_calendar_names", "pg_timezone_names", "test_all_types", "test_vector_types",
    "duckdb_approx_database_count", "duckdb_available_metrics", "duckdb_columns", "duckdb_connection_count",
    "duckdb_constraints", "duckdb_coordinate_systems", "duckdb_databases", "duckdb_dependencies", "duckdb_dialects",
    "duckdb_eviction_queues", "duckdb_functions", "duckdb_grammar_extensions", "duckdb_indexes", "duckdb_keywords",
    "duckdb_memory", "duckdb_optimizers", "duckdb_prepared_statements", "duckdb_profiling_settings",
    "duckdb_schemas", "duckdb_sequences", "duckdb_settings", "duckdb_table_sample", "duckdb_tables",
    "duckdb_triggers", "duckdb_types", "duckdb_variables", "duckdb_views", "pragma_collations",
    "pragma_database_size", "pragma_metadata_info", "pragma_platform", "pragma_show", "pragma_storage_info",
    "pragma_table_info", "pragma_user_agent", "pragma_version",
}  # fmt: skip
# Scalar functions whose names suggest files, the environment, logs or SQL, reviewed: they parse strings
# (paths, URLs, serialized SQL) or read settings, and reach nothing.
HARMLESS_SCALARS = {
    "parse_dirpath", "parse_filename", "parse_path", "path_join", "url_decode", "url_encode", "current_setting",
    "current_query", "current_query_id", "in_search_path", "json_serialize_sql", "json_deserialize_sql",
    "json_extract_path", "json_extract_path_text", "parse_duckdb_log_message", "log", "log10", "log2",
    "__internal_json_copy_to_geojson", "__internal_json_copy_to_json", "json_copy_strftime_if_date",
    "json_copy_strftime_if_timestamp", "pg_conf_load_time", "current_catalog",
}  # fmt: skip
SUSPECT_SCALAR = re.compile(r"read|file|env|secret|http|url|path|glob|extension|load|install|attach|query|exec|sql|log")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DuckDBStorage]:
    db = tmp_path_factory.mktemp("walls") / "tailwatch.duckdb"
    storage = DuckDBStorage.open(db)
    yield storage
    storage.close()


def engine_functions(store: DuckDBStorage, kinds: tuple[str, ...]) -> set[str]:
    rows = store.reader.rows(
        "SELECT DISTINCT function_name FROM duckdb_functions() WHERE internal AND function_type IN "
        f"({', '.join('?' for _ in kinds)})",
        list(kinds),
    )
    return {name for (name,) in rows}


def test_every_table_function_of_the_engine_is_refused_or_reviewed(store: DuckDBStorage) -> None:
    functions = engine_functions(store, ("table", "table_macro"))
    unreviewed = {f for f in functions if not REFUSED_FUNCTIONS.fullmatch(f) and f not in HARMLESS_TABLE_FUNCTIONS}
    assert not unreviewed, f"new table functions: refuse them (REFUSED_FUNCTIONS) or review them here: {unreviewed}"
    # The wall covers what it must: every file reader, SQL-from-text and secret function the engine has.
    refused = {f for f in functions if REFUSED_FUNCTIONS.fullmatch(f)}
    assert {"read_blob", "read_text", "read_csv", "read_parquet", "read_json", "read_duckdb", "glob", "query",
            "query_table", "duckdb_secrets", "parquet_metadata", "sniff_csv"} <= refused  # fmt: skip


def test_every_scalar_function_that_might_reach_out_is_refused_or_reviewed(store: DuckDBStorage) -> None:
    scalars = engine_functions(store, ("scalar", "macro", "aggregate"))
    suspects = {f for f in scalars if SUSPECT_SCALAR.search(f)}
    unreviewed = {f for f in suspects if not REFUSED_FUNCTIONS.fullmatch(f) and f not in HARMLESS_SCALARS}
    assert not unreviewed, f"new functions that may reach files or run SQL: {unreviewed}"
    assert "write_log" in suspects and REFUSED_FUNCTIONS.fullmatch("write_log")


def test_every_refused_table_function_is_refused_on_the_databases_own_file(store: DuckDBStorage) -> None:
    db = Path(store.connection.execute("SELECT path FROM duckdb_databases() WHERE NOT internal").fetchone()[0])
    for name in sorted(f for f in engine_functions(store, ("table",)) if REFUSED_FUNCTIONS.fullmatch(f)):
        with pytest.raises(QueryError) as refused:
            store.analyst.run(f"SELECT * FROM {name}('{db}')")
        assert refused.value.code == "forbidden", (name, refused.value.message)


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT size, content FROM read_blob('{db}')",
        "SELECT content FROM read_blob('{db}.wal')",
        "SELECT * FROM read_text('{db}')",
        "SELECT * FROM read_csv('{db}.wal', header = false, columns = {{'line': 'VARCHAR'}})",
        "SELECT * FROM \"READ_BLOB\"('{db}')",
        "SELECT * FROM main.read_blob ('{db}')",
        "SELECT * FROM read_blob/* a comment */('{db}')",
        "SELECT * FROM read_blob -- a comment\n('{db}')",
        "WITH raw AS (SELECT * FROM read_blob('{db}')) SELECT size FROM raw",
        "SELECT count(*) FROM spans WHERE trace_id IN (SELECT filename FROM read_blob('{db}'))",
        "EXPLAIN ANALYZE SELECT * FROM read_blob('{db}')",
        "SELECT * FROM query('SELECT * FROM read_blob(''{db}'')')",
        "SELECT * FROM query_table('spans')",
        "SELECT * FROM read_duckdb('{db}', table_name = 'spans')",
        "SELECT * FROM duckdb_secrets()",
        "SELECT * FROM which_secret('s3://bucket/x', 's3')",
        "SELECT * FROM checkpoint()",
        "SELECT write_log('x')",
        "SELECT * FROM enable_logging()",
    ],
)
def test_no_statement_reads_the_database_files_or_escapes_the_wall(store: DuckDBStorage, statement: str) -> None:
    db = store.connection.execute("SELECT path FROM duckdb_databases() WHERE NOT internal").fetchone()[0]
    with pytest.raises(QueryError) as refused:
        store.analyst.run(statement.format(db=db))
    assert refused.value.code == "forbidden", refused.value.message


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT 'read_blob(x)' AS not_a_call",
        "SELECT 1 AS one -- read_blob('x')",
        "SELECT 'tailwatch.duckdb' GLOB '*.duckdb' AS matches",
        'SELECT 1 AS "read_blob"',
        "SELECT count(*) FROM spans",
        "SELECT * FROM range(3)",
    ],
)
def test_names_that_are_not_calls_are_not_refused(store: DuckDBStorage, statement: str) -> None:
    assert refused_call(statement) is None
    store.analyst.run(statement)


def test_the_wall_holds_on_a_file_opened_read_only(tmp_path: Path) -> None:
    path = tmp_path / "copy.duckdb"
    duckdb.connect(str(path)).close()
    with open_file(path, timeout_seconds=5, max_rows=10) as analyst, pytest.raises(QueryError) as refused:
        analyst.run(f"SELECT content FROM read_blob('{path}')")
    assert refused.value.code == "forbidden"
