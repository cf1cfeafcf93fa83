"""The analysts' SQL reference cannot fall behind the schema: every table, view, column and table macro is in it."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "sql.md"
REFERENCE = "## Reference"
MACROS = "Table macros"
COLUMN_HEADER = ["column", "type", "unit", "meaning"]
MACRO_HEADER = ["macro", "returns"]
SKIPPED = {"alembic_version"}


def objects(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every table and view of schema main that analysts see."""
    rows = con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' ORDER BY table_name"
    ).fetchall()
    return [name for (name,) in rows if name not in SKIPPED]


def columns(con: duckdb.DuckDBPyConnection, name: str) -> list[tuple[str, str]]:
    """(column, type) of a table or view, in DESCRIBE order."""
    return [(str(row[0]), str(row[1])) for row in con.execute(f'DESCRIBE "{name}"').fetchall()]


def table_macros(con: duckdb.DuckDBPyConnection) -> dict[str, list[str]]:
    """The table macros a migrated database holds (the request model's), with their parameters.

    DuckDB lists its own built-in table macros (`histogram`, ...) under schema main too; they live in the
    `system` database, so only this database's macros are kept.
    """
    rows = con.execute(
        "SELECT function_name, parameters FROM duckdb_functions() "
        "WHERE function_type = 'table_macro' AND schema_name = 'main' AND database_name = current_database()"
    ).fetchall()
    return {str(name): [str(p) for p in params] for name, params in rows}


def reference_sections(text: str) -> dict[str, list[str]]:
    """The lines under each `### ` heading of the Reference section, by heading text without backticks."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    in_reference = in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif in_code:
            pass
        elif line.startswith("## "):
            in_reference = line.strip() == REFERENCE
            current = None
            continue
        elif in_reference and line.startswith("### "):
            name = line.removeprefix("### ").strip().replace("`", "")
            assert name not in sections, f"docs/sql.md documents {name!r} twice"
            current = sections[name] = []
            continue
        if in_reference and current is not None:
            current.append(line)
    return sections


def table_rows(lines: list[str]) -> list[list[str]]:
    """The cells of the first markdown table in `lines`, header row first, separator row dropped."""
    rows: list[list[str]] = []
    for line in lines:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not all(set(cell) <= set("-: ") for cell in cells):
                rows.append(cells)
        elif rows:
            break
    return rows


def name_cell(cell: str) -> str:
    return cell.replace("`", "").strip()


@pytest.fixture
def sections() -> dict[str, list[str]]:
    text = DOC.read_text()
    assert REFERENCE in text.splitlines(), f"docs/sql.md has no {REFERENCE!r} section"
    return reference_sections(text)


def test_every_table_and_view_is_documented_with_every_column(
    con: duckdb.DuckDBPyConnection, sections: dict[str, list[str]]
) -> None:
    names = objects(con)
    assert names
    for name in names:
        assert name in sections, f"docs/sql.md has no '### {name}' heading in its Reference section"
        rows = table_rows(sections[name])
        assert rows, f"'### {name}' in docs/sql.md has no column table"
        assert [c.lower() for c in rows[0]] == COLUMN_HEADER, f"{name}: the table header must be {COLUMN_HEADER}"
        documented = [name_cell(row[0]) for row in rows[1:]]
        expected = [column for column, _type in columns(con, name)]
        missing = [c for c in expected if c not in documented]
        assert not missing, f"{name}: columns missing from docs/sql.md: {', '.join(missing)}"
        extra = [c for c in documented if c not in expected]
        assert not extra, f"{name}: docs/sql.md lists columns that do not exist: {', '.join(extra)}"
        assert documented == expected, f"{name}: docs/sql.md lists the columns out of DESCRIBE order: {expected}"


def test_documented_column_types_match_the_database(
    con: duckdb.DuckDBPyConnection, sections: dict[str, list[str]]
) -> None:
    for name in objects(con):
        rows = table_rows(sections.get(name, []))[1:]
        documented = {name_cell(row[0]): row[1] if len(row) > 1 else "" for row in rows}
        for column, column_type in columns(con, name):
            if column in documented:
                assert documented[column] == column_type, (
                    f"{name}.{column}: docs/sql.md says {documented[column]!r}, the database has {column_type!r}"
                )


def test_every_table_macro_is_in_the_table_macros_section(
    con: duckdb.DuckDBPyConnection, sections: dict[str, list[str]]
) -> None:
    macros = table_macros(con)
    assert macros
    assert MACROS in sections, f"docs/sql.md has no '### {MACROS}' heading in its Reference section"
    rows = table_rows(sections[MACROS])
    assert rows, f"'### {MACROS}' in docs/sql.md has no table"
    assert [c.lower() for c in rows[0]] == MACRO_HEADER, f"{MACROS}: the table header must be {MACRO_HEADER}"
    documented = {name_cell(row[0]).split("(")[0].strip(): name_cell(row[0]) for row in rows[1:]}
    for macro, params in macros.items():
        assert macro in documented, f"table macro {macro} is not in the '{MACROS}' section of docs/sql.md"
        signature = f"{macro}({', '.join(params)})"
        assert documented[macro] == signature, f"docs/sql.md names {documented[macro]!r}, the macro is {signature!r}"


def test_the_reference_documents_nothing_that_does_not_exist(
    con: duckdb.DuckDBPyConnection, sections: dict[str, list[str]]
) -> None:
    stale = sorted(set(sections) - set(objects(con)) - {MACROS})
    assert not stale, f"docs/sql.md documents tables or views that do not exist: {', '.join(stale)}"
    rows = table_rows(sections.get(MACROS, []))[1:]
    stale_macros = sorted({name_cell(row[0]).split("(")[0].strip() for row in rows} - set(table_macros(con)))
    assert not stale_macros, f"docs/sql.md documents table macros that do not exist: {', '.join(stale_macros)}"
