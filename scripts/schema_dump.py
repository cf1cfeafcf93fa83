"""Dump the schema the migrations and the request model build: every table, table macro and view at head.

Called by scripts/schema (docs/ingest.md, Storage). Migrates an in-memory DuckDB database to the newest revision (the
tables, migrations/versions) with its request model (the views and table macros, storage/request_model/duckdb) and
writes what DuckDB's catalog holds, as SQL, to docs/schema.sql; `--check` compares instead and exits 1 with a
unified diff when the file is stale. The output is deterministic: tables, then macros, then views, each in
name order except that a definition comes after the ones it mentions; a table's columns one per line, and a view's
or table macro's result columns listed above it; the statements as DuckDB renders them (its catalog keeps neither
the comments nor the spacing of the SQL it was given), wrapped between words at a fixed width. Replayed into an
empty database, the file builds the same catalog again.

What the catalog does not keep cannot be dumped: a macro parameter's default value. Indexes, sequences, user
types and schemas other than `main` are refused rather than silently left out, until the dump handles them.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import duckdb

from storage.duckdb.database import open_database
from storage.duckdb.migrate import upgrade

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_SQL = ROOT / "docs" / "schema.sql"
WIDTH = 116
INDENT = "    "

_UNSUPPORTED = {
    "indexes": "SELECT index_name FROM duckdb_indexes() WHERE database_name = current_database()",
    "sequences": "SELECT sequence_name FROM duckdb_sequences() WHERE database_name = current_database()",
    "types": "SELECT type_name FROM duckdb_types() WHERE database_name = current_database() AND NOT internal",
    "schemas": (
        "SELECT schema_name FROM duckdb_schemas() "
        "WHERE database_name = current_database() AND schema_name <> 'main' AND NOT internal"
    ),
}
# This database's own objects; temporary ones live in the database `temp` and are left out.
_OURS = "database_name = current_database() AND schema_name = 'main' AND NOT internal"


def _outside_quotes(sql: str) -> list[bool]:
    """Per character: True when it is outside every '...' string and "..." identifier (a doubled quote
    closes and reopens, so escapes need no special case)."""
    mask = []
    quote: str | None = None
    for ch in sql:
        if quote is not None:
            mask.append(False)
            if ch == quote:
                quote = None
        elif ch in "'\"":
            mask.append(False)
            quote = ch
        else:
            mask.append(True)
    return mask


def _words(sql: str) -> Iterator[str]:
    """The statement split at runs of whitespace outside quotes."""
    word: list[str] = []
    for ch, outside in zip(sql, _outside_quotes(sql), strict=True):
        if outside and ch.isspace():
            if word:
                yield "".join(word)
                word = []
        else:
            word.append(ch)
    if word:
        yield "".join(word)


def wrap(sql: str, indent: str = "") -> str:
    """One statement on as few lines of at most WIDTH characters as its words allow."""
    lines: list[str] = []
    line = ""
    for word in _words(sql):
        if not line:
            line = indent + word
        elif len(line) + 1 + len(word) > WIDTH:
            lines.append(line)
            line = indent + INDENT + word
        else:
            line += " " + word
    lines.append(line)
    return "\n".join(lines)


def _split_top_level(sql: str) -> list[str]:
    """The comma-separated items of a list, ignoring commas inside quotes, parentheses and brackets."""
    items, depth, start = [], 0, 0
    for i, (ch, outside) in enumerate(zip(sql, _outside_quotes(sql), strict=True)):
        if not outside:
            continue
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(sql[start:i])
            start = i + 1
    items.append(sql[start:])
    return [item.strip() for item in items]


def _table(sql: str) -> str:
    """CREATE TABLE with one column or constraint per line."""
    outside = _outside_quotes(sql)
    opening = next(i for i, ch in enumerate(sql) if ch == "(" and outside[i])
    closing = max(i for i, ch in enumerate(sql) if ch == ")" and outside[i])
    items = ",\n".join(wrap(item, INDENT) for item in _split_top_level(sql[opening + 1 : closing]))
    return f"{sql[:opening].strip()} (\n{items}\n){sql[closing + 1 :].strip()}"


def dependency_order(definitions: dict[str, str]) -> list[str]:
    """Names in an order where each comes after the others its definition mentions, else alphabetically.

    DuckDB looks up the macros a macro calls when it is created, so a replayed dump needs this order. A name is
    mentioned when it occurs as a whole word; a cycle (a column named like a macro) falls back to the name.
    """
    mentions = {
        name: {other for other in definitions if other != name and re.search(rf"\b{re.escape(other)}\b", text)}
        for name, text in definitions.items()
    }
    order: list[str] = []
    left = sorted(definitions)
    while left:
        ready = [name for name in left if mentions[name] <= set(order)]
        order.append((ready or left)[0])
        left.remove(order[-1])
    return order


def _returns(con: duckdb.DuckDBPyConnection, query: str) -> str:
    rows = con.execute(f"DESCRIBE {query}").fetchall()
    return "\n".join(f"--   {name} {typ}" for name, typ, *_ in rows)


def render(con: duckdb.DuckDBPyConnection) -> str:
    """Every table, macro and view of the connection's database, as SQL in a stable order."""
    for kind, query in _UNSUPPORTED.items():
        found = sorted(str(name) for (name,) in con.execute(query).fetchall())
        if found:
            raise SystemExit(f"schema: the dump does not handle {kind} yet: {', '.join(found)}")
    out = ["-- Tables"]
    for (sql,) in con.execute(f"SELECT sql FROM duckdb_tables() WHERE {_OURS} ORDER BY table_name").fetchall():
        out.append(_table(str(sql)))
    # One order for both: a view reads macros, and a macro may read a view (`spans` is one), and DuckDB
    # binds what a definition mentions when it is created.
    out.append(
        "-- Macros and views, each after what it mentions; a table macro's columns are those it returns when bound"
        "\n-- with NULL for every parameter."
    )
    macros = {
        str(name): (str(kind), [str(p) for p in parameters], str(definition))
        for name, kind, parameters, definition in con.execute(
            "SELECT function_name, function_type, parameters, macro_definition FROM duckdb_functions() "
            f"WHERE {_OURS} AND function_type IN ('macro', 'table_macro')"
        ).fetchall()
    }
    views = con.execute(f"SELECT view_name, sql FROM duckdb_views() WHERE {_OURS}").fetchall()
    view_sql = {str(name): str(sql) for name, sql in views}
    definitions = {name: definition for name, (_, _, definition) in macros.items()} | view_sql
    for name in dependency_order(definitions):
        if name in view_sql:
            out.append(f"-- view {name}:\n{_returns(con, f'SELECT * FROM {name}')}\n{wrap(view_sql[name])}")
            continue
        kind, parameters, definition = macros[name]
        signature = f"{name}({', '.join(parameters)})"
        if kind == "table_macro":
            nulls = ", ".join("NULL" for _ in parameters)
            header = f"-- {signature} returns:\n{_returns(con, f'SELECT * FROM {name}({nulls})')}\n"
            out.append(header + wrap(f"CREATE MACRO {signature} AS TABLE {definition};"))
        else:
            out.append(wrap(f"CREATE MACRO {signature} AS {definition};"))
    return "\n\n".join(out) + "\n"


def generate() -> str:
    """docs/schema.sql as the migrations and the request model build it now."""
    con = open_database(":memory:")
    try:
        upgrade(con)
        (revision,) = con.execute("SELECT version_num FROM alembic_version").fetchone() or ("?",)
        header = (
            f"-- Tailwatch's DuckDB schema at migration head {revision}, as DuckDB's catalog holds it.\n"
            "-- Generated by scripts/schema from a fresh database: do not edit. Tables come from migrations/versions,\n"
            "-- macros and views from storage/request_model/duckdb (each object's COMMENT names its file). Change\n"
            "-- either, then run scripts/schema; `scripts/schema --check` (and tests/test_schema.py) fail while this\n"
            "-- file is stale.\n\n"
        )
        return header + render(con)
    finally:
        con.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/schema", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 with a diff")
    parser.add_argument("path", nargs="?", type=Path, default=SCHEMA_SQL, help="default: docs/schema.sql")
    args = parser.parse_args(argv)
    path: Path = args.path
    fresh = generate()
    if not args.check:
        path.write_text(fresh)
        print(f"schema: wrote {path}")
        return 0
    current = path.read_text() if path.exists() else ""
    if current == fresh:
        return 0
    diff = difflib.unified_diff(
        current.splitlines(keepends=True), fresh.splitlines(keepends=True), f"{path} (committed)", f"{path} (migrated)"
    )
    sys.stdout.writelines(diff)
    print(f"schema: {path} is stale; run scripts/schema to regenerate it", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
