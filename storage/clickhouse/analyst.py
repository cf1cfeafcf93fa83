"""Analyst SQL on ClickHouse: read-only, time-limited and row-capped, like the DuckDB walls.

- ClickHouse's own parser (EXPLAIN AST) must find one statement of a reading kind (SELECT, EXPLAIN,
  DESCRIBE, SHOW); anything else is refused before it runs.
- No table function that reaches files, the network, other databases or programs (`file`, `url`, `s3`,
  `remote`, `mysql`, `executable`, …): only the generators in SAFE_TABLE_FUNCTIONS; found on the AST, so a
  name in a string or a comment is not a call.
- No SETTINGS clause: the limits below are the statement's, and an analyst cannot lift them.
- No output clause (`INTO OUTFILE` in any form, under EXPLAIN too): ClickHouse writes the file itself, and
  `readonly` does not stop it. Found on the statement as the parser formats it, with its string literals and
  quoted names taken out, so `'INTO OUTFILE'` in a string is not a clause.
- Every statement runs with `readonly = 2` (the server refuses writes and DDL), `max_execution_time`
  and `max_result_rows` (overflow: break), and the result is cut at the cap.

On a shared server, give Tailwatch's analyst endpoint a user whose profile fixes the same settings with
constraints and grants only SELECT on Tailwatch's database (docs/scale-out.md): the server then holds the
walls even for a client that is not Tailwatch.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pyarrow as pa
from clickhouse_connect.driver.exceptions import ClickHouseError

from storage.clickhouse.client import ClickHouse
from storage.clickhouse.evaluator import Evaluator, Needs
from storage.export import DATASET_SQL, check_export
from storage.ports import Params, QueryError, QueryResult, Window

READING = ("SelectWithUnionQuery", "Explain", "DescribeQuery", "ShowTables", "ShowColumns", "ShowCreateTableQuery")
# The reading kinds ClickHouse cannot read as a subquery: their result types are taken from the answer itself.
_NOT_SUBQUERIES = ("DescribeQuery", "ShowTables", "ShowColumns", "ShowCreateTableQuery")
SAFE_TABLE_FUNCTIONS = frozenset(
    {"numbers", "numbers_mt", "zeros", "zeros_mt", "values", "generate_series", "generateSeries", "null", "primes",
     "generateRandom", "view"}
)  # fmt: skip
_FUNCTION = re.compile(r"Function (\w+)")
# A string literal or a quoted name in ClickHouse's formatted SQL (backslash escapes, and doubled quotes).
_QUOTED = re.compile(r"'(?:[^'\\]|\\.|'')*'|`(?:[^`\\]|\\.|``)*`|\"(?:[^\"\\]|\\.|\"\")*\"")
# The formatter writes keywords in capitals: an identifier spelled into/outfile is not the clause.
_OUTPUT_CLAUSE = re.compile(r"\bINTO\s+OUTFILE\b")
_ERROR_CODES = {159: "timeout", 164: "read_only", 62: "syntax_error", 60: "unknown_table", 47: "unknown_column",
                46: "unknown_function"}  # fmt: skip


def _query_error(exc: Exception) -> QueryError:
    text = str(exc)
    match = re.search(r"Code: (\d+)", text)
    code = _ERROR_CODES.get(int(match.group(1)), "query_failed") if match else "query_failed"
    return QueryError(code, text.split("Stack trace", maxsplit=1)[0].strip()[:2000])


class ClickHouseAnalyst:
    def __init__(self, client: ClickHouse, evaluator: Evaluator, *, timeout_seconds: float, max_rows: int) -> None:
        self._client = client
        self._evaluator = evaluator
        self.timeout_seconds = timeout_seconds
        self.max_rows = max_rows
        self._table_functions: frozenset[str] | None = None

    def _functions(self) -> frozenset[str]:
        if self._table_functions is None:
            names = self._client.rows("SELECT name FROM system.table_functions")
            self._table_functions = frozenset(r[0] for r in names) - SAFE_TABLE_FUNCTIONS
        return self._table_functions

    def _check(self, sql: str, named: Mapping[str, Any]) -> tuple[str, str]:
        """The statement as ClickHouse's parser reads it (one line, comments gone), once it passes the walls, and
        its kind as the parser names it."""
        if not sql.strip():
            raise QueryError("empty_query", "the statement is empty")
        try:
            [(single,)] = self._client.rows("SELECT formatQuerySingleLine({q:String})", {"q": sql})
        except ClickHouseError as exc:
            if "Multi-statements are not allowed" in str(exc):
                raise QueryError("multiple_statements", "send one statement at a time") from None
            raise _query_error(exc) from None
        try:
            ast = [r[0].strip() for r in self._client.rows(f"EXPLAIN AST {single}", named)]
        except ClickHouseError as exc:
            # A statement the parser reads but EXPLAIN cannot take (SYSTEM, KILL, BACKUP, …) reads nothing.
            if "SYNTAX_ERROR" in str(exc):
                ast = [str(single).split(" ", 1)[0]]
            else:
                raise _query_error(exc) from None
        if not ast or not ast[0].startswith(READING):
            kind = ast[0].split(" ")[0] if ast else "nothing"
            raise QueryError(
                "read_only", f"only SELECT (and EXPLAIN, DESCRIBE, SHOW) statements are allowed; this is {kind}"
            )
        if _OUTPUT_CLAUSE.search(_QUOTED.sub("''", single)):
            raise QueryError(
                "forbidden", "INTO OUTFILE is not allowed: the SQL endpoint returns results, it writes no file"
            )
        if "Set" in ast:
            raise QueryError("forbidden", "a SETTINGS clause is not allowed: the SQL endpoint's limits hold")
        refused = self._functions()
        for line in ast:
            if (m := _FUNCTION.match(line)) and m.group(1) in refused:
                raise QueryError(
                    "forbidden",
                    f"{m.group(1)}() reaches files, the network or other systems: the SQL endpoint refuses it "
                    "(query the tables instead)",
                )
        return str(single), ast[0].split(" ")[0]

    def _settings(self, cap: int | None) -> dict[str, Any]:
        settings: dict[str, Any] = {"readonly": 2, "max_execution_time": self.timeout_seconds}
        if cap is not None:
            settings |= {"max_result_rows": cap + 1, "result_overflow_mode": "break"}
        return settings

    def run(self, sql: str, params: Params = None, *, max_rows: int | None = None) -> QueryResult:
        cap = self.max_rows if max_rows is None else min(max_rows, self.max_rows)
        named = _named(params)
        sql, kind = self._check(sql, named)
        started = time.perf_counter()
        try:
            table = self._client.arrow(sql, named, self._settings(cap))
            if kind in _NOT_SUBQUERIES:
                types = [_type_name(field.type) for field in table.schema]
            else:
                types = [r[1] for r in self._client.rows(f"DESCRIBE TABLE ({sql})", named)]
        except ClickHouseError as exc:
            raise _query_error(exc) from None
        truncated = table.num_rows > cap
        return QueryResult(table.slice(0, cap), truncated, types, time.perf_counter() - started)

    @contextmanager
    def stream(self, sql: str, params: Params = None) -> Iterator[pa.RecordBatchReader]:
        named = _named(params)
        sql, _ = self._check(sql, named)
        try:
            with self._client.stream(sql, named, {"readonly": 2}) as reader:
                yield reader
        except ClickHouseError as exc:
            raise _query_error(exc) from None

    @contextmanager
    def export(self, dataset: str, since: datetime, until: datetime) -> Iterator[pa.RecordBatchReader]:
        check_export(dataset, since, until)
        if dataset == "spans":
            with self._client.stream(
                "SELECT * EXCEPT (_version), toDate(end_time) AS date FROM spans "
                "WHERE end_time >= {s:DateTime64(6)} AND end_time < {u:DateTime64(6)}",
                {"s": since, "u": until},
            ) as reader:
                yield reader
            return
        # The request model's datasets come from its one definition, run where the evaluator runs it.
        with self._evaluator.loaded(self._client, Needs(Window(since, until), engine=True, scores=True)) as source:
            table = source.arrow(DATASET_SQL[dataset].replace("$since", "?").replace("$until", "?"),
                                 [since, until] * DATASET_SQL[dataset].count("$since"))  # fmt: skip
        yield table.to_reader()


def _type_name(arrow_type: pa.DataType) -> str:
    """ClickHouse's name for a column type of a SHOW or DESCRIBE answer (text, counts and flags)."""
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_binary(arrow_type):
        return "String"
    if pa.types.is_integer(arrow_type):
        return f"{'Int' if pa.types.is_signed_integer(arrow_type) else 'UInt'}{arrow_type.bit_width}"
    return str(arrow_type)


def _named(params: Params) -> dict[str, Any]:
    if params is None:
        return {}
    if isinstance(params, Mapping):
        return dict(params)
    raise QueryError(
        "bad_request", "ClickHouse takes named parameters only: write {name:Type} in the SQL and send an object"
    )
