"""One home for the schema: docs/schema.sql is what the migrations build, and model/columns.py agrees with them."""

from __future__ import annotations

import difflib
import importlib.util
import re
import sys
from pathlib import Path

import duckdb
import pytest

from model.columns import SCORE_COLUMNS, SPAN_COLUMNS, Column
from storage.duckdb.database import open_database
from storage.duckdb.migrate import downgrade, upgrade
from storage.duckdb.stored_attributes import SPAN_ROWS

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_SQL = ROOT / "docs" / "schema.sql"

_PATH = ROOT / "scripts" / "schema_dump.py"
_spec = importlib.util.spec_from_file_location("schema_dump_script", _PATH)
assert _spec is not None and _spec.loader is not None
schema_dump = importlib.util.module_from_spec(_spec)
sys.modules["schema_dump_script"] = schema_dump
_spec.loader.exec_module(schema_dump)

MODEL = {"spans": SPAN_COLUMNS, "span_scores": SCORE_COLUMNS}


def test_docs_schema_sql_is_what_the_migrations_build(tmp_path: Path) -> None:
    fresh = tmp_path / "schema.sql"
    assert schema_dump.main([str(fresh)]) == 0
    committed, regenerated = SCHEMA_SQL.read_text(), fresh.read_text()
    diff = "".join(
        difflib.unified_diff(committed.splitlines(True), regenerated.splitlines(True), "committed", "migrated")
    )
    assert committed == regenerated, f"docs/schema.sql is stale; run scripts/schema:\n{diff}"


def test_check_passes_on_the_committed_dump_and_fails_with_a_diff_on_a_stale_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert schema_dump.main(["--check"]) == 0
    assert capsys.readouterr().out == ""

    stale = tmp_path / "schema.sql"
    stale.write_text(SCHEMA_SQL.read_text().replace("    queue_depth BIGINT,", "    queue_depth DOUBLE,", 1))
    assert schema_dump.main(["--check", str(stale)]) == 1
    captured = capsys.readouterr()
    assert "-    queue_depth DOUBLE,\n+    queue_depth BIGINT,\n" in captured.out
    assert "is stale; run scripts/schema" in captured.err
    assert schema_dump.main(["--check", str(tmp_path / "missing.sql")]) == 1


def test_the_dump_replayed_into_an_empty_database_builds_the_same_schema() -> None:
    # Nothing the catalog holds is left out of the dump, and its wrapping and ordering keep it valid SQL.
    con = duckdb.connect()
    con.execute(SCHEMA_SQL.read_text())
    assert SCHEMA_SQL.read_text().endswith(schema_dump.render(con))
    con.close()


def test_dependency_order_puts_a_definition_after_what_it_mentions() -> None:
    order = schema_dump.dependency_order({"a_between": "FROM z_between(t0)", "z_between": "FROM spans", "b": "x"})
    assert order == ["b", "z_between", "a_between"]
    # A cycle falls back to name order instead of looping.
    assert schema_dump.dependency_order({"p": "q", "q": "p"}) == ["p", "q"]


def test_wrap_never_breaks_inside_a_string_or_a_quoted_name() -> None:
    sql = "SELECT " + ", ".join(f"'a b c {i}' AS \"x y {i}\"" for i in range(30)) + " FROM t;"
    wrapped = schema_dump.wrap(sql)
    assert all(len(line) <= schema_dump.WIDTH for line in wrapped.splitlines())
    con = duckdb.connect()
    con.execute("CREATE TABLE t (i INTEGER)")
    con.execute("INSERT INTO t VALUES (1)")
    assert con.execute(wrapped).fetchall() == con.execute(sql).fetchall()
    con.close()


@pytest.mark.parametrize("table", sorted(MODEL))
def test_the_model_is_the_migrated_table(table: str, tmp_path: Path) -> None:
    """Every canonical column of model/columns.py is a column of the table with the same type and NOT NULL,
    and the table has no other column."""
    con = open_database(tmp_path / "schema.duckdb")
    upgrade(con)

    def columns(name: str) -> list[tuple[str, str, bool]]:
        return con.execute(
            "SELECT column_name, data_type, is_nullable FROM duckdb_columns() "
            "WHERE database_name = current_database() AND schema_name = 'main' AND table_name = ?",
            [name],
        ).fetchall()

    rows = columns(table)
    # `spans` is a view, whose columns DuckDB calls nullable: NOT NULL is the stored rows' (`attributes`,
    # computed by the view, is nullable as in the model).
    nullable = {name: null for name, _, null in columns(SPAN_ROWS if table == "spans" else table)}
    if table == "spans":
        # Stored NULL where the view reads it from the times (tests/test_derived_columns.py: never NULL read).
        nullable["duration_ms"] = False
    con.close()
    migrated = {name: (typ, not nullable.get(name, True)) for name, typ, _ in rows}
    model = {c.name: (c.sql_type, c.required) for c in MODEL[table]}
    assert model == migrated


def _reference_rows(table: str) -> dict[str, tuple[str, str]]:
    """(type, unit) of every column docs/sql.md lists under the table's heading."""
    text = (ROOT / "docs" / "sql.md").read_text()
    section = text.split(f"\n### `{table}`\n", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \| ([^|]+) \|", section, flags=re.MULTILINE)
    return {name: (typ.strip(), unit.strip()) for name, typ, unit in rows}


@pytest.mark.parametrize("table", sorted(MODEL))
def test_the_model_has_the_units_the_analysts_reference_gives(table: str) -> None:
    def unit(column: Column) -> str:
        return column.unit or "—"

    assert {c.name: (c.sql_type, unit(c)) for c in MODEL[table]} == _reference_rows(table)


def test_downgrading_the_spans_view_gives_back_the_schema_0016_built(tmp_path: Path) -> None:
    """Migration 0017's way down rebuilds `spans` as a table with its virtual `attributes` and points the
    settling macro back at it: the catalog is then what 0016 built, definition for definition."""
    con = open_database(tmp_path / "down.duckdb")
    upgrade(con, "0016")
    before = schema_dump.render(con)
    upgrade(con)
    assert schema_dump.render(con) != before
    downgrade(con, "0016")
    after = schema_dump.render(con)
    con.close()
    assert after == before
