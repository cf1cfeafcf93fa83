"""Analyst SQL: read-only by construction, time-limited, row-capped.

Four layers, none of them a pattern match on the SQL text:
- the database refuses file and network access and further configuration changes for every
  connection once `lock_down` has run (`enable_external_access`, `lock_configuration`): no
  `read_text('/etc/...')`, `COPY ... TO`, `ATTACH 'file'`, `INSTALL`/`LOAD`, `SET`;
- that leaves the database's own files readable (DuckDB allows them): `read_blob` on the database or
  its WAL would hand out raw bytes, rows retention deleted among them. So no statement may call a
  function that reaches files, the network, secrets or the service's state, or that runs SQL given as
  text (REFUSED_FUNCTIONS); calls are found on DuckDB's own tokens, so a name in a string or a comment
  is not a call, and a quoted or qualified name still is;
- every analyst statement runs inside `BEGIN TRANSACTION READ ONLY`, so DuckDB itself refuses any
  write to the database, however it is phrased;
- DuckDB's own parser must find exactly one statement, of a reading type, so transaction control
  (`COMMIT`, `ROLLBACK`), `ATTACH ':memory:'`, `CHECKPOINT` and `PRAGMA`/`SET` never run.

A timer interrupts the statement at its time limit (DuckDB checks for interrupts while it executes),
and results are pulled in record batches and cut at the row cap, so a `SELECT * FROM spans` costs
the cap, not the table.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from storage.duckdb.database import held_by_another_process
from storage.export import DATASET_SQL, check_export
from storage.ports import Params, QueryError, QueryResult

READING = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
# Every table or scalar function of the engine is either here or reviewed as harmless
# (tests/test_sql_walls.py enumerates them and fails on a new one that is neither).
REFUSED_FUNCTIONS = re.compile(
    r"read_\w+|\w+_scan\w*|parquet_\w+|sniff_csv|glob"  # files, whatever their path
    r"|query|query_table|json_execute_serialized_sql"  # SQL given as text escapes every check here
    r"|\w*secret\w*|getenv|duckdb_extensions|duckdb_extension_repositories|duckdb_temporary_files"
    r"|duckdb_external_file_cache|\w*external_resource\w*|python_\w+"
    r"|checkpoint|force_checkpoint|\w+_logging|truncate_duckdb_logs|duckdb_logs\w*|duckdb_log_contexts|write_log"
    r"|\w+_profiling|duckdb_live_query_metrics"  # the service's state and logs, other sessions' queries
    r"|\w+_grammar_extension"  # changes how every connection parses SQL
)
_NAMES = (duckdb.token_type.identifier, duckdb.token_type.keyword)
_BATCH_ROWS = 8192


def lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """Close the database to files, networks and configuration changes, for every connection, for good.

    Run it after migrations and the service's own SETs. The writer is unaffected: it registers Arrow
    data explicitly rather than through Python replacement scans, which this also turns off.
    """
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


class AnalystQueries:
    """Runs analysts' statements on cursors of one connection (the service's, or a read-only file)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, *, timeout_seconds: float, max_rows: int) -> None:
        self._con = con
        self.timeout_seconds = timeout_seconds
        self.max_rows = max_rows

    def run(self, sql: str, params: Params = None, *, max_rows: int | None = None) -> QueryResult:
        """The statement's rows up to the cap (and whether there were more), or a QueryError."""
        cap = self.max_rows if max_rows is None else min(max_rows, self.max_rows)
        started = time.perf_counter()
        with self._statement(sql, params) as (relation, types):
            reader = relation.to_arrow_reader(_BATCH_ROWS)
            batches, rows, truncated = [], 0, False
            for batch in _guarded(reader):
                if rows + batch.num_rows > cap:
                    batches.append(batch.slice(0, cap - rows))
                    truncated = True
                    break
                batches.append(batch)
                rows += batch.num_rows
            table = pa.Table.from_batches(batches, schema=reader.schema)
        return QueryResult(table=table, truncated=truncated, types=types, seconds=time.perf_counter() - started)

    @contextmanager
    def stream(self, sql: str, params: Params = None) -> Iterator[pa.RecordBatchReader]:
        """Every row, as record batches read while the caller consumes them (an export, not a query)."""
        with self._statement(sql, params, timeout=False) as (relation, _types):
            reader = relation.to_arrow_reader(_BATCH_ROWS)
            yield pa.RecordBatchReader.from_batches(reader.schema, _guarded(reader))

    @contextmanager
    def export(self, dataset: str, since: datetime, until: datetime) -> Iterator[pa.RecordBatchReader]:
        """One dataset's rows in [since, until), with its partition columns, streamed."""
        check_export(dataset, since, until)
        with self.stream(DATASET_SQL[dataset], {"since": since, "until": until}) as batches:
            yield batches

    @contextmanager
    def _statement(
        self, sql: str, params: Params, *, timeout: bool = True
    ) -> Iterator[tuple[duckdb.DuckDBPyRelation, list[str]]]:
        cur = self._con.cursor()
        timer = threading.Timer(self.timeout_seconds, cur.interrupt) if timeout else None
        try:
            _check(cur, sql)
            cur.execute("BEGIN TRANSACTION READ ONLY")
            if timer is not None:
                timer.start()
            try:
                relation = cur.sql(sql, params=_params(params))
                if relation is None:  # only statements with results come back as relations
                    raise QueryError("not_a_query", "the statement returned no result")
                yield relation, [str(t) for t in relation.types]
            except duckdb.InterruptException:
                raise QueryError(
                    "timeout", f"the query was cancelled at its time limit of {self.timeout_seconds:g} s"
                ) from None
            except duckdb.Error as exc:
                raise _query_error(exc) from None
        finally:
            if timer is not None:
                timer.cancel()
            cur.close()  # ends the read-only transaction with it


def _guarded(reader: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
    # DuckDB executes while batches are pulled: an interrupt or a failure surfaces here, as Arrow's error.
    try:
        yield from reader
    except pa.ArrowException as exc:
        text = str(exc)
        if "INTERRUPT" in text or "Interrupted" in text:
            raise duckdb.InterruptException(text) from None
        raise duckdb.Error(text) from None


def _check(cur: duckdb.DuckDBPyConnection, sql: str) -> None:
    if not sql.strip():
        raise QueryError("empty_query", "the statement is empty")
    try:
        statements = cur.extract_statements(sql)
    except duckdb.Error as exc:
        raise _query_error(exc) from None
    if len(statements) != 1:
        raise QueryError("multiple_statements", f"send one statement at a time (got {len(statements)})")
    kind = statements[0].type
    if kind not in READING:
        name = kind.name if hasattr(kind, "name") else str(kind)
        raise QueryError("read_only", f"only SELECT (and EXPLAIN) statements are allowed here; this is {name}")
    if (called := refused_call(sql)) is not None:
        raise QueryError(
            "forbidden",
            f"{called}() reaches files, the network, secrets or the service's state, or runs SQL given as text: "
            "the SQL endpoint refuses it (query the tables and views instead)",
        )


def refused_call(sql: str) -> str | None:
    """The first function the statement calls that REFUSED_FUNCTIONS names, or None."""
    tokens = duckdb.tokenize(sql)
    # Each token's text runs to the next token; a comment between a name and its "(" is still a call.
    spans = [(start, end, kind) for (start, kind), (end, _) in itertools.pairwise([*tokens, (len(sql), None)])]
    code = [t for t in spans if t[2] != duckdb.token_type.comment]
    for (start, end, kind), (following, _, _) in itertools.pairwise(code):
        if kind in _NAMES and sql[following] == "(":
            name = sql[start:end].strip().strip('"').lower()
            if REFUSED_FUNCTIONS.fullmatch(name):
                return name
    return None


def _params(params: Params) -> Any:
    if params is None:
        return None
    if isinstance(params, Mapping):
        return dict(params)
    return list(params)


# DuckDB's exception classes name what went wrong; the message carries the detail (position, name).
_CODES: list[tuple[type[duckdb.Error], str]] = [
    (duckdb.ParserException, "syntax_error"),
    (duckdb.BinderException, "invalid_query"),
    (duckdb.CatalogException, "unknown_name"),
    (duckdb.PermissionException, "forbidden"),
    (duckdb.TransactionException, "read_only"),
    (duckdb.OutOfMemoryException, "out_of_memory"),
    (duckdb.ConversionException, "invalid_value"),
    (duckdb.InvalidInputException, "invalid_input"),
]


def _query_error(exc: duckdb.Error) -> QueryError:
    code = next((code for cls, code in _CODES if isinstance(exc, cls)), "query_failed")
    message = str(exc)
    if code == "read_only":
        message = f"the SQL endpoint is read-only: {message}"
    return QueryError(code, message)


@contextmanager
def open_file(path: str | Path, *, timeout_seconds: float, max_rows: int) -> Iterator[AnalystQueries]:
    """Analyst SQL on a database file no process holds, opened read-only under the API's rules."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        con.execute("SET GLOBAL TimeZone = 'UTC'")  # as the service: every cursor reads UTC
        lock_down(con)
        yield AnalystQueries(con, timeout_seconds=timeout_seconds, max_rows=max_rows)
    finally:
        con.close()


def held(path: Path) -> bool:
    """Whether another process holds the database file (DuckDB allows one)."""
    if not path.exists():
        return False
    try:
        duckdb.connect(str(path), read_only=True).close()
    except duckdb.IOException as exc:
        if held_by_another_process(exc):
            return True
        raise
    return False
