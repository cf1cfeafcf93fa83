"""One home for the schema: docs/schema.sql is what the migrations and the request model build, model/columns.py
agrees with them, the revisions hold tables only, and the request model is applied at head and nowhere else."""

from __future__ import annotations

import ast
import difflib
import importlib.util
import re
import shutil
import sys
from pathlib import Path

import duckdb
import pytest

from model.columns import SCORE_COLUMNS, SPAN_COLUMNS, Column
from storage.duckdb import alembic_scripts
from storage.duckdb.database import open_database
from storage.duckdb.migrate import HEAD, downgrade, upgrade
from storage.request_model import duckdb_files as request_model
from storage.span_layout import SPAN_ROWS

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_SQL = ROOT / "docs" / "schema.sql"
REVISIONS = sorted((ROOT / "migrations" / "versions").glob("0*.py"))

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
    """Migration 0017's way down rebuilds `spans` as a table with 0016's virtual `attributes`, and the request
    model is gone below head: the catalog is then what 0016 built, definition for definition."""
    con = open_database(tmp_path / "down.duckdb")
    upgrade(con, "0016")
    before = schema_dump.render(con)
    upgrade(con)
    assert schema_dump.render(con) != before
    downgrade(con, "0016")
    after = schema_dump.render(con)
    con.close()
    assert after == before


def forbidden_imports(source: str, path: str) -> list[str]:
    """Every import in a revision of importlib or of the migrations package (another revision, or a helper
    revisions share): a revision restates what it needs, so it keeps meaning what it meant when it landed."""
    found = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = ["." * node.level + (node.module or "")]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
            names = ["__import__"]
        else:
            continue
        found += [
            f"{path}:{node.lineno} imports {name}"
            for name in names
            if name.partition(".")[0] in ("importlib", "migrations", "__import__") or name.startswith(".")
        ]
    return found


def test_no_revision_imports_another_or_importlib() -> None:
    assert len(REVISIONS) == int(HEAD)  # every revision read, none missed by the glob
    found = [v for path in REVISIONS for v in forbidden_imports(path.read_text(), path.name)]
    assert not found, "\n".join(found)


def test_the_import_rule_names_each_way_one_revision_reaches_another() -> None:
    source = (
        "import importlib\nfrom alembic import op\nimport sqlalchemy as sa\n"
        "from migrations.versions import x\nfrom . import y\n"
        "def f():\n    return __import__('migrations.versions.0007')\n"
    )
    assert forbidden_imports(source, "0099.py") == [
        "0099.py:1 imports importlib",
        "0099.py:4 imports migrations.versions",
        "0099.py:5 imports .",
        "0099.py:7 imports __import__",
    ]


def views_and_macros(con: duckdb.DuckDBPyConnection) -> list[str]:
    rows = con.execute(
        "SELECT view_name FROM duckdb_views() WHERE database_name = current_database() AND NOT internal "
        "UNION ALL SELECT function_name FROM duckdb_functions() WHERE database_name = current_database() "
        "AND NOT internal AND function_type IN ('macro', 'table_macro') ORDER BY 1"
    ).fetchall()
    return [str(name) for (name,) in rows]


def test_no_revision_creates_a_view_or_a_macro_on_the_way_up_or_down(tmp_path: Path) -> None:
    """The revisions run one at a time, each way, without the request model around them (storage.duckdb.migrate
    applies it after them): after every step the database holds tables only."""
    con = open_database(tmp_path / "revisions.duckdb")
    steps = [path.name[:4] for path in REVISIONS]
    after: dict[str, list[str]] = {}
    for revision in steps:
        alembic_scripts.upgrade(con, revision)
        after[f"up to {revision}"] = views_and_macros(con)
    for revision in [*reversed(steps[:-1]), "base"]:
        alembic_scripts.downgrade(con, revision)
        after[f"down to {revision}"] = views_and_macros(con)
    con.close()
    assert {step: names for step, names in after.items() if names} == {}
    assert len(after) == 2 * len(steps)


def model_objects(con: duckdb.DuckDBPyConnection) -> dict[str, str | None]:
    """Each view and macro of the database with its comment, which names the model's file and digest."""
    rows = con.execute(
        "SELECT view_name, comment FROM duckdb_views() WHERE database_name = current_database() AND NOT internal "
        "UNION ALL SELECT function_name, comment FROM duckdb_functions() WHERE database_name = current_database() "
        "AND NOT internal AND function_type IN ('table_macro', 'macro')"
    ).fetchall()
    return {str(name): comment for name, comment in rows}


def test_the_request_model_exists_at_head_only_and_comes_back_with_it(tmp_path: Path) -> None:
    con = open_database(tmp_path / "model.duckdb")
    upgrade(con)
    model = request_model.read(con)
    at_head = model_objects(con)
    home = f"request model {model.digest}: storage/request_model/duckdb"
    assert at_head == {d.name: f"{home}/{d.file}" for d in model.definitions}
    assert at_head["llm_requests"] == f"{home}/40_requests.sql"
    assert len(at_head) == 30
    # Below head the tables are not those the model reads: a file there holds none of it.
    downgrade(con, "0020")
    assert model_objects(con) == {}
    upgrade(con)
    assert model_objects(con) == at_head
    con.close()


def test_a_file_at_head_holding_this_model_opens_without_writing(tmp_path: Path) -> None:
    """Applying binds every definition, seconds at a start: a file that holds this very model is left as it is."""
    path = tmp_path / "model.duckdb"
    con = open_database(path)
    upgrade(con)
    con.execute("CHECKPOINT")
    con.close()
    con = open_database(path)
    upgrade(con)
    wal = path.with_name(path.name + ".wal")
    written = wal.stat().st_size if wal.exists() else 0
    con.close()
    assert written == 0


def test_a_view_replaced_by_hand_is_applied_again_at_the_next_open(tmp_path: Path) -> None:
    con = open_database(tmp_path / "model.duckdb")
    upgrade(con)
    before = model_objects(con)
    count = "SELECT count(*) FROM llm_requests"
    con.execute("CREATE OR REPLACE VIEW llm_requests AS SELECT 1 AS trace_id FROM range(7)")
    assert con.execute(count).fetchall() == [(7,)]
    upgrade(con)
    assert con.execute(count).fetchall() == [(0,)]
    assert model_objects(con) == before
    con.close()


def test_a_changed_model_file_is_applied_without_a_migration_and_what_it_no_longer_defines_is_dropped(
    tmp_path: Path,
) -> None:
    """What a start does with a file at head when the model's SQL changed (storage.duckdb.migrate's fast path
    runs `ensure` on the shipped files): the new definitions replace the old, one the files no longer hold goes."""
    con = open_database(tmp_path / "model.duckdb")
    upgrade(con)
    changed = tmp_path / "model"
    shutil.copytree(request_model.DIRECTORY, changed)
    (changed / "80_slo_status.sql").unlink()
    (changed / "90_probe.sql").write_text(
        "-- A view only this copy of the model defines.\nCREATE OR REPLACE VIEW probe AS SELECT 42 AS answer;\n"
    )
    assert request_model.ensure(con, changed) is True
    assert con.execute("SELECT answer FROM probe").fetchall() == [(42,)]
    objects = model_objects(con)
    assert "slo_status" not in objects
    digest = request_model.read(con, changed).digest
    assert objects["probe"] == f"request model {digest}: storage/request_model/duckdb/90_probe.sql"
    assert request_model.ensure(con, changed) is False  # applied once: the next start finds it current
    # Back to the shipped files, as a start of the shipped version would: the probe goes, slo_status returns.
    upgrade(con)
    objects = model_objects(con)
    assert "probe" not in objects and "slo_status" in objects
    con.close()


def test_a_model_file_holds_only_create_or_replace_views_and_macros(tmp_path: Path) -> None:
    """Re-applied at every start that finds it changed, a statement must replace what it defines, and name it."""
    con = duckdb.connect()
    for statement in ("CREATE VIEW v AS SELECT 1;", "CREATE MACRO m(a) AS a + 1;", "DROP VIEW v;",
                      "CREATE OR REPLACE TABLE t AS SELECT 1;"):  # fmt: skip
        (tmp_path / "10_bad.sql").write_text(f"-- why\n{statement}\n")
        with pytest.raises(ValueError, match=r"10_bad\.sql: not CREATE OR REPLACE VIEW"):
            request_model.read(con, tmp_path)
    (tmp_path / "10_bad.sql").write_text("CREATE OR REPLACE VIEW v AS SELECT 1;\n")
    (tmp_path / "20_again.sql").write_text("CREATE OR REPLACE VIEW v AS SELECT 2;\n")
    with pytest.raises(ValueError, match="defined more than once: v"):
        request_model.read(con, tmp_path)
    con.close()
