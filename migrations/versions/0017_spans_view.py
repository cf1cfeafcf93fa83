"""`spans` becomes a view over the stored rows, `span_rows`, and `attributes` an expression of the view.

As a virtual column of the table, `attributes` was evaluated by DuckDB on every INSERT to check it could
be, even though it is never stored: measured, that check was nearly half the cost of inserting a span
(13 µs a span against 7 without it, docs/benchmarks.md). A view computes it only when a query reads it.
Analysts see the same `spans`, columns in the same order; the writer, retention and the engine-fact
settling write `span_rows`. The macro that finds unsettled spans by row id reads `span_rows`, whose rows
have ids (a view's do not).

No row is copied on the way up. The way down rebuilds the table (free space for a second copy).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-24
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_GENERATED = "attributes JSON GENERATED ALWAYS AS("
_NEXT = ', "resource" JSON'  # the column after `attributes`, as DuckDB writes the table back
_MACRO = "span_engine_facts_between"


def _one(sql: str) -> str:
    rows = op.get_bind().exec_driver_sql(sql).fetchall()
    if len(rows) != 1:
        raise RuntimeError(f"expected one row from {sql!r}, got {len(rows)}")
    return str(rows[0][0])


def _columns(table: str) -> list[str]:
    rows = op.get_bind().exec_driver_sql(
        f"SELECT column_name FROM duckdb_columns() WHERE table_name = '{table}' ORDER BY column_index"
    )
    return [name for (name,) in rows.fetchall()]


def _between(text: str, start: str, end: str) -> str:
    if start not in text or end not in text[text.index(start) + len(start) :]:
        raise RuntimeError(f"not defined as expected: {start!r} … {end!r} not found in {text[:200]!r}…")
    begin = text.index(start) + len(start)
    return text[begin : text.index(end, begin)]


def _quoted(column: str) -> str:
    return f'"{column}"'


def _rebind_macro(source: str, target: str) -> None:
    """Point the settling macro's `FROM <source>` at `target` (it is the macro's only read of spans)."""
    definition = _one(f"SELECT macro_definition FROM duckdb_functions() WHERE function_name = '{_MACRO}'")
    before, after = f" FROM {source} WHERE ", f" FROM {target} WHERE "
    if definition.count(before) != 1:
        raise RuntimeError(f"{_MACRO} is not defined as expected: {before!r} is not in it once")
    op.get_bind().exec_driver_sql(
        f"CREATE OR REPLACE MACRO {_MACRO}(t0, t1) AS TABLE {definition.replace(before, after, 1)}"
    )


def upgrade() -> None:
    definition = _one("SELECT sql FROM duckdb_tables() WHERE table_name = 'spans'")
    expression = _between(definition, _GENERATED, _NEXT)[:-1]  # without the closing parenthesis
    columns = _columns("spans")
    op.execute("ALTER TABLE spans DROP COLUMN attributes")
    op.execute("ALTER TABLE spans RENAME TO span_rows")
    select = ", ".join(f"({expression}) AS attributes" if c == "attributes" else _quoted(c) for c in columns)
    # Straight to DuckDB: SQLAlchemy would read the JSON text's `":` as the start of a bind parameter.
    op.get_bind().exec_driver_sql(f"CREATE VIEW spans AS SELECT {select} FROM span_rows")
    _rebind_macro("spans", "span_rows")


def downgrade() -> None:
    view = _one("SELECT sql FROM duckdb_views() WHERE view_name = 'spans'")
    expression = _between(view, "finish_reason, ", " AS attributes, ")
    stored = _columns("span_rows")
    table = _one("SELECT sql FROM duckdb_tables() WHERE table_name = 'span_rows'")
    rebuilt = table.replace("CREATE TABLE span_rows(", "CREATE TABLE spans(", 1)
    anchor = _NEXT.removeprefix(", ")
    if anchor not in rebuilt:
        raise RuntimeError(f"span_rows is not defined as expected: {anchor!r} not found")
    rebuilt = rebuilt.replace(anchor, f"{_GENERATED}{expression}), {anchor}", 1)
    names = ", ".join(_quoted(c) for c in stored)
    op.execute("DROP VIEW spans")
    op.get_bind().exec_driver_sql(rebuilt)
    op.execute(f"INSERT INTO spans ({names}) SELECT {names} FROM span_rows")
    _rebind_macro("span_rows", "spans")
    op.execute("DROP TABLE span_rows")
