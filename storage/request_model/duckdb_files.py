"""The request model's DuckDB statement: the SQL files in `duckdb/`, and bringing a database to them.

Every statement of a file is `CREATE OR REPLACE VIEW name` or `CREATE OR REPLACE MACRO name(...)` (a table
macro, or a scalar one: an expression the model uses in more than one place), and
the files apply in name order: DuckDB binds what a view or macro mentions when it is created, so a file comes
after those it reads. storage.duckdb.migrate applies them when it leaves a database at its head revision and drops
them before a migration runs, so the definitions exist exactly when the tables are those they were written for.

Applying costs seconds (DuckDB binds each definition, and the views bind the whole model beneath them), so a
database already at head is left as it is when it holds this very SQL: each object's comment names its file
and a digest of all the files, written in the transaction that applies them all, and a start compares the
views' comments with the files, in about a millisecond (the macros' would take forty: DuckDB lists them among
its thousands of built-in functions). A changed file, or a view replaced or dropped by hand, is applied
again at the next start, with no migration.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import duckdb

DIRECTORY = Path(__file__).parent / "duckdb"
_HOME = "storage/request_model/duckdb"
# What marks an object as the model's, in its comment: an object a later model no longer defines is found by it.
_MARK = "request model "
_CREATE = re.compile(r"CREATE OR REPLACE (?:VIEW (\w+) AS\b|MACRO (\w+)\([^)]*\) AS( TABLE)?\b)")
_OURS = "database_name = current_database() AND schema_name = 'main' AND NOT internal"


@dataclass(frozen=True)
class Definition:
    name: str
    kind: str  # "VIEW", "MACRO TABLE" or "MACRO" (a scalar macro), as DROP and COMMENT ON spell it
    file: str
    sql: str


@dataclass(frozen=True)
class Model:
    definitions: tuple[Definition, ...]
    digest: str

    def comment(self, definition: Definition) -> str:
        return f"{_MARK}{self.digest}: {_HOME}/{definition.file}"


_PARSED: dict[str, Model] = {}  # by digest


def _statement_start(sql: str) -> str:
    """The statement without the comment lines and blank lines above it."""
    lines = sql.splitlines()
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
        lines.pop(0)
    return "\n".join(lines)


def _definition(file: str, sql: str) -> Definition:
    found = _CREATE.match(_statement_start(sql))
    if found is None:
        first = _statement_start(sql).partition("\n")[0]
        raise ValueError(f"{file}: not CREATE OR REPLACE VIEW or CREATE OR REPLACE MACRO: {first!r}")
    view, macro, table = found.groups()
    return Definition(view or macro, "VIEW" if view else "MACRO TABLE" if table else "MACRO", file, sql)


def read(con: duckdb.DuckDBPyConnection, directory: Path = DIRECTORY) -> Model:
    """The model as the files in `directory` state it, in the order they apply."""
    texts = [(path.name, path.read_text()) for path in sorted(directory.glob("*.sql"))]
    digest = hashlib.sha256(b"".join(f"{name}\0{text}\0".encode() for name, text in texts)).hexdigest()[:16]
    if digest not in _PARSED:  # parsing takes tens of milliseconds: once a process
        # DuckDB's own parser splits the statements: a `;` inside a string or a comment is not an end.
        definitions = [_definition(name, s.query) for name, text in texts for s in con.extract_statements(text)]
        names = [d.name for d in definitions]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"{directory}: defined more than once: {', '.join(twice)}")
        _PARSED[digest] = Model(tuple(definitions), digest)
    return _PARSED[digest]


def _held(con: duckdb.DuckDBPyConnection, model: Model, *, macros: bool) -> dict[str, tuple[str, str | None]]:
    """(kind, comment) of each view (and table macro) the database holds that is the model's, by name or mark."""
    query = f"SELECT view_name, 'VIEW', comment FROM duckdb_views() WHERE {_OURS}"
    if macros:
        query += (
            " UNION ALL SELECT function_name, CASE function_type WHEN 'macro' THEN 'MACRO' ELSE 'MACRO TABLE' END, "
            f"comment FROM duckdb_functions() WHERE {_OURS} AND function_type IN ('table_macro', 'macro')"
        )
    names = {d.name for d in model.definitions}
    return {
        str(name): (str(kind), comment)
        for name, kind, comment in con.execute(query).fetchall()
        if name in names or (comment is not None and str(comment).startswith(_MARK))
    }


def is_current(con: duckdb.DuckDBPyConnection, model: Model) -> bool:
    """Whether the views the database holds are exactly the model's, applied from these files."""
    held = {name: comment for name, (_, comment) in _held(con, model, macros=False).items()}
    return held == {d.name: model.comment(d) for d in model.definitions if d.kind == "VIEW"}


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _drop(con: duckdb.DuckDBPyConnection, model: Model, *, keep: bool) -> None:
    """Drop the model's objects (all of them, or with `keep` only those it no longer defines)."""
    held = _held(con, model, macros=True)
    names = {d.name for d in model.definitions}
    order = [d.name for d in reversed(model.definitions)] + sorted(set(held) - names)
    for name in order:
        if name in held and not (keep and name in names):
            con.execute(f"DROP {held[name][0]} {name}")


def apply(con: duckdb.DuckDBPyConnection, model: Model) -> None:
    """Create or replace every definition, in one transaction, and drop what an earlier model defined besides."""
    con.execute("BEGIN")
    try:
        _drop(con, model, keep=True)
        for d in model.definitions:
            con.execute(d.sql)
            con.execute(f"COMMENT ON {d.kind} {d.name} IS {_quoted(model.comment(d))}")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def drop(con: duckdb.DuckDBPyConnection, model: Model) -> None:
    """Remove the model: before a migration changes the tables under it, and below head, where it does not apply."""
    con.execute("BEGIN")
    try:
        _drop(con, model, keep=False)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def ensure(con: duckdb.DuckDBPyConnection, directory: Path = DIRECTORY) -> bool:
    """Apply the model unless the database already holds it; whether it was applied."""
    model = read(con, directory)
    if is_current(con, model):
        return False
    apply(con, model)
    return True
